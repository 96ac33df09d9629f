"""Typed reads of config values: each returns the value as the type the code needs, or raises a
:class:`FusebenchError` that names the key, shows what was given and says what is valid.

Hydra passes what a user typed through as-is (``eval.bootstrap.draws=abc`` is the string ``'abc'``,
``eval.ks=5`` the integer 5), so every value a user can set goes through one of these before it is used.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from fusebench import FusebenchError


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


def known_keys(cfg: Mapping, key: str, valid: Sequence[str]) -> None:
    """Every key of ``cfg`` is in ``valid``."""
    unknown = sorted(str(k) for k in set(cfg) - set(valid))
    if unknown:
        raise FusebenchError(f"{key}: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(valid))}.")
