"""The read-only role from Python: ps.Client(config, reader=True) pulls what a
worker pulls, and every push, row push or checkpoint it asks for is refused
with ps.RefusedError and changes nothing."""
import os
import subprocess

import numpy as np
import pytest

import ps
from conftest import ROOT


@pytest.fixture
def reader_key(tmp_path, monkeypatch):
    path = str(tmp_path / "reader.key")
    subprocess.run([os.path.join(ROOT, "scripts", "ps-keygen"), path], check=True,
                   stderr=subprocess.DEVNULL)
    monkeypatch.setenv("PS_READER_KEY_FILE", path)   # the shards inherit it
    return path


def test_reader_pulls_and_changes_nothing(cluster, tmp_path, reader_key):
    ck = tmp_path / "ck"
    ck.mkdir()
    cl = cluster(workers=1, tables={"e": 4},
                 extra=["checkpoint:", f"  dir: {ck}", "  on_request: true",
                        "  min_interval_s: 0"])
    ids = np.array([3, 9, 2**63 + 5], np.uint64)
    with ps.Client(cl.path, 0) as w, ps.reader(cl.path) as r:
        assert r.rank == ps.RANK_READER == -2
        g = {n: np.full(k, 0.5, np.float32) for n, k in cl.tensors.items()}
        w.push_rows("e", ids, np.ones((3, 4), np.float32))
        w.push(g)
        mine = {n: np.zeros(k, np.float32) for n, k in cl.tensors.items()}
        theirs = {n: np.zeros(k, np.float32) for n, k in cl.tensors.items()}
        w.pull(mine)
        r.pull(theirs)
        for n in mine:
            assert mine[n].tobytes() == theirs[n].tobytes()
        rows = w.pull_rows("e", ids)
        assert r.pull_rows("e", ids).tobytes() == rows.tobytes()
        sums = [s["param_checksum"] for s in r.stats()]
        with pytest.raises(ps.RefusedError, match="a reader may only pull: checkpoint refused"):
            r.checkpoint(0)
        with pytest.raises(ps.RefusedError, match="a reader may only pull: push refused"):
            r.push(g, clock=1)
        with pytest.raises(ps.RefusedError, match="a reader may only pull: row push refused"):
            r.push_rows("e", ids, np.ones((3, 4), np.float32), clock=1)
        assert os.listdir(ck) == []
        assert [s["param_checksum"] for s in r.stats()] == sums
        assert r.pull_rows("e", ids).tobytes() == rows.tobytes()
        assert sum(s["reader_refused"] for s in r.stats()) == 1 + 2 + 2
        w.push(g)   # the worker is not held up by the reader
    with pytest.raises(ps.ConfigError, match="choose one role"):
        ps.Client(cl.path, monitor=True, reader=True)


def test_reader_needs_the_reader_key(cluster, reader_key, monkeypatch):
    cl = cluster(workers=1)
    monkeypatch.setenv("PS_READER_KEY_FILE", os.environ["PS_SECRET_FILE"])
    with pytest.raises(ps.AuthError):
        ps.reader(cl.path)
    monkeypatch.setenv("PS_SECRET_FILE", reader_key)
    with pytest.raises(ps.AuthError):
        ps.Client(cl.path, 0)
