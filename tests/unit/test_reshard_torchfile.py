"""The streamed torch.save writer/reader and the shard geometry, against torch itself."""

from __future__ import annotations

import zipfile

import pytest

torch = pytest.importorskip("torch")

from verl_cluster.reshard.shards import chunk_bounds  # noqa: E402
from verl_cluster.reshard.torchfile import (OutStorage, OutTensor, TensorRef, UnsupportedContent,  # noqa: E402
                                            open_torch_file, write_torch_file)


@pytest.fixture(autouse=True)
def _own_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def test_chunk_bounds_are_torch_chunk_and_dtensor_shard():
    from torch.distributed.tensor import Shard

    for n in (0, 1, 2, 5, 130, 151936):
        for parts in (1, 2, 3, 4, 7, 8, 16):
            bounds = chunk_bounds(n, parts)
            sizes = [b - a for a, b in bounds]
            chunks = [c.shape[0] for c in torch.chunk(torch.empty(n, 0), parts)] if n else []
            assert sizes[:len(chunks)] == chunks and all(s == 0 for s in sizes[len(chunks):])
            for r, (a, b) in enumerate(bounds):  # what a DTensor's local shape and offset are on rank r
                size, offset = Shard(0).local_shard_size_and_offset(n, parts, r)
                assert size == b - a and (size == 0 or offset == a)


def test_written_file_loads_in_torch_plain_and_mmap(tmp_path):
    bf = torch.randn(33, 7).to(torch.bfloat16)
    shared = torch.arange(12.0)
    big = torch.randn(1000, 3)
    lazy = OutTensor(OutStorage(torch.float32, 3000, "cpu", produce=lambda: big), 0, (1000, 3), (3, 1))
    obj = {"bf16": bf, "empty": torch.empty(0, 5), "int": torch.tensor([1, 2, 3]), "view": shared[4:], "base": shared,
           "nested": [{"step": torch.tensor(3.0)}], "lazy": lazy}
    path = tmp_path / "f.pt"
    written = write_torch_file(str(path), obj)
    assert written == bf.nbytes + shared.nbytes + 3 * 8 + 4 + big.nbytes
    for loaded in (torch.load(path, weights_only=True), torch.load(path, weights_only=True, mmap=True)):
        assert torch.equal(loaded["bf16"], bf) and loaded["bf16"].dtype == torch.bfloat16
        assert loaded["empty"].shape == (0, 5) and torch.equal(loaded["int"], torch.tensor([1, 2, 3]))
        assert torch.equal(loaded["view"], shared[4:]) and torch.equal(loaded["lazy"], big)
        assert loaded["view"].untyped_storage().data_ptr() == loaded["base"].untyped_storage().data_ptr()
        assert float(loaded["nested"][0]["step"]) == 3.0
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None  # every CRC right
    reader = torch._C.PyTorchFileReader(str(path))
    assert all(reader.get_record_offset(f"data/{i}") % 64 == 0 for i in range(5))


def test_reader_keeps_dtensor_pieces_as_references(tmp_path):
    """A file of plain tensors reads back materialised; its bytes match torch.save's."""
    path = tmp_path / "plain.pt"
    t = torch.randn(10, 4)
    torch.save({"a": t, "step": torch.tensor(5)}, path)
    tf = open_torch_file(str(path))
    try:
        assert torch.equal(tf.obj["a"], t) and int(tf.obj["step"]) == 5
        ref = TensorRef(next(iter(tf.storages.values())), 0, (10, 4), (4, 1))
        assert torch.equal(tf.read(ref, (3, 7)), t[3:7])
    finally:
        tf.close()


def test_foreign_files_are_unsupported(tmp_path):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a zip")
    with pytest.raises(UnsupportedContent, match="not a torch.save"):
        open_torch_file(str(junk))
    legacy = tmp_path / "legacy.pt"
    torch.save({"a": torch.ones(2)}, legacy, _use_new_zipfile_serialization=False)
    with pytest.raises(UnsupportedContent):
        open_torch_file(str(legacy))


def test_stream_blocks_across_files(tmp_path):
    """Byte ranges of two files, streamed in odd-sized blocks with the next one read ahead, give the same
    bytes; a stream left half-read does not spoil the next one."""
    from verl_cluster.reshard.torchfile import TorchFile, read_blocks, release_reader

    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(bytes(range(256)) * 40)
    b.write_bytes(bytes(reversed(range(256))) * 40)
    fa, fb = TorchFile(str(a), None, {}), TorchFile(str(b), None, {})
    segs = [(fa, 7, 5000), (fb, 100, 3333), (fa, 0, 1)]
    want = a.read_bytes()[7:5007] + b.read_bytes()[100:3433] + a.read_bytes()[:1]
    try:
        for block in (1, 64, 999, 10000):
            assert b"".join(bytes(c) for c in read_blocks(segs, block)) == want
        half = read_blocks(segs, 100)
        next(half), next(half)
        half.close()
        assert b"".join(bytes(c) for c in read_blocks(segs, 100)) == want
    finally:
        release_reader()
        fa.close()
        fb.close()


class _Planted:
    """Unpickling it would write a file: what a hostile rank file could carry."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        from pathlib import Path

        return (Path.touch, (Path(self.path),))


def test_a_pickle_that_would_run_code_is_refused_and_runs_nothing(tmp_path):
    f = tmp_path / "model_world_size_2_rank_0.pt"
    marker = tmp_path / "ran"
    torch.save({"w": torch.ones(3), "planted": _Planted(marker)}, f)
    with pytest.raises(UnsupportedContent, match="which this reader does not load"):
        open_torch_file(str(f))
    assert not marker.exists()
    torch.save({"w": torch.ones(3), "groups": [{"betas": (0.9, 0.95), "params": {1, 2}}]}, f)  # plain data loads
    assert open_torch_file(str(f)).obj["groups"][0]["params"] == {1, 2}
