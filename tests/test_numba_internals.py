"""numba's private cache API (``fusebench.runtime.numba_internals``, the one module using it) against the installed
numba: fails naming numba's version and the name when numba changes what the adapter relies on."""

import numba
import numpy as np

from fusebench.runtime import numba_internals
from fusebench.runtime.jit import kernel


def test_the_installed_numba_has_every_private_name_the_adapter_uses():
    problems = numba_internals.shape_problems()
    assert not problems, "numba changed what fusebench.runtime.numba_internals uses:\n" + "\n".join(problems)


def test_the_installed_numba_is_a_version_the_adapter_was_checked_against():
    assert numba.__version__ in numba_internals.CHECKED, (
        f"numba {numba.__version__} is installed; fusebench.runtime.numba_internals was checked against numba "
        f"{', '.join(numba_internals.CHECKED)}: run tests/test_numba_internals.py and tests/test_kernel_cache.py "
        "(slow tier too), then add the version to CHECKED")


def test_a_keyed_cache_extends_numbas_own_key_by_one_element(tmp_path, monkeypatch):
    """The key is numba's (signature, codegen magic, bytecode and closure hashes) plus ``extra()``, and a kernel so
    cached compiles, runs and reports its cache folder through numba's public stats."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))

    def double(x):
        return 2 * x

    plain = numba.njit(cache=True)(double)
    keyed = kernel(cache=True)(double)
    assert numba_internals.keyed(keyed) and not numba_internals.keyed(plain)
    signature = (numba.types.float64,)
    codegen = keyed.targetctx.codegen()
    ours, numbas = numba_internals.index_key(keyed, signature, codegen), plain._cache._index_key(signature, codegen)
    assert ours[:-1] == numbas and len(ours) == len(numbas) + 1 and isinstance(ours[-1], str)
    assert keyed(np.float64(1.5)) == 3.0 and keyed.stats.cache_path
