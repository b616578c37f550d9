import numpy as np
import pytest

from gpt1.errors import DataError
from gpt1.text.shards import read_header, read_shard, write_shard


@pytest.mark.parametrize("vocab", [500, 70000])
def test_roundtrip(tmp_path, vocab):
    ids = np.random.default_rng(0).integers(0, vocab, 1000)
    write_shard(tmp_path / "a.bin", ids, n_docs=3, vocab_size=vocab)
    head = read_header(tmp_path / "a.bin")
    assert head["n_docs"] == 3 and head["itemsize"] == (2 if vocab <= 65536 else 4)
    np.testing.assert_array_equal(read_shard(tmp_path / "a.bin"), ids)


def test_truncated_and_foreign(tmp_path):
    write_shard(tmp_path / "a.bin", np.arange(100), n_docs=1, vocab_size=200)
    data = (tmp_path / "a.bin").read_bytes()
    (tmp_path / "a.bin").write_bytes(data[:-10])
    with pytest.raises(DataError, match="truncated"):
        read_shard(tmp_path / "a.bin")
    (tmp_path / "b.bin").write_bytes(b"hello world" * 10)
    with pytest.raises(DataError, match="magic"):
        read_shard(tmp_path / "b.bin")
    with pytest.raises(DataError, match="out of range"):
        write_shard(tmp_path / "c.bin", np.array([5, 300]), n_docs=1, vocab_size=200)
