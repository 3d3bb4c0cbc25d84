import numpy as np
import pytest
from torchrec.datasets.criteo import BinaryCriteoUtils

from fae_torchrec.data import (
    KAGGLE_TABLE_SIZES,
    CriteoNpyReader,
    CriteoTsvReader,
    npy_paths,
    scaled_table_sizes,
)
from tests.conftest import realdata

KAGGLE_TRAIN = "criteo_kaggle_head10k/train_head10000.txt"
KAGGLE_TEST = "criteo_kaggle_head10k/test_head10000.txt"

GOOD = "1\t5\t-3\t\t16\t0\t1\t0\t14\t7\t1\t\t306\t\t" + "\t".join(["62770d79", "", *["e21f5d58"] * 24])


def _ids(reader) -> np.ndarray:
    return np.concatenate([b.ids for b in reader.raw_blocks()])


def test_parses_fields_missing_values_and_hashing(tmp_path):
    path = tmp_path / "day_0"
    path.write_text(GOOD + "\n" + GOOD.replace("1\t5", "0\t6", 1) + "\n")
    sizes = scaled_table_sizes(0.01)
    block = next(CriteoTsvReader(path, table_sizes=sizes).raw_blocks())
    assert block.labels.tolist() == [1, 0]
    assert block.ids[0, 0] == 0x62770D79 % sizes[0]
    assert block.ids[0, 1] == 0, "an empty categorical field is hex 0, i.e. row 0"
    assert block.ids[0, 2] == 0xE21F5D58 % sizes[2]
    expected = [np.log1p(5), -np.log1p(3), 0.0, np.log1p(16)]
    np.testing.assert_allclose(block.dense[0, :4], expected, rtol=1e-6)
    assert block.dense[1, 0] == pytest.approx(np.log1p(6))


def test_file_without_final_newline_and_chunk_boundaries(tmp_path):
    path = tmp_path / "day_1"
    path.write_text("\n".join([GOOD] * 50))
    whole = _ids(CriteoTsvReader(path))
    chunked = _ids(CriteoTsvReader(path, chunk_bytes=300))
    assert len(whole) == 50
    assert np.array_equal(whole, chunked)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (GOOD.rsplit("\t", 1)[0], "expected 40 tab-separated fields, found 39"),
        (GOOD.replace("e21f5d58", "e21f5d5z", 1), "field C3 'e21f5d5z' is not 8 hex digits"),
        (GOOD.replace("e21f5d58", "e21f5d5", 1), "field C3 'e21f5d5' is not 8 hex digits"),
        (GOOD.replace("\t16\t", "\t1x\t", 1), "field I4 '1x' is not an integer"),
        (GOOD.replace("\t16\t", "\t-\t", 1), "field I4 '-' is not an integer"),
        (
            GOOD.replace("\t16\t", "\t" + "9" * 19 + "\t", 1),
            "field I4 '9{19}' is not an integer of at most 18",
        ),
        (GOOD.replace("1\t5", "2\t5", 1), r"field label '2' is not a label \(0 or 1\)"),
        (GOOD + "\r", "carriage return in line"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.txt"
    path.write_text("\n".join([GOOD, GOOD, line, GOOD]) + "\n")
    with pytest.raises(ValueError, match=f"bad.txt:3: .*{message}"):
        list(CriteoTsvReader(path, chunk_bytes=1 << 20))


def test_error_names_the_first_bad_line_whatever_the_field(tmp_path):
    path = tmp_path / "bad.txt"
    bad_int = GOOD.replace("\t16\t", "\tx\t", 1)
    bad_label = GOOD.replace("1\t5", "7\t5", 1)
    bad_hex = GOOD.replace("62770d79", "62770d7", 1)
    path.write_text("\n".join([GOOD, bad_hex, bad_int, bad_label]) + "\n")
    with pytest.raises(ValueError, match=r"bad\.txt:2: field C1"):
        list(CriteoTsvReader(path))
    path.write_text("\n".join([GOOD, bad_int, bad_label, bad_hex]) + "\n")
    with pytest.raises(ValueError, match=r"bad\.txt:2: field I4"):
        list(CriteoTsvReader(path))


def test_chunk_boundary_exactly_at_a_newline(tmp_path):
    path = tmp_path / "day_2"
    path.write_text("\n".join([GOOD] * 6) + "\n")
    line_bytes = len(GOOD) + 1
    for chunk in (line_bytes - 1, line_bytes, line_bytes + 1, 2 * line_bytes):
        assert len(_ids(CriteoTsvReader(path, chunk_bytes=chunk))) == 6


def test_malformed_line_number_counts_across_chunks(tmp_path):
    path = tmp_path / "bad.txt"
    lines = [GOOD] * 30
    lines[24] = GOOD.replace("62770d79", "zz770d79")
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"bad\.txt:25: field C1"):
        list(CriteoTsvReader(path, chunk_bytes=500))


