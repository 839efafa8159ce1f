"""The launchers start Python workers: ps-local.sh --worker-cmd runs the
command as each worker with PS_CONFIG and PS_RANK set (the package reads
them); ps.sbatch --worker-cmd puts them on each worker's srun line."""
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import ROOT, free_ports

HERE = os.path.dirname(__file__)


def write_config(tmp_path, workers):
    path = tmp_path / "local.yaml"
    path.write_text(
        "cluster:\n  servers: [127.0.0.1:%d, 127.0.0.1:%d]\n  workers: %d\n"
        "optimizer:\n  name: sgd\n  lr: 1\n"
        "model:\n  tensors:\n    - {name: a, shape: [3000], init: zeros}\n"
        "    - {name: c, shape: [5], init: zeros}\n"
        "log:\n  level: warn\n" % (*free_ports(2), workers))
    return str(path)


def test_ps_local_worker_cmd(tmp_path):
    cfg = write_config(tmp_path, 2)
    cmd = f"{sys.executable} {HERE}/pyworker.py --clocks 3 --check-workers 2"
    logs = tmp_path / "logs"
    p = subprocess.run([os.path.join(ROOT, "scripts", "ps-local.sh"), cfg, "--logs", str(logs),
                        "--worker-cmd", cmd], cwd=str(tmp_path), capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    for r in range(2):
        # worker 0's output goes to the terminal (its stderr to the log too)
        log = p.stdout if r == 0 else (logs / f"worker-{r}.log").read_text()
        assert f"worker {r} checked the sums of 2 workers" in log, log
        assert f"worker {r} done at clock 3 env rank {r}" in log, log


def test_ps_local_worker_cmd_failure(tmp_path):
    cfg = write_config(tmp_path, 2)
    p = subprocess.run([os.path.join(ROOT, "scripts", "ps-local.sh"), cfg, "--logs",
                        str(tmp_path / "logs"), "--worker-cmd", "exit $((3 + PS_RANK))"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1
    assert "exited with status" in p.stderr


def test_sbatch_worker_cmd_dry_run(tmp_path):
    cfg = write_config(tmp_path, 2)
    env = dict(os.environ, PS_NODES="n1 n2", PS_DRY_RUN="1", PS_LOGS=str(tmp_path / "sb"))
    p = subprocess.run([os.path.join(ROOT, "scripts", "ps.sbatch"), cfg, "--worker-cmd",
                        "python3 train.py"], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    derived = str(tmp_path / "sb" / "cluster.yaml")
    lines = [ln for ln in p.stdout.splitlines() if "bash -c" in ln]
    assert len(lines) == 2, p.stdout
    for r, ln in enumerate(lines):
        assert f"--nodelist=n{r + 1}" in ln
        assert f"env PS_CONFIG={derived} PS_RANK={r}" in ln, ln
        assert "PS_NUM_WORKERS=2 bash -c python3 train.py" in ln, ln
    assert "ps-worker" not in "\n".join(lines)


def test_ps_worker_exec(tmp_path):
    cfg = write_config(tmp_path, 2)
    worker = os.path.join(ROOT, "bin", "ps-worker")
    p = subprocess.run([worker, "--config", os.path.relpath(cfg), "--rank", "1", "--secret-file",
                        "/s", "--exec", 'echo "$PS_CONFIG $PS_RANK $PS_NUM_WORKERS $PS_SECRET_FILE"'],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [cfg, "1", "2", "/s"]
    p = subprocess.run([worker, "--config", cfg, "--rank", "0", "--exec", "exit 5"], timeout=30)
    assert p.returncode == 5
    p = subprocess.run([worker, "--config", cfg, "--rank", "2", "--exec", "true"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "workers 0..1" in p.stderr
    # a config read from a pipe: no path the command could be given; refused, the
    # command not run
    with open(cfg) as f:
        p = subprocess.run([worker, "--config", "/dev/stdin", "--rank", "0", "--exec",
                            "echo ran"], input=f.read(), capture_output=True, text=True,
                           timeout=30)
    assert p.returncode == 127 and p.stdout == "", (p.returncode, p.stdout, p.stderr)
    assert "ps-worker: --exec: /dev/stdin: No such file or directory" in p.stderr, p.stderr
    # a command killed by a signal: 128 + the signal, as a shell says it
    p = subprocess.run([worker, "--config", cfg, "--rank", "0", "--exec", "kill -9 $$"],
                       timeout=30)
    assert p.returncode == 128 + signal.SIGKILL, p.returncode
    # SIGTERM to ps-worker (as ps-cluster.sh stop sends it) reaches the
    # command, whose own exit status ps-worker then ends with
    p = subprocess.Popen([worker, "--config", cfg, "--rank", "0", "--exec",
                          'trap "echo got TERM; exit 7" TERM; echo ready; '
                          'while :; do sleep 0.05; done'],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == 7 and out.strip() == "got TERM", (p.returncode, out)


def test_ps_server_sigterm_once_listening(tmp_path):
    """A launcher that stops a shard as soon as it accepts a connection (a test
    harness, a pod's preStop) gets a clean stop: ps-server catches SIGTERM from
    before it listens, so the signal never kills it half set up (its metrics
    server still starting) and its stop is logged. Ten times, with stats.http,
    whose start made that window wide enough to land in 29 times of 30."""
    server = os.path.join(ROOT, "bin", "ps-server")
    for i in range(10):
        port, http = free_ports(2)
        cfg = tmp_path / f"c{i}.yaml"
        cfg.write_text(f"cluster:\n  servers: [127.0.0.1:{port}]\n  workers: 1\n"
                       "model:\n  tensors:\n    - {name: a, shape: [10], init: zeros}\n"
                       f"stats:\n  http: 127.0.0.1:{http}\nlog:\n  level: info\n")
        log = tmp_path / f"c{i}.log"
        with open(log, "wb") as f:
            p = subprocess.Popen([server, "--config", str(cfg), "--shard", "0"], stderr=f)
        try:
            deadline = time.monotonic() + 20
            while True:  # no pause: the signal follows the first accepted connection
                assert p.poll() is None, log.read_text()
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline, log.read_text()
            p.send_signal(signal.SIGTERM)
            rc = p.wait(timeout=20)
        finally:
            p.kill()
            p.wait()
        assert rc == 0, f"start {i}: exit {rc}: {log.read_text()}"
        assert "received SIGTERM, stopping" in log.read_text(), log.read_text()


def _sig_masks(out):
    """{"SigIgn": mask, "SigBlk": mask} from /proc/PID/status lines."""
    return {k: int(v, 16) for k, v in (ln.split(":\t") for ln in out.splitlines())}


def test_ps_worker_exec_signal_dispositions(tmp_path):
    """--exec's command starts with the dispositions a shell gives a command, whatever
    ps-worker was started with: SIGPIPE not ignored (a launcher such as Python with
    restore_signals=False hands SIG_IGN down), and none of SIGPIPE, SIGTERM, SIGINT and
    SIGHUP, which ps-worker forwards, blocked."""
    cfg = write_config(tmp_path, 2)
    worker = os.path.join(ROOT, "bin", "ps-worker")
    show = "grep -E '^Sig(Ign|Blk):' /proc/self/status"
    bit = {s: 1 << (s - 1) for s in (signal.SIGPIPE, signal.SIGTERM, signal.SIGINT,
                                    signal.SIGHUP)}
    assert signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN   # Python's own start-up
    # the setting works: a command started the same way without ps-worker has SIGPIPE ignored
    plain = subprocess.run(["/bin/sh", "-c", show], capture_output=True, text=True, timeout=30,
                           restore_signals=False)
    assert _sig_masks(plain.stdout)["SigIgn"] & bit[signal.SIGPIPE], plain.stdout
    p = subprocess.run([worker, "--config", cfg, "--rank", "0", "--exec", show],
                       capture_output=True, text=True, timeout=30, restore_signals=False)
    assert p.returncode == 0, p.stderr
    masks = _sig_masks(p.stdout)
    assert not masks["SigIgn"] & bit[signal.SIGPIPE], f"SIGPIPE ignored in the command: {p.stdout}"
    for s, b in bit.items():
        assert not masks["SigBlk"] & b, f"{s.name} blocked in the command: {p.stdout}"


FAULT_LIB = os.path.join(ROOT, "build", "rel", "tests", "libpsfault.so")


def test_ps_worker_exec_out_of_memory(tmp_path):
    """ps-worker --exec out of memory at each allocation from its last down to the
    config's parse (tests/fault_inject.c's libpsfault.so): the environment it hands
    the command (setenv) failing exits 127 saying so, without running the command;
    a fault elsewhere leaves the command's run as it was; never a signal. (Faults
    in the libraries' constructors, before main, are not ps-worker's.)"""
    worker = os.path.join(ROOT, "bin", "ps-worker")
    if not os.path.exists(FAULT_LIB):
        pytest.skip(f"{FAULT_LIB} is not built (make build/rel/tests/libpsfault.so)")
    if b"libasan" in subprocess.run(["ldd", worker], capture_output=True).stdout:
        pytest.skip("bin/ps-worker is the sanitizer build: libpsfault.so cannot come first")
    cfg, log = write_config(tmp_path, 2), tmp_path / "fault.log"

    def run(nth):
        if log.exists():
            log.unlink()
        env = dict(os.environ, LD_PRELOAD=FAULT_LIB, PS_FAULT=f"alloc:{nth}",
                   PS_FAULT_LOG=str(log))
        r = subprocess.run([worker, "--config", cfg, "--rank", "1", "--secret-file", "/s",
                            "--exec", 'echo "$PS_RANK $PS_NUM_WORKERS $PS_SECRET_FILE"'],
                           capture_output=True, text=True, timeout=60, env=env)
        return r, log.exists() and log.stat().st_size > 0

    lo, hi = 1, 1 << 16   # the last allocation whose fault is made
    assert run(lo)[1]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if run(mid)[1] else (lo, mid)
    refused = in_config = 0
    for nth in range(lo, 0, -1):
        r, made = run(nth)
        assert made and r.returncode >= 0, (nth, r.returncode, r.stderr)
        if "setenv: Cannot allocate memory" in r.stderr:
            assert r.returncode == 127 and r.stdout == "", (nth, r.returncode, r.stdout)
            refused += 1
        elif "out of memory" in r.stderr and cfg in r.stderr:
            in_config += 1   # the config's parse: below are the constructors' and main's
            if in_config == 5:
                break
        else:
            assert r.returncode == 0 and r.stdout == "1 2 /s\n", (nth, r.returncode,
                                                                  r.stdout, r.stderr)
    # four variables, each a string and a longer environment
    assert refused >= 4 and in_config == 5, (refused, in_config)



def test_ps_worker_exec_without_shell(tmp_path):
    """ps-worker --exec where /bin/sh cannot be run (a mount namespace of the test's own,
    /dev/null bound over /bin/sh): exit 127, as a shell says a command is not found, with
    the reason named, and nothing run."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) for a mount namespace without /bin/sh")
    worker = os.path.join(ROOT, "bin", "ps-worker")
    cfg = write_config(tmp_path, 2)
    mark = tmp_path / "ran"
    script = ("mount --bind /dev/null /bin/sh && exec " +
              shlex.join([worker, "--config", cfg, "--rank", "1", "--secret-file", "/s",
                          "--exec", f"touch {mark}"]))
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "/bin/bash", "-c", script],
                       capture_output=True, text=True, timeout=60)
    if "mount" in r.stderr and r.returncode != 127:
        pytest.skip(f"no mount namespace here: {r.stderr.strip()}")
    assert r.returncode == 127, (r.returncode, r.stderr)
    assert "ps-worker: --exec: /bin/sh: " in r.stderr, r.stderr
    assert not mark.exists()

def test_ps_cluster_worker_cmd_dry_run(tmp_path):
    cfg = write_config(tmp_path, 2)
    text = open(cfg).read().replace("127.0.0.1:", "s1:", 1).replace("127.0.0.1:", "s2:", 1)
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(text + "security: {secret_file: c.secret}\n")
    p = subprocess.run([os.path.join(ROOT, "scripts", "ps-cluster.sh"), str(hosts), "start",
                        "--dry-run", "--worker-hosts", "w1,w2", "--logs", str(tmp_path / "logs"),
                        "--worker-cmd", "python3 train.py"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stdout.splitlines() if "ps-worker" in ln]
    assert len(lines) == 2, p.stdout
    for r, ln in enumerate(lines):
        # ssh ... -- HOST SCRIPT; SCRIPT runs `nohup sh -c INNER`, each level
        # quoted for POSIX sh: unquote them as the remote shells will
        words = shlex.split(ln)
        assert words[words.index("--") + 1] == f"w{r + 1}", ln
        script = shlex.split(words[-1])
        lex = shlex.shlex(script[script.index("-c") + 1], posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        inner = list(lex)
        cmd = inner[:inner.index(";")] if ";" in inner else inner
        assert cmd[0].endswith("/ps-worker"), inner
        assert cmd[1:] == ["--config", str(hosts), "--rank", str(r), "--exec", "python3 train.py"], inner


FMNIST = "/usr/share/datasets/fashion-mnist"


def test_ps_worker_progress_on_a_terminal(tmp_path):
    """On a terminal ps-worker redraws one progress line in place (\\r, then erase to
    the end of the line); each epoch's log line starts a line of its own after it."""
    import pty
    import re

    if not os.path.exists(os.path.join(FMNIST, "train-images-idx3-ubyte.gz")):
        pytest.skip(f"{FMNIST}: Debian's dataset-fashion-mnist is not installed")
    port = free_ports(1)[0]
    cfg = tmp_path / "tty.yaml"
    cfg.write_text(f"cluster: {{servers: ['127.0.0.1:{port}'], workers: 1}}\nseed: 7\n"
                   "model: {preset: mlp}\n"
                   f"train: {{batch: 20, limit: 400, test_limit: 500, epochs: 2, "
                   f"data_dir: '{FMNIST}'}}\n"
                   "optimizer: {name: sgd, lr: 0.05}\nlog: {level: info}\n")
    srv = subprocess.Popen([os.path.join(ROOT, "bin", "ps-server"), "--config", str(cfg),
                            "--shard", "0"], stderr=subprocess.DEVNULL, cwd=ROOT)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and srv.poll() is None
                time.sleep(0.02)
        master, slave = pty.openpty()
        w = subprocess.Popen([os.path.join(ROOT, "bin", "ps-worker"), "--config", str(cfg),
                              "--rank", "0", "--metrics-dir", str(tmp_path)], stdout=slave,
                             stderr=slave, cwd=ROOT)
        os.close(slave)
        out = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the worker closed the terminal
                break
            if not chunk:
                break
            out += chunk
        os.close(master)
        assert w.wait(timeout=120) == 0, out.decode(errors="replace")[-2000:]
    finally:
        srv.send_signal(signal.SIGTERM)
        srv.wait(timeout=20)
    text = out.decode(errors="replace")
    assert "\r" in text and "\x1b[K" in text, text[-2000:]       # the redrawn line
    for e in (1, 2):
        line = re.search(r"(^|[^\n]*)\d{4}-\d\d-\d\dT[\d:.]+Z info  worker\[0\] "
                         rf"epoch {e}: \d+ steps", text, re.M)
        assert line and line.group(1) == "", f"epoch {e}'s line: {line and line.group(0)!r}"
    # and each epoch's metrics line is one JSON object whose figures are numbers
    import json
    lines = (tmp_path / "worker-0.jsonl").read_text().splitlines()
    assert len(lines) == 2, lines
    for e, text in enumerate(lines, 1):
        m = json.loads(text)
        assert m["epoch"] == e, text
        for k in ("time_s", "train_loss", "samples_per_s", "compute_s", "push_wait_s",
                  "net_wait_s", "upload_s", "net_wait_fraction"):
            assert isinstance(m[k], (int, float)) and m[k] >= 0, (k, text)
        assert 0 <= m["net_wait_fraction"] <= 1, text
