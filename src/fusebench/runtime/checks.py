"""Typed reads of config values: each returns the value as the type the code needs, or raises a
:class:`FusebenchError` that names the key, shows what was given and says what is valid.

The config dataclasses' checks (``__post_init__`` in :mod:`fusebench.config.schema`, :mod:`~fusebench.config.specs`,
:mod:`fusebench.fusion.config`) call these, once per value, when :func:`typed` turns a group into its dataclass:
a model spec is free-form YAML and a config built by hand is not checked by Hydra (``eval.ks=5`` is the integer
5 there, ``draws: abc`` a string), so every value a user can set goes through one of these before it is used.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import fields, is_dataclass

from fusebench import FusebenchError


def override_key(text) -> str:
    """The key a Hydra override sets: ``+fusion.params.rrf_k=30`` -> ``fusion.params.rrf_k``."""
    return str(text).lstrip("+~").split("=", 1)[0]


def _bad(key: str, value, valid: str) -> FusebenchError:
    return FusebenchError(f"{key}={value!r} is not valid; valid: {valid}.")


def integer(value, key: str, minimum: int | None = None, hint: str = "") -> int:
    """An int (not a bool, not a float) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        need = "an integer" + (f" >= {minimum}" if minimum is not None else "")
        raise _bad(key, value, need + (f" ({hint})" if hint else ""))
    return int(value)


def optional_integer(value, key: str, minimum: int | None = None, hint: str = "") -> int | None:
    """``integer`` or None (null)."""
    if value is None:
        return None
    try:
        return integer(value, key, minimum)
    except FusebenchError:
        need = "an integer" + (f" >= {minimum}" if minimum is not None else "") + " or null"
        raise _bad(key, value, need + (f" ({hint})" if hint else "")) from None


