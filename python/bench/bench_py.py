"""Python against C in one run: the 4 KiB pushpull round trip (p50) and
1 MiB push throughput from the ps package, each as a ratio to ps-bench's
figure for the same operation against a fresh shard of the same config,
and the binding's own cost per call.

    build/pyvenv/bin/python python/bench/bench_py.py [--seconds S] [--json]

(`make bench-python` runs it; BENCHMARKS.md records the figures.) Each
measurement gets a fresh ps-server of conf/bench.yaml (one shard, one
worker, sync) with ps-bench's model for that size (--dump-config); C and
Python runs alternate (C first and last).

The figure that counts is the median over the rounds of each Python run's
ratio to the C runs on either side of it (their geometric mean): on a
shared machine the round trip drifts by a third from one run to the next,
and a ratio of neighbours cancels the drift that a ratio of two medians
keeps. --pin runs the round trips' shard on the first CPU and the client
(ps-bench, the C loop, this process) on the second, the same for both
sides; it is not the default: with the client's two threads (the caller
and libps's I/O thread) on one CPU every round trip pays a switch
between them, which costs Python's caller more than C's (BENCHMARKS.md:
a ratio of 1.165 pinned against 1.117 unpinned minutes apart)."""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import ps

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.path.join(ROOT, "bin")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Shard:
    """A fresh ps-server for ps-bench's config of one op and size."""

    def __init__(self, tmp, size, cpu=None):
        base = os.path.join(tmp, "base.yaml")
        text = open(os.path.join(ROOT, "conf", "bench.yaml")).read()
        text = text.replace("127.0.0.1:7100", f"127.0.0.1:{free_port()}")
        open(base, "w").write(text)
        dump = subprocess.run([os.path.join(BIN, "ps-bench"), "--config", base, "--size", size,
                               "--dump-config"], check=True, capture_output=True, text=True).stdout
        self.path = os.path.join(tmp, f"bench-{size}.yaml")
        open(self.path, "w").write(dump)
        self.port = int(text.split("127.0.0.1:")[1].split("]")[0])
        self.proc = subprocess.Popen([os.path.join(BIN, "ps-server"), "--config", self.path,
                                      "--shard", "0", "--log-level", "warn"],
                                     preexec_fn=pin_fn(cpu))
        for _ in range(1000):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.01)
        raise RuntimeError("ps-server did not listen")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(timeout=30)


# CPUs of the shard and of the client (None: not pinned); set by main().
PIN = {"shard": None, "client": None}


def pin_fn(cpu):
    """A preexec_fn that pins the child to one CPU (None: leaves it)."""
    if cpu is None:
        return None
    return lambda: os.sched_setaffinity(0, {cpu})


def c_bench(tmp, op, size, seconds):
    with Shard(tmp, size, PIN["shard"]) as sh:
        out = subprocess.run([os.path.join(BIN, "ps-bench"), "--config", sh.path, "--op", op,
                              "--size", size, "--seconds", str(seconds), "--json",
                              "--no-baseline"], check=True, capture_output=True, text=True,
                             preexec_fn=pin_fn(PIN["client"])).stdout
    return json.loads(out.strip().splitlines()[-1])


def build_cloop(tmp):
    exe = os.path.join(tmp, "cloop")
    lib = os.path.join(ROOT, "lib")
    subprocess.run(["gcc", "-O2", "-std=gnu11", "-Wall", "-o", exe,
                    os.path.join(os.path.dirname(__file__), "cloop.c"),
                    "-I" + os.path.join(ROOT, "worker", "client"), "-I" + os.path.join(ROOT, "common"),
                    "-L" + lib, "-Wl,-rpath," + lib, "-lps"], check=True)
    return exe


def cloop_bench(tmp, exe, op, size, seconds):
    """The Python loop's calls in C (cloop.c): a stricter baseline."""
    with Shard(tmp, size, PIN["shard"]) as sh:
        out = subprocess.run([exe, sh.path, op, str(seconds)], check=True, capture_output=True,
                             text=True, preexec_fn=pin_fn(PIN["client"])).stdout
    return json.loads(out)


def py_bench(tmp, op, size, seconds):
    # this process is the client: pinned before ps.Client starts its I/O
    # thread, which inherits the CPU (unpinned again for the next shard)
    with Shard(tmp, size, PIN["shard"]) as sh:
        saved = os.sched_getaffinity(0)
        if PIN["client"] is not None:
            os.sched_setaffinity(0, {PIN["client"]})
        try:
            return py_loop(sh, op, seconds)
        finally:
            os.sched_setaffinity(0, saved)


def py_loop(sh, op, seconds):
    with ps.Client(sh.path, 0) as c:
        n = c.config.tensors["bench"]
        # the gradient ps-bench pushes (worker/ps_bench.c tensors_new)
        g = {"bench": ((np.arange(n) % 7 - 3) * np.float32(1e-4)).astype(np.float32)}
        w = {"bench": np.zeros(n, np.float32)}
        lat = []
        clock = c.clock()
        t_end = time.perf_counter() + seconds
        t0 = time.perf_counter()
        while True:
            t = time.perf_counter_ns()
            if op == "pushpull":
                c.pushpull(g, w, clock=clock)
            else:
                c.push(g, clock=clock)
            lat.append(time.perf_counter_ns() - t)
            clock += 1
            if time.perf_counter() >= t_end:
                break
        secs = time.perf_counter() - t0
    return {"ops": len(lat), "p50_us": statistics.median(lat) / 1e3,
            "p99_us": sorted(lat)[int(len(lat) * 0.99)] / 1e3,
            "gb_per_s": len(lat) * n * 4 / secs / 1e9}