def test_empty_file_yields_nothing(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text("")
    assert list(CriteoTsvReader(path)) == []


TORCHREC_PICKLE_WARNING = "ignore:Local function is not supported by pickle:UserWarning"


@pytest.mark.filterwarnings(TORCHREC_PICKLE_WARNING)
def test_real_kaggle_train_matches_torchrec(tmp_path):
    path = realdata(KAGGLE_TRAIN)
    ours = CriteoTsvReader(path, batch_size=4096)
    batches = list(ours)
    assert [b.labels.numel() for b in batches] == [4096, 4096, 1808]
    prefix = tmp_path / "day_0"
    dense, sparse, labels = npy_paths(prefix)
    BinaryCriteoUtils.tsv_to_npys(str(path), dense, sparse, labels, dataset_name="criteo_kaggle")
    raw = np.load(sparse)
    assert np.array_equal(_ids(ours), raw % np.asarray(KAGGLE_TABLE_SIZES))
    assert np.array_equal(np.concatenate([b.labels for b in ours.raw_blocks()]), np.load(labels)[:, 0])


def test_real_kaggle_test_file_has_no_labels():
    block = next(CriteoTsvReader(realdata(KAGGLE_TEST)).raw_blocks())
    assert len(block) == 10_000
    assert np.all(block.labels == -1)


@pytest.mark.filterwarnings(TORCHREC_PICKLE_WARNING)
def test_npy_reader_reads_torchrec_binary_layout(tmp_path):
    path = realdata(KAGGLE_TRAIN)
    prefix = tmp_path / "day_0"
    BinaryCriteoUtils.tsv_to_npys(str(path), *npy_paths(prefix), dataset_name="criteo_kaggle")
    npy = CriteoNpyReader(prefix, batch_size=3000, chunk_rows=4000)
    assert npy.num_samples == 10_000
    assert [b.labels.numel() for b in npy] == [3000, 3000, 3000, 1000]
    assert np.array_equal(_ids(npy), _ids(CriteoTsvReader(path)))
    dense = np.concatenate([b.dense for b in npy.raw_blocks()])
    np.testing.assert_array_equal(dense, np.load(npy_paths(prefix)[0]))


def test_npy_reader_errors_name_the_file(tmp_path):
    prefix = tmp_path / "day_3"
    with pytest.raises(FileNotFoundError, match=r"day_3_dense\.npy"):
        CriteoNpyReader(prefix)
    dense, sparse, labels = npy_paths(prefix)
    np.save(dense, np.zeros((4, 13), np.float32))
    np.save(sparse, np.zeros((4, 25), np.int64))
    np.save(labels, np.zeros((4, 1), np.int32))
    with pytest.raises(ValueError, match=r"day_3_sparse\.npy: shape"):
        CriteoNpyReader(prefix)
    np.save(sparse, np.full((4, 26), -5, np.int64))
    with pytest.raises(ValueError, match=r"day_3_sparse\.npy: row 0 has a negative value"):
        list(CriteoNpyReader(prefix))
