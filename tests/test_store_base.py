"""The store base (stores.entries.Store) under the list, near-duplicate, score and index stores: entries written
by fusebench before it (tests/data/stores_from_main/, written by main's code with tests/store_entries_script.py;
the score entry written again at the score store's format 4, whose key an older format's entry does not have)
are read as they are, and the stores write those very entries again (same keys, files and meta.json)."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import store_entries_script as script

from fusebench.stores.indexes import IndexStore
from fusebench.stores.lists import ListStore
from fusebench.stores.near_duplicates import NearDuplicateStore
from fusebench.stores.scores import ScoreStore

FROM_MAIN = Path(__file__).parent / "data" / "stores_from_main"
STORES = (ListStore, NearDuplicateStore, ScoreStore, IndexStore)


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.endswith(".lock")}


def never(*_):
    raise AssertionError("computed again: the stored entry was not read")


def test_entries_written_before_the_store_base_are_read_as_they_are(tmp_path):
    faiss = pytest.importorskip("faiss")
    root = tmp_path / "cache"
    shutil.copytree(FROM_MAIN, root)
    before = files(root)
    stored = ListStore(root).get_or_compute(script.LISTS, 3, 4, 5, never, script.INFO)
    assert stored.hit and stored.lists.depth == 3
    for name, array in script.arrays().items():
        assert np.array_equal(stored.lists.arrays()[name], array)
    values, hit = NearDuplicateStore(root).get_or_compute(script.DEDUP, 3, never, script.INFO)
    assert hit and np.array_equal(values, script.dedup_values())
    readers, hit = ScoreStore(root).get_or_compute(script.SCORES, {"t2i": (5, 4), "i2t": (4, 5)}, never,
                                                   np.arange(4), 1 << 20, script.INFO)
    assert hit and np.array_equal(readers["t2i"](0, 5).numpy(), script.t2i_matrix())
    assert np.array_equal(readers["i2t"](0, 4).numpy(), script.t2i_matrix().T)
    index = IndexStore(root).get_or_build(script.INDEX, never, script.INFO)
    assert index.hit and index.index.ntotal == 6
    assert np.array_equal(faiss.rev_swig_ptr(faiss.downcast_index(index.index).get_xb(), 24).reshape(6, 4),
                          script.index_vectors())
    assert files(root) == before  # read, not rewritten
    listed = [e for store in STORES for e in store(root).entries(verify=True)]
    assert [(e["kind"], e["complete"], e["model"]) for e in listed] == [
        ("lists", True, "tiny"), ("dedup", True, "tiny"), ("scores", True, "tiny"), ("index", True, "tiny")]
    assert {e["key"] for e in listed} == {Path(name).parts[2] for name in before}


def test_the_stores_write_the_entries_they_wrote_before(tmp_path):
    """Same keys, same data bytes, the same meta.json but for the time it was written."""
    pytest.importorskip("faiss")
    script.write(str(tmp_path / "cache"))
    new, old = files(tmp_path / "cache"), files(FROM_MAIN)
    assert sorted(new) == sorted(old)
    for name in old:
        if name.endswith("meta.json"):
            mine, theirs = json.loads(new[name]), json.loads(old[name])
            assert list(mine) == list(theirs) and mine["created"] and {**mine, "created": 0} == {**theirs, "created": 0}
        elif name.endswith(".npz"):
            with np.load(tmp_path / "cache" / name) as mine, np.load(FROM_MAIN / name) as theirs:
                assert sorted(mine) == sorted(theirs) and all(np.array_equal(mine[k], theirs[k]) for k in theirs)
        else:
            assert new[name] == old[name], name
