"""Leaks: many sync and asynchronous calls leave the process's RSS and its
Python object count flat."""
import gc
import os
import time

import numpy as np

import ps

CALLS = int(os.environ.get("PS_PYTEST_LEAK_CALLS", "100000"))


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_calls_do_not_leak(cluster):
    cl = cluster(shards=1, workers=1, mode="async", tensors={"c": 16}, tables={"e": 4})
    with ps.Client(cl.path, 0) as c:
        w = {"c": np.zeros(16, np.float32)}
        g = {"c": np.zeros(16, np.float32)}
        ids = np.array([1, 2, 2], np.uint64)
        rows = np.zeros((3, 4), np.float32)

        def burst(n):
            for k in range(n // 4):
                c.pull(w)
                c.pull_async(w).wait()
                c.push(g, end_clock=False)
                if k % 2:
                    c.pull_rows("e", ids, rows)
                else:
                    c.push_async(g, end_clock=False).wait()

        burst(2000)  # warm up: allocator pools, caches
        gc.collect()
        rss0, objs0 = rss_kib(), len(gc.get_objects())
        t0 = time.monotonic()
        burst(CALLS)
        secs = time.monotonic() - t0
        gc.collect()
        rss1, objs1 = rss_kib(), len(gc.get_objects())
        print(f"{CALLS} calls in {secs:.1f} s ({secs / CALLS * 1e6:.1f} us a call): "
              f"RSS {rss0} -> {rss1} KiB, objects {objs0} -> {objs1}")
        assert objs1 - objs0 <= 20, f"Python objects grew {objs0} -> {objs1}"
        assert rss1 - rss0 <= 2048, f"RSS grew {rss0} -> {rss1} KiB over {CALLS} calls"