def number(value, key: str, minimum: float | None = None, maximum: float | None = None, *,
           open_low: bool = False, open_high: bool = False, hint: str = "") -> float:
    """A finite int or float within the bounds (closed unless ``open_low``/``open_high``); never nan or inf."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if ok and minimum is not None:
        ok = value > minimum if open_low else value >= minimum
    if ok and maximum is not None:
        ok = value < maximum if open_high else value <= maximum
    if not ok:
        low = "" if minimum is None else f"{'>' if open_low else '>='} {minimum}"
        high = "" if maximum is None else f"{'<' if open_high else '<='} {maximum}"
        bounds = " and ".join(b for b in (low, high) if b)
        raise _bad(key, value, "a finite number" + (f" {bounds}" if bounds else "") + (f" ({hint})" if hint else ""))
    return float(value)


WEIGHT_RANGE = (1e-6, 1e6)  # a non-zero weight: fusion multiplies float32 evidence by it (1e39 is inf there)


def weight(value, key: str) -> float:
    """A weight in the fused score: 0, or a finite number within WEIGHT_RANGE (far outside it the float32
    products of fusion overflow or underflow, and only the weights' ratios matter to a weighted sum)."""
    low, high = WEIGHT_RANGE
    checked = number(value, key, 0, hint=f"0 or between {low:g} and {high:g}: the weight in the fused score")
    if checked != 0 and not low <= checked <= high:
        raise FusebenchError(f"{key}={value!r} is not valid; valid: 0 or a number between {low:g} and {high:g} (the "
                             "weight multiplies float32 scores, which overflow or underflow far outside that range; "
                             "scale all weights together: only their ratios matter to a weighted sum).")
    return checked


def some_weight(weights: Mapping[str, float]) -> None:
    """A fusion's weights (key -> a value :func:`weight` passed): at least one above 0, else every fused score is 0."""
    if not any(weights.values()):
        raise FusebenchError(f"every model weight is 0 ({', '.join(weights)}): every fused score would be 0. Give at "
                             "least one model a weight > 0.")


def boolean(value, key: str) -> bool:
    if not isinstance(value, bool):
        raise _bad(key, value, "true or false")
    return value


def choice(value, key: str, options: Sequence, allow_none: bool = False):
    """One of ``options`` (or None when ``allow_none``)."""
    if value is None and allow_none:
        return None
    if isinstance(value, (list, dict)) or value not in options:
        valid = ", ".join(str(o) for o in options) + (", null" if allow_none else "")
        raise _bad(key, value, valid)
    return value


def text(value, key: str, allow_none: bool = False, hint: str = "") -> str | None:
    """A non-empty string (numbers a user typed are taken as their text)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)) or not str(value).strip():
        raise _bad(key, value, "a non-empty string" + (" or null" if allow_none else "") + (f" ({hint})" if hint else ""))
    return str(value)


def integer_list(value, key: str, minimum: int = 1, example: str = "[1,5,10]") -> list[int]:
    """A non-empty list of integers >= ``minimum``."""
    if not isinstance(value, (list, tuple)) or not value or any(
            isinstance(v, bool) or not isinstance(v, int) or v < minimum for v in value):
        raise _bad(key, value, f"a non-empty list of integers >= {minimum}, e.g. {key}={example}")
    return [int(v) for v in value]


def string_list(value, key: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, (str, int)) and not isinstance(v, bool)
                                                       for v in value):
        raise _bad(key, value, "a list of strings, e.g. [a,b]")
    return [str(v) for v in value]


def mapping(value, key: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _bad(key, value, "a group of keys (key.subkey=value), not a single value")
    return dict(value)


def required(cfg: Mapping, key: str, where: str):
    """``cfg[key]``; a missing key is an error naming it (every default lives in fusebench/config/schema.py or the
    group's YAML file, never in the code that reads the value)."""
    if key not in cfg:
        raise FusebenchError(f"{where}.{key} is missing; the composed config sets every key (see "
                             f"fusebench --cfg job), so a config built by hand must set it too.")
    return cfg[key]


def known_keys(cfg: Mapping, key: str, valid: Sequence[str], note: str = "") -> None:
    """Every key of ``cfg`` is in ``valid`` (``note``: said after the unknown keys, e.g. "(nothing reads them)")."""
    unknown = sorted(str(k) for k in set(cfg) - set(valid))
    if unknown:
        raise FusebenchError(f"{key}: unknown key(s) {', '.join(unknown)}{' ' + note if note else ''}; valid keys: "
                             f"{', '.join(sorted(valid))}.")


VALID_DEVICES = "auto, cpu, cuda, cuda:N, mps"
_DEVICE_NAME = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def device_name(name, key: str = "device") -> str:
    """``name`` if it is a device name fusebench takes (auto, cpu, cuda, cuda:N, mps), else a FusebenchError
    naming the config ``key``. Only the spelling: whether the device exists is
    :func:`fusebench.encoders.devices.resolve_device`'s check (it needs torch)."""
    if not isinstance(name, str) or not _DEVICE_NAME.fullmatch(name):
        raise FusebenchError(f"{key}={name!r} is not a torch device fusebench can use; valid: {VALID_DEVICES}.")
    return name


INTERNAL = {"config_key": False}  # metadata of a dataclass field the conversion sets, never a config key


def config_keys(cls) -> list[str]:
    """The keys a config dataclass reads: its fields, less those marked :data:`INTERNAL`."""
    return [f.name for f in fields(cls) if f.metadata.get("config_key", True)]


def typed(cls, value, key: str, *, every_key: bool = True, note: str = "", nested: Mapping | None = None, **internal):
    """``value`` (a mapping) as the config dataclass ``cls``, whose ``__post_init__`` checks the values: a key that
    is not one of its fields is an error naming it (``note`` after it), and with ``every_key`` so is a missing one
    (a composed group sets every key; a model spec only what differs from the defaults). ``nested``: field name ->
    a function (value, key) that converts that field's value first; ``internal``: the INTERNAL fields' values."""
    given = mapping(value, key)
    names = config_keys(cls)
    known_keys(given, key, names, note)
    values = {name: required(given, name, key) if every_key else given[name] for name in names
              if every_key or name in given}
    for name, convert in (nested or {}).items():
        if name in values:
            values[name] = convert(values[name], f"{key}.{name}")
    return cls(**values, **internal)


def default_of(cls, name: str):
    """The default of dataclass ``cls``'s field ``name`` (its default_factory called)."""
    field_ = next(f for f in fields(cls) if f.name == name)
    return field_.default_factory() if callable(field_.default_factory) else field_.default


def _differs(value, default, name: str) -> str | None:
    """``name`` (or ``name.sub`` for the first differing field of a nested config) when ``value`` is set to other
    than ``default``; None when it holds its default or null."""
    if value is None or value == default:
        return None
    if is_dataclass(value) and is_dataclass(default):
        sub = next(f.name for f in fields(value) if getattr(value, f.name) != getattr(default, f.name))
        return f"{name}.{sub}={_as_typed(getattr(value, sub))}"
    return f"{name}={_as_typed(value)}"


def _as_typed(value) -> str:
    """``value`` as a user types it on the command line: a boolean as true / false, anything else as repr."""
    return str(value).lower() if isinstance(value, bool) else repr(value)


def unread(config, group: str, selector: str, readers: Mapping[str, Sequence[str]], why: str = "") -> None:
    """Refuse a setting the chosen kind never reads. ``readers`` maps each value of ``config.<selector>`` to the
    fields it reads; every field some entry names is kind-dependent, and one the chosen kind does not read must
    hold its default (or null). ``why``: what the chosen kind does instead, for the message."""
    chosen = getattr(config, selector)
    for name in dict.fromkeys(n for names in readers.values() for n in names):
        if name in readers[chosen]:
            continue
        setting = _differs(getattr(config, name), default_of(type(config), name), name)
        if setting is not None:
            by = [kind for kind, names in readers.items() if name in names]
            where = (f"with every {group}.{selector} but {chosen}" if len(by) == len(readers) - 1 > 1 else
                     f"only with {group}.{selector}={' | '.join(by)}")
            raise FusebenchError(f"{group}.{setting} is never read with {group}.{selector}={chosen}{why}; "
                                 f"{group}.{name} is read {where}: leave it unset or pick one of those.")