def binding_cost(tmp, calls=200000):
    """Microseconds a call spends in the binding alone: c.clock() (the fork
    check, the use count, one libps call, an int back) and a push refused in
    the binding before libps (a mapping walked, a buffer taken and checked)."""
    with Shard(tmp, "4K") as sh, ps.Client(sh.path, 0) as c:
        t = time.perf_counter()
        for _ in range(calls):
            c.clock()
        clock_us = (time.perf_counter() - t) / calls * 1e6
        bad = {"bench": np.zeros(3, np.float32)}
        t = time.perf_counter()
        for _ in range(calls // 4):
            try:
                c.push(bad)
            except ps.ArrayError:
                pass
        refused_us = (time.perf_counter() - t) / (calls // 4) * 1e6
    return clock_us, refused_us


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--rounds", type=int, default=9, help="Python runs, between C runs")
    ap.add_argument("--pin", action="store_true",
                    help="round trips: the shard on the first CPU, the clients on the second")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if not os.environ.get("PS_SECRET_FILE"):
        raise SystemExit("bench_py.py: set PS_SECRET_FILE (scripts/ps-keygen FILE)")
    cpus = sorted(os.sched_getaffinity(0))
    res = {"pinned": a.pin and len(cpus) >= 2}
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_cloop(tmp)
        for op, size in (("pushpull", "4K"), ("push", "1M")):
            pin = op == "pushpull" and a.pin and len(cpus) >= 2
            PIN["shard"], PIN["client"] = (cpus[0], cpus[1]) if pin else (None, None)
            cs, pys, ls = [], [], []
            for r in range(a.rounds):  # C, loop, Python, C, ..., C: drift hits all
                cs.append(c_bench(tmp, op, size, a.seconds))
                ls.append(cloop_bench(tmp, exe, op, size, a.seconds))
                pys.append(py_bench(tmp, op, size, a.seconds))
            cs.append(c_bench(tmp, op, size, a.seconds))
            med = statistics.median
            c_p50, py_p50 = med(x["p50_us"] for x in cs), med(x["p50_us"] for x in pys)
            c_gb, py_gb = med(x["gb_per_s"] for x in cs), med(x["gb_per_s"] for x in pys)
            l_p50, l_gb = med(x["p50_us"] for x in ls), med(x["gb_per_s"] for x in ls)
            # each Python run against the C runs on either side of it
            nb = [(cs[i]["p50_us"] * cs[i + 1]["p50_us"]) ** 0.5 for i in range(a.rounds)]
            nb_gb = [(cs[i]["gb_per_s"] * cs[i + 1]["gb_per_s"]) ** 0.5 for i in range(a.rounds)]
            pair_p50 = med(pys[i]["p50_us"] / nb[i] for i in range(a.rounds))
            pair_gb = med(pys[i]["gb_per_s"] / nb_gb[i] for i in range(a.rounds))
            res[f"{op}_{size}"] = {
                "c_p50_us": c_p50, "py_p50_us": py_p50, "c_gb_per_s": c_gb, "py_gb_per_s": py_gb,
                "p50_ratio": pair_p50, "gb_ratio": pair_gb,
                "p50_ratio_medians": py_p50 / c_p50, "gb_ratio_medians": py_gb / c_gb,
                "overhead_us": py_p50 - c_p50,
                "loop_p50_us": l_p50, "loop_gb_per_s": l_gb,
                "p50_ratio_loop": py_p50 / l_p50, "gb_ratio_loop": py_gb / l_gb,
                "runs": {"c": [(x["p50_us"], x["gb_per_s"]) for x in cs],
                         "loop": [(x["p50_us"], x["gb_per_s"]) for x in ls],
                         "py": [(x["p50_us"], x["gb_per_s"]) for x in pys]}}
        res["binding_us"] = dict(zip(("clock_call", "refused_push"), binding_cost(tmp)))
    if a.json:
        print(json.dumps(res))
        return
    pp, pu = res["pushpull_4K"], res["push_1M"]
    cpus = sorted(os.sched_getaffinity(0))
    where = (f"round trips with the shard on CPU {cpus[0]} and the clients on CPU {cpus[1]}"
             if res["pinned"] else "not pinned")
    print(f"{a.rounds} Python runs between {a.rounds + 1} C (ps-bench) runs of {a.seconds:g} s, "
          f"{where}; ratio = median over the Python runs of python / its C neighbours")
    print(f"pushpull 4 KiB p50: python {pp['py_p50_us']:.1f} us, C {pp['c_p50_us']:.1f} us "
          f"(medians): ratio {pp['p50_ratio']:.3f} (target <= 1.15; of the medians "
          f"{pp['p50_ratio_medians']:.3f}), {pp['overhead_us']:+.1f} us a call")
    print(f"push 1 MiB: python {pu['py_gb_per_s']:.3f} GB/s, C {pu['c_gb_per_s']:.3f} GB/s: "
          f"ratio {pu['gb_ratio']:.3f} (target >= 0.95; of the medians "
          f"{pu['gb_ratio_medians']:.3f})")
    print(f"against the same loop in C (cloop.c): pushpull 4 KiB p50 {pp['loop_p50_us']:.1f} us, "
          f"ratio {pp['p50_ratio_loop']:.3f}; push 1 MiB {pu['loop_gb_per_s']:.3f} GB/s, "
          f"ratio {pu['gb_ratio_loop']:.3f}")
    b = res["binding_us"]
    print(f"binding alone: {b['clock_call']:.3f} us a call (c.clock()), "
          f"{b['refused_push']:.3f} us for a push refused before libps")
    ok = pp["p50_ratio"] <= 1.15 and pu["gb_ratio"] >= 0.95
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
