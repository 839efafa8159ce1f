"""Bad input raises the right ps.Error subclass with a message a user can
act on, nothing hangs, and the shards' weights are unchanged."""
import os
import signal
import subprocess
import time

import numpy as np
import pytest

import ps
from conftest import ROOT


def weights(cl):
    with ps.Client(cl.path, 0) as c:
        w = {n: np.zeros(k, np.float32) for n, k in cl.tensors.items()}
        c.pull(w, min_version=0)
        return w


class CudaLike:
    """What a CUDA array looks like to the binding: no buffer, a device."""
    __cuda_array_interface__ = {"shape": (5,), "typestr": "<f4", "data": (0, False), "version": 3}
    device = "cuda:0"


def test_bad_arrays(cluster):
    cl = cluster(tables={"e": 4})
    before = weights(cl)
    with ps.Client(cl.path, 0) as c:
        ok = {n: np.ones(k, np.float32) for n, k in cl.tensors.items()}
        cases = [
            ({**ok, "c": np.ones(5, np.float64)}, ps.ArrayError, ["tensor 'c'", "float32"]),
            ({**ok, "a": np.ones(6000, np.float32)[::2]}, ps.ArrayError,
             ["tensor 'a'", "C-contiguous"]),
            ({**ok, "b": np.ones(560, np.float32)}, ps.ArrayError,
             ["tensor 'b'", "560 float32 given, 561 expected"]),
            ({**ok, "zz": np.ones(5, np.float32)}, ps.UnknownNameError,
             ["tensor 'zz'", cl.path]),
            ({**ok, "c": CudaLike()}, ps.ArrayError, ["tensor 'c'", "device cuda", "cpu()"]),
            ({**ok, "c": [1.0, 2.0, 3.0, 4.0, 5.0]}, ps.ArrayError, ["tensor 'c'", "list"]),
            ({}, ps.Error, ["no tensors"]),
        ]
        for tensors, cls, words in cases:
            for call in (lambda: c.push(tensors), lambda: c.push_async(tensors),
                         lambda: c.pushpull(tensors, {"c": np.zeros(5, np.float32)})):
                with pytest.raises(cls) as e:
                    call()
                for w in words:
                    assert w in str(e.value), (str(e.value), w)
                assert e.value.code < 0 and e.value.code_name.startswith(("PS_E", "E"))
        # a pull into read-only memory
        ro = np.zeros(5, np.float32)
        ro.setflags(write=False)
        with pytest.raises(ps.ArrayError, match="writable"):
            c.pull({"c": ro})
        # pushpull's push and pull over the same memory
        same = np.zeros(5, np.float32)
        with pytest.raises(ps.Error, match="share memory"):
            c.pushpull({"c": same}, {"c": same})
        # rows: unknown table, ids of the wrong type, negative ids, wrong size
        with pytest.raises(ps.UnknownNameError, match="table 'nope'"):
            c.push_rows("nope", np.arange(3, dtype=np.uint64), np.zeros((3, 4), np.float32))
        with pytest.raises(ps.ArrayError, match="uint64 or int64"):
            c.pull_rows("e", np.arange(3, dtype=np.int32))
        with pytest.raises(ps.ArrayError, match=r"ids\[1\] = -2"):
            c.pull_rows("e", np.array([1, -2], np.int64))
        with pytest.raises(ps.ArrayError, match=r"3 ids x dim 4.*11 float32 given, 12 expected"):
            c.push_rows("e", np.arange(3, dtype=np.uint64), np.zeros(11, np.float32))
        # nothing above reached the shards: the clock did not move
        assert c.clock() == 0
    after = weights(cl)
    for n in before:
        np.testing.assert_array_equal(before[n], after[n])


def test_torch_tensors(cluster):
    torch = pytest.importorskip("torch", reason="torch is not installed here (python3-torch)")
    cl = cluster(tensors={"c": 5})
    with ps.Client(cl.path, 0) as c:
        t = torch.ones(5)
        c.push({"c": t})                      # a CPU tensor: taken through .numpy()
        w = torch.zeros(5)
        c.pull({"c": w})
        assert w.tolist() == [-1.0] * 5
        dev = "cuda" if torch.cuda.is_available() else "meta"
        print(f"the device tensor is on {dev}")
        with pytest.raises(ps.ArrayError, match=f"tensor 'c' is on device {dev}"):
            c.push({"c": torch.ones(5, device=dev)})


