"""The tuning store: the search-time setting ``search.target_recall`` chose for a stored index
(:mod:`fusebench.backends.target_recall`), kept so that a rerun over the index reads it instead of choosing it
again (choosing it searches every item exactly for the tuning queries, a pass over the whole gallery, then runs
the index over those queries a dozen times).

    CACHE/tunings/ab/abcdef.../meta.json   key material and the choice (``Tuned.to_json``: the setting, its value,
                                           the tuning queries' recall and lower bound, every value tried, the
                                           seconds the choice took when it was made) with its SHA-256
                                           (``tuned_sha256``, of its canonical JSON)
    CACHE/tunings/ab/abcdef....lock        held while the entry is read or chosen

Key material: the index's own store key (its items, build parameters and FAISS version), the tuning queries'
digest (their rows), the list depth ``k``, the target, the setting, the values it may take and the search-time
settings held fixed (a refined IVF-PQ's ``k_factor``). Given these the choice is deterministic, so a read gives
the choice a fresh run would make, value for value. Guarantees as for the other stores (``stores.entries``): a
lock per entry, meta.json written atomically and last, an entry not provably the one asked for, of another
format or unreadable is reported, removed and chosen again. The entry holds no data file: meta.json is all of it,
so the choice carries its own checksum: a choice whose bytes changed (a flipped digit still parses, and would be
read as another setting with the recall measured for this one) is reported and chosen again, as is an entry
written before the checksum.
Listed and removed by ``fusebench-cache`` (kind ``tuning``).
"""

from __future__ import annotations

from collections.abc import Callable

from fusebench.stores.entries import STORES, Store, cache_key

FORMAT = 1  # bump when the stored choice changes meaning; older entries then have another key


def tuning_material(index_key: str, queries_digest: str, k: int, target: float, setting: str, low: int, high: int,
                    fixed: dict) -> dict:
    """Everything a target recall's choice depends on: its store key's material."""
    return {"kind": "tuning", "format": FORMAT, "index": index_key, "queries": queries_digest, "k": int(k),
            "target": float(target), "setting": setting, "low": int(low), "high": int(high), "fixed": dict(fixed)}


@STORES.register
class TuningStore(Store):
    folder, name, kind, format, what = "tunings", "tuning store", "tuning", FORMAT, "the chosen search setting"
    order = 5

    def get_or_choose(self, material: dict, choose: Callable[[], dict], info: dict | None = None
                      ) -> tuple[dict, bool]:
        """The stored choice for ``material`` (a JSON object), and True; else ``choose()``'s, stored, and False."""
        with self.locked(material) as (key, folder):
            stored = self.read(folder, key, material, _checked_choice)
            if stored is not None:
                return stored, True
            chosen = choose()
            self.store_or_keep(folder, lambda: self.write(folder, key, material, info or {},
                                                          lambda _folder: {"tuned": chosen,
                                                                           "tuned_sha256": cache_key(chosen)}))
            return chosen, False

    def describe(self, meta: dict) -> dict:
        tuned = meta.get("tuned") or {}
        return {**super().describe(meta), "shape": [tuned.get("value")], "dtype": tuned.get("setting", "")}

    def data_files(self, meta: dict) -> dict[str, dict]:
        return {}


def _checked_choice(meta: dict) -> tuple[dict | None, str | None]:
    tuned = meta.get("tuned")
    if not isinstance(tuned, dict) or not isinstance(tuned.get("value"), int):
        return None, "meta.json holds no chosen setting"
    if meta.get("tuned_sha256") != cache_key(tuned):
        return None, ("its chosen setting does not match its recorded checksum" if "tuned_sha256" in meta
                      else "its chosen setting has no checksum (written by an earlier fusebench)")
    return tuned, None
