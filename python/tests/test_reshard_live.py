"""Re-sharding while Python workers run (docs/elastic.md): ps-local.sh
--worker-cmd runs two pyworker.py processes (sync, integer gradients, sgd
at lr 1); `ps-local.sh CONFIG reshard NEW_CONFIG` moves the shards from 2
to 3 while they train. The workers, never restarted, follow the new map
through libps ($PS_CONFIG_FOLLOW, set by ps-local.sh) and end with weights
equal to the exact sum of every push. The same for ps.torch.Embedding
workers (embworker.py) through 2 -> 3 -> 2: their rows the exact sums."""
import os
import subprocess
import sys
import time

import pytest

import ps
from conftest import ROOT, free_ports

HERE = os.path.dirname(__file__)
LOCAL = os.path.join(ROOT, "scripts", "ps-local.sh")
CLOCKS = 500
PACE_MS = 10  # 500 clocks last 5 s at least: the re-shard lands inside the run


def write(path, ports, ck):
    path.write_text(
        "cluster:\n  servers: [%s]\n  workers: 2\n"
        "optimizer:\n  name: sgd\n  lr: 1\n"
        "model:\n  tensors:\n    - {name: a, shape: [3000], init: zeros}\n"
        "    - {name: c, shape: [5], init: zeros}\n"
        "slice_bytes: 1024\n"
        "checkpoint:\n  dir: %s\n  every_s: 0\n"
        "log:\n  level: warn\n" % (", ".join("127.0.0.1:%d" % p for p in ports), ck))
    return str(path)


def test_python_workers_follow_a_reshard(tmp_path):
    ports = free_ports(3)
    ck = tmp_path / "ck"
    ck.mkdir()
    c2 = write(tmp_path / "c2.yaml", ports[:2], ck)
    c3 = write(tmp_path / "c3.yaml", ports, ck)
    logs = tmp_path / "logs"
    cmd = (f"{sys.executable} {HERE}/pyworker.py --clocks {CLOCKS} --pace-ms {PACE_MS} "
           "--check-workers 2")
    run = subprocess.Popen([LOCAL, c2, "--logs", str(logs), "--worker-cmd", cmd],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # the workers at clock 20 or later ($PS_SECRET_FILE: scripts/test-python.sh)
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, "the workers did not reach clock 20"
            try:
                with ps.Client(c2, monitor=True) as m:
                    if min(m.stats(0)["worker_clock"]) >= 20:
                        break
            except ps.Error:
                pass
            time.sleep(0.1)
        r = subprocess.run([LOCAL, c2, "reshard", c3], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "2 -> 3 shards at clock" in r.stdout and "while the workers ran" in r.stdout, \
            r.stdout
        out, _ = run.communicate(timeout=180)
    finally:
        if run.poll() is None:
            run.terminate()
            run.wait(timeout=60)
    assert run.returncode == 0, out
    for k in range(2):
        log = out if k == 0 else (logs / f"worker-{k}.log").read_text()
        assert f"worker {k} checked the sums of 2 workers" in log, log
        assert f"worker {k} done at clock {CLOCKS}" in log, log
        assert "re-shard: following" in log, log


def write_emb(path, ports, ck):
    # a table and no dense model: the workers declare their dense layer
    path.write_text(
        "cluster:\n  servers: [%s]\n  workers: 2\n"
        "optimizer:\n  name: sgd\n  lr: 1\n"
        "model:\n  embeddings:\n    - {name: e, dim: 4, init: zeros, optimizer: sgd, lr: 1}\n"
        "checkpoint:\n  dir: %s\n  every_s: 0\n"
        "log:\n  level: warn\n" % (", ".join("127.0.0.1:%d" % p for p in ports), ck))
    return str(path)


def wait_clock(cfg, clock, deadline_s=60):
    deadline = time.monotonic() + deadline_s
    while True:
        assert time.monotonic() < deadline, f"the workers did not reach clock {clock}"
        try:
            with ps.Client(cfg, monitor=True) as m:
                if min(m.stats(0)["worker_clock"]) >= clock:
                    return
        except ps.Error:
            pass
        time.sleep(0.1)


def test_torch_embedding_follows_2_3_2(tmp_path):
    """ps.torch.Embedding workers (embworker.py: integer row gradients, sgd at
    lr 1) keep training through 2 -> 3 -> 2 live re-shards; each ends with
    every row the exact sum of both workers' gradients."""
    pytest.importorskip("torch", reason="PyTorch is not installed (Debian: python3-torch)")
    ports = free_ports(3)
    ck = tmp_path / "ck"
    ck.mkdir()
    c2 = write_emb(tmp_path / "c2.yaml", ports[:2], ck)
    c3 = write_emb(tmp_path / "c3.yaml", ports, ck)
    logs = tmp_path / "logs"
    cmd = f"{sys.executable} {HERE}/embworker.py --steps 160 --pace-ms 5 --workers 2"
    run = subprocess.Popen([LOCAL, c2, "--logs", str(logs), "--worker-cmd", cmd],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_clock(c2, 20)
        r = subprocess.run([LOCAL, c2, "reshard", c3], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "2 -> 3 shards at clock" in r.stdout and "while the workers ran" in r.stdout, \
            r.stdout
        b = int(r.stdout.split("2 -> 3 shards at clock ")[1].split()[0])
        wait_clock(c3, b + 20)
        r = subprocess.run([LOCAL, c3, "reshard", c2], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "3 -> 2 shards at clock" in r.stdout, r.stdout
        out, _ = run.communicate(timeout=180)
    finally:
        if run.poll() is None:
            run.terminate()
            run.wait(timeout=60)
    assert run.returncode == 0, out
    for k in range(2):
        log = out if k == 0 else (logs / f"worker-{k}.log").read_text()
        assert f"worker {k} checked the rows of 2 workers" in log, log
        assert f"worker {k} done at clock 160" in log, log
        assert log.count("re-shard: following") == 2, log