def test_closed_client(cluster):
    cl = cluster()
    c = ps.Client(cl.path, 0)
    c.close()
    assert c.closed
    with pytest.raises(ps.StateError, match="closed"):
        c.pull({"c": np.zeros(5, np.float32)})
    c.close()  # twice is fine


def test_config_errors(tmp_path, monkeypatch):
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster:\n  servers: [127.0.0.1:1]\n  nonsense: 3\n")
    with pytest.raises(ps.ConfigError, match=f"{bad}:3") as e:
        ps.Config(str(bad))
    assert e.value.code == ps.PS_ECONFIG and e.value.code_name == "PS_ECONFIG"
    monkeypatch.delenv("PS_CONFIG", raising=False)
    with pytest.raises(ps.ConfigError, match="PS_CONFIG"):
        ps.Client()
    monkeypatch.setenv("PS_CONFIG", str(bad))
    with pytest.raises(ps.ConfigError, match="bad.yaml:3"):
        ps.Client(rank=0)


def test_env_config_and_rank(cluster, monkeypatch):
    cl = cluster(workers=2, mode="async")
    monkeypatch.setenv("PS_CONFIG", cl.path)
    monkeypatch.setenv("PS_RANK", "zero")
    with pytest.raises(ps.ConfigError, match="PS_RANK='zero'"):
        ps.Client()
    monkeypatch.setenv("PS_RANK", "0")
    with ps.Client() as c:
        assert c.rank == 0 and c.config.path == cl.path
    # a Kubernetes Indexed Job's index is the rank when PS_RANK is not set;
    # PS_RANK, then an explicit rank, come first
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "1")
    with ps.Client() as c:
        assert c.rank == 0
    with ps.Client(rank=0) as c:
        assert c.rank == 0
    monkeypatch.delenv("PS_RANK")
    with ps.Client() as c:
        assert c.rank == 1
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "x")
    with pytest.raises(ps.ConfigError, match="JOB_COMPLETION_INDEX='x'"):
        ps.Client()
    monkeypatch.delenv("JOB_COMPLETION_INDEX")
    with pytest.raises(ps.ConfigError, match="neither .PS_RANK nor .JOB_COMPLETION_INDEX"):
        ps.Client()


def test_wrong_secret(cluster, tmp_path, monkeypatch):
    cl = cluster()
    other = str(tmp_path / "other.secret")
    subprocess.run([os.path.join(ROOT, "scripts", "ps-keygen"), other], check=True,
                   stderr=subprocess.DEVNULL)
    monkeypatch.setenv("PS_SECRET_FILE", other)
    t0 = time.monotonic()
    with pytest.raises(ps.AuthError) as e:
        ps.Client(cl.path, 0)
    assert e.value.code == ps.PS_EAUTH
    assert "127.0.0.1" in str(e.value)
    assert time.monotonic() - t0 < 10


def test_shard_down(cluster):
    cl = cluster(workers=1)
    c = ps.Client(cl.path, 0)
    g = {"c": np.ones(5, np.float32)}
    c.push(g)
    cl.stop(1, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises((ps.ClosedError, ps.ConnectionError, ps.TimeoutError)) as e:
        big = {"a": np.ones(3000, np.float32)}  # slices on both shards
        c.push(big)
        c.pull(big, min_version=2)
    assert time.monotonic() - t0 < 15, "the failure took too long"
    assert "shard 1" in str(e.value) or "127.0.0.1" in str(e.value), str(e.value)
    # a monitor still connects and names the shard that is down
    with ps.monitor(cl.path) as m:
        assert m.shard_error(0) is None
        why = m.shard_error(1)
        assert why and str(cl.ports[1]) in why, why
        assert m.stats(0)["shard"] == 0
    c.close()
