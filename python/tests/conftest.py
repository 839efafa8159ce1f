"""Fixtures of the ps package's tests: real ps-server processes on loopback.

`cluster(...)` writes a config into the test's folder, starts one
bin/ps-server per shard (the build's, from the repository root), waits
until each accepts connections, and stops them all (SIGTERM, then a check
that each exited 0) when the test ends. The cluster secret is
$PS_SECRET_FILE (scripts/run-tests.sh and `make test-python` make one), or
a fresh one from scripts/ps-keygen.
"""
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from sums import gradient, row_grads, row_ids  # noqa: E402,F401

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SERVER = os.path.join(ROOT, "bin", "ps-server")


def free_ports(n):
    """n distinct ports free now: all bound at once (one at a time, the
    kernel may hand the same port out twice)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port():
    return free_ports(1)[0]


class Cluster:
    def __init__(self, tmp_path, shards, workers, mode, tensors, tables, extra, declare=False,
                 limits=(), consistency=()):
        self.dir = str(tmp_path)
        self.ports = free_ports(shards)
        self.tensors = tensors
        self.path = os.path.join(self.dir, "cluster.yaml")
        lines = ["cluster:", "  servers: [%s]" % ", ".join(f"127.0.0.1:{p}" for p in self.ports),
                 f"  workers: {workers}", "consistency:", f"  mode: {mode}"] + list(consistency) + [
                 "slice_bytes: 4096", "optimizer:", "  name: sgd", "  lr: 1",
                 "limits:", "  connect_timeout_ms: 3000", "  request_timeout_ms: 10000",
                 "  reconnect_timeout_ms: 0"] + list(limits)
        # declare: no model in the config, the workers declare it
        lines += ["model:"] if tables or not declare else []
        lines += [] if declare else ["  tensors:"] + [
            f"    - {{name: {n}, shape: [{k}], init: zeros}}" for n, k in tensors.items()]
        if tables:
            lines.append("  embeddings:")
            lines += [f"    - {{name: {n}, dim: {d}, init: zeros, optimizer: sgd, lr: 1}}"
                      for n, d in tables.items()]
        lines += ["log:", "  level: warn"] + list(extra)
        with open(self.path, "w") as f:
            f.write("\n".join(lines) + "\n")
        self.procs = [None] * shards
        for k in range(shards):
            self.start(k)

    def start(self, k):
        log = open(os.path.join(self.dir, f"shard{k}.log"), "wb")
        self.procs[k] = subprocess.Popen([SERVER, "--config", self.path, "--shard", str(k),
                                          "--log-level", "warn"], stderr=log, cwd=ROOT)
        log.close()  # the child has its own descriptor
        deadline = time.monotonic() + 10
        while True:  # until it accepts connections (or exited)
            if self.procs[k].poll() is not None:
                raise RuntimeError(f"ps-server shard {k} exited {self.procs[k].returncode}: "
                                   + open(log.name).read())  # noqa: SIM115
            try:
                socket.create_connection(("127.0.0.1", self.ports[k]), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def stop(self, k, sig=signal.SIGTERM):
        p = self.procs[k]
        if p and p.poll() is None:
            p.send_signal(sig)
            p.wait(timeout=20)
        return p.returncode if p else None

    def close(self):
        codes = [self.stop(k) for k in range(len(self.procs))]
        return codes


@pytest.fixture
def cluster(tmp_path):
    made = []

    def make(shards=2, workers=1, mode="sync", tensors=None, tables=None, extra=(),
             declare=False, limits=(), consistency=()):
        c = Cluster(tmp_path / f"c{len(made)}", shards, workers, mode,
                    tensors or {"a": 3000, "b": 561, "c": 5}, tables or {}, extra, declare,
                    limits, consistency)
        made.append(c)
        return c

    for d in range(4):
        (tmp_path / f"c{d}").mkdir()
    yield make
    for c in made:
        for k, p in enumerate(c.procs):
            if p and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                assert p.wait(timeout=20) == 0, f"shard {k} did not exit cleanly"


@pytest.fixture(scope="session", autouse=True)
def secret(tmp_path_factory):
    if not os.environ.get("PS_SECRET_FILE"):
        path = str(tmp_path_factory.mktemp("secret") / "ps.secret")
        subprocess.run([os.path.join(ROOT, "scripts", "ps-keygen"), path], check=True,
                       stderr=subprocess.DEVNULL)
        os.environ["PS_SECRET_FILE"] = path
    yield os.environ["PS_SECRET_FILE"]


def in_threads(fn, ranks, timeout=120):
    """Runs fn(rank) for each rank in a thread of its own (a test's workers,
    each with its own client); raises what the first failing one raised,
    naming its rank, or fails when one still runs after timeout seconds."""
    errors = []

    def run(r):
        try:
            fn(r)
        except BaseException as e:  # noqa: BLE001  (raised below, in the test's thread)
            errors.append((r, e))
    ts = [threading.Thread(target=run, args=(r,), daemon=True) for r in ranks]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout)
    assert not any(t.is_alive() for t in ts), f"a worker thread still runs after {timeout} s"
    if errors:
        r, e = errors[0]
        raise AssertionError(f"worker {r}: {e!r}") from e


def run_workers(cmds, timeout=60):
    """Runs worker commands side by side; asserts each exits 0."""
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT)
             for c in cmds]
    outs = []
    for c, p in zip(cmds, procs):
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"worker {c} still running after {timeout} s")
        outs.append(out.decode(errors="replace"))
        assert p.returncode == 0, f"{c} exited {p.returncode}:\n{outs[-1]}"
    return outs


PYWORKER = [sys.executable, os.path.join(os.path.dirname(__file__), "pyworker.py")]
