"""The one-pass row normaliser gives exactly numpy's ``x / np.linalg.norm(x, axis=1)``, bit for bit."""

import numpy as np
import pytest
from helpers.tiers import fast_first

from fusebench.encoders.rownorm import PAIRWISE_BLOCK, l2_normalise_rows

# every shape of numpy's pairwise tree: under 8, one block of 8 accumulators with and without a rest, the
# block boundary, one split, two levels of splits, odd widths, and the widths of real models
# (the first six are in the fast tier)
WIDTHS = [7, 17, PAIRWISE_BLOCK + 1, 257, 1152, 4099, 1, 2, 8, 9, 15, 16, 100, PAIRWISE_BLOCK - 1, PAIRWISE_BLOCK,
          136, 255, 256, 383, 512, 768, 1000, 1024, 1153, 1280]


def numpy_normalised(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # the bad rows' reference values
        norms = np.linalg.norm(x, axis=1)
        return x / norms[:, None], norms


@pytest.mark.parametrize("width", fast_first(WIDTHS, 6))
@pytest.mark.parametrize("scale", [1e-3, 1.0, 41.0])
def test_same_bits_as_numpy(width, scale):
    x = (np.random.default_rng(width).standard_normal((97, width)) * scale).astype(np.float32)
    before = x.copy()
    out, norms, finite = l2_normalise_rows(x)
    expected, expected_norms = numpy_normalised(x)
    assert out.dtype == np.float32 and norms.dtype == np.float64  # float64: a norm beyond float32's range is kept
    assert np.array_equal(norms, expected_norms)
    assert np.array_equal(out, expected)
    assert finite.all()
    assert np.array_equal(x, before)  # the input is left as it was


def test_non_finite_and_zero_rows_are_reported():
    x = np.random.default_rng(0).standard_normal((6, 300)).astype(np.float32)
    x[1, 7] = np.nan
    x[2, 299] = np.inf
    x[3, 0] = -np.inf
    x[4] = 0
    x[5, :] = 3e19  # every entry finite, but the squares overflow float32: rescaled, not numpy's inf norm
    out, norms, finite = l2_normalise_rows(x)
    assert finite.tolist() == [True, False, False, False, True, True]
    assert norms[4] == 0 and np.isnan(out[4]).all() and np.isnan(norms[1:4]).all()
    assert np.isclose(norms[5], 3e19 * np.sqrt(300), rtol=1e-6)
    assert np.allclose(out[5], 1 / np.sqrt(300), rtol=1e-6, atol=0)
    expected, expected_norms = numpy_normalised(x)
    assert np.array_equal(out[0], expected[0]) and norms[0] == expected_norms[0]


def test_other_dtypes_and_layouts_are_converted_first():
    rng = np.random.default_rng(1)
    wide = rng.standard_normal((40, 64))
    strided = wide.astype(np.float32)[:, ::2]  # not contiguous
    for x in (wide, strided, rng.integers(-5, 5, (30, 16)), wide.astype(np.float32).T):
        as32 = np.ascontiguousarray(x, dtype=np.float32)
        out, norms, _ = l2_normalise_rows(x)
        expected, expected_norms = numpy_normalised(as32)
        assert np.array_equal(out, expected, equal_nan=True)
        assert np.array_equal(norms, expected_norms)


def test_empty_matrices():
    out, norms, finite = l2_normalise_rows(np.zeros((0, 8), dtype=np.float32))
    assert out.shape == (0, 8) and norms.shape == (0,) and finite.shape == (0,)
    _, norms, finite = l2_normalise_rows(np.zeros((3, 0), dtype=np.float32))
    assert (norms == 0).all() and finite.all()
