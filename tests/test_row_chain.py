"""``RowChain``: several arrays read as the one array of their rows (a partition that several ranks wrote)."""

from itertools import pairwise

import numpy as np
import pytest

from fae_torchrec.data.row_chain import RowChain, count_nonzero

WHOLE = np.random.default_rng(0).integers(0, 100, (50, 3))
#: The rows cut into pieces, an empty one among them.
CUTS = (0, 20, 20, 41, 50)


def _chain() -> RowChain:
    return RowChain([WHOLE[low:high] for low, high in pairwise(CUTS)])


@pytest.mark.parametrize(
    "key",
    [
        slice(None), slice(5, 30), slice(25, 30), slice(30, 10), slice(-5, None), slice(0, 50, 3), 7, -1, 45,
        np.array([49, 0, 20, 21, 3]), np.random.default_rng(1).random(50) < 0.3, (slice(10, 30), 1),
        (np.array([3, 44]), slice(1, 3)), (slice(None), slice(0, 2)), np.array([], dtype=np.int64),
        np.array([[1, 2], [40, 41]]), (7, 2), [-50, 49],
    ],
)  # fmt: skip
def test_a_chain_reads_as_the_array_of_all_its_rows(key):
    np.testing.assert_array_equal(_chain()[key], WHOLE[key])


def test_a_chain_is_an_array_to_numpy_and_a_slice_within_one_piece_is_a_view():
    chain = _chain()
    assert chain.shape == WHOLE.shape and len(chain) == 50 and chain.dtype == WHOLE.dtype
    np.testing.assert_array_equal(np.asarray(chain), WHOLE)
    np.testing.assert_array_equal(np.asarray(chain, dtype=np.float32), WHOLE.astype(np.float32))
    assert np.count_nonzero(chain) == np.count_nonzero(WHOLE)
    assert np.shares_memory(chain[25:30], WHOLE), "no copy of rows one piece holds"
    assert not np.shares_memory(chain[15:25], WHOLE)


@pytest.mark.parametrize("key", [50, -51, np.array([3, 50]), np.ones(49, dtype=bool)])
def test_rows_beyond_the_chain_are_refused(key):
    with pytest.raises(IndexError):
        _chain()[key]


def test_pieces_of_other_rows_are_not_chained():
    with pytest.raises(ValueError, match=r"rows of float64 \(3,\) cannot follow rows of int64 \(3,\)"):
        RowChain([WHOLE, WHOLE.astype(np.float64)])
    with pytest.raises(ValueError, match="no arrays to chain"):
        RowChain([])


def test_nonzero_rows_are_counted_a_chunk_at_a_time():
    pieces = [np.arange(n) % 3 == 0 for n in (5, 1, 12)]
    whole = np.concatenate(pieces)
    for chunk in (1, 4, 100):
        for stop in (None, 0, 5, 6, 13, 18):
            expected = np.count_nonzero(whole[:stop])
            assert (
                count_nonzero(RowChain(pieces), stop, chunk) == count_nonzero(whole, stop, chunk) == expected
            )
