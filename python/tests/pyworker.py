"""A Python worker of the tests: for each clock, pushes the integer-valued
gradients of sums.py (rows first when --rows), ending the clock, and pulls
the weights of the clock it ended. --async-calls uses the *_async forms and
waits on their handles. Config and rank come from the arguments, or from
$PS_CONFIG / $PS_RANK as the launchers set them."""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import ps  # noqa: E402
from sums import gradient, row_grads, row_ids  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--config")
ap.add_argument("--rank", type=int)
ap.add_argument("--clocks", type=int, default=3)
ap.add_argument("--async-calls", action="store_true")
ap.add_argument("--rows", action="store_true")
ap.add_argument("--pace-ms", type=float, default=0,
                help="sleep this long after each clock (a run that lasts while a test acts)")
ap.add_argument("--check-workers", type=int, default=0,
                help="sync: at the end, check the weights are the exact sum of N workers' pushes")
a = ap.parse_args()

with ps.Client(a.config, a.rank) as c:
    rank = c.rank
    names = list(c.config.tensors)
    sync = c.config.sync
    w = {n: np.zeros(k, np.float32) for n, k in c.config.tensors.items()}
    for clock in range(a.clocks):
        g = {n: gradient(i, rank, clock, c.config.tensors[n]) for i, n in enumerate(names)}
        if a.rows:
            dim = c.config.tables["e"]
            ids = np.array(row_ids(rank), np.uint64 if rank % 2 else np.int64)
            rg = row_grads(rank, clock, dim)
            if a.async_calls:
                assert c.push_rows_async("e", ids, rg, clock=clock).wait(timeout=30) is None
            else:
                c.push_rows("e", ids, rg, clock=clock)
        if a.async_calls:
            h = c.push_async(g, clock=clock)
            h.wait(timeout=30)
            assert h.done()
            v = c.pull_async(w, min_version=clock + 1 if sync else 0).wait(timeout=30)
        else:
            c.push(g, clock=clock)
            v = c.pull(w, min_version=clock + 1 if sync else 0)
        if sync:
            assert v >= clock + 1, f"pulled version {v} after clock {clock}"
        if a.pace_ms:
            time.sleep(a.pace_ms / 1000)
    if a.check_workers:
        for i, n in enumerate(names):
            want = -sum(gradient(i, r, k, c.config.tensors[n])
                        for r in range(a.check_workers) for k in range(a.clocks))
            assert np.array_equal(w[n], want), f"tensor {n}: {w[n][:4]} != {want[:4]}"
        print("worker", rank, "checked the sums of", a.check_workers, "workers")
    print("worker", rank, "done at clock", c.clock(), "env rank", os.environ.get("PS_RANK"))
