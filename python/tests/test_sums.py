"""Exact sums: Python worker processes push integer-valued gradients (sync
calls and asynchronous ones side by side); every weight and every row is
the exact sum, duplicate ids within a push summed once."""
import numpy as np
import pytest

import ps
from conftest import PYWORKER, gradient, row_grads, row_ids, run_workers

CLOCKS = 3


def expected_dense(cl, ranks, clocks):
    return {n: -sum(gradient(i, r, k, cnt) for r in ranks for k in range(clocks))
            for i, (n, cnt) in enumerate(cl.tensors.items())}


def expected_rows(ranks, clocks, dim):
    rows = {}
    for r in ranks:
        for k in range(clocks):
            for i, rid in enumerate(row_ids(r)):
                rows[rid] = rows.get(rid, np.zeros(dim, np.float32)) - row_grads(r, k, dim)[i]
    return rows


def check(cl, ranks, clocks, dim=None, sync=True):
    # a fresh client (rank 0 again) reads what the shards hold
    with ps.Client(cl.path, 0) as c:
        w = {n: np.full(k, np.nan, np.float32) for n, k in c.config.tensors.items()}
        v = c.pull(w, min_version=clocks if sync else 0)
        if sync:
            assert v == clocks
        for n, want in expected_dense(cl, ranks, clocks).items():
            np.testing.assert_array_equal(w[n], want, err_msg=f"tensor {n}")
        if dim:
            want = expected_rows(ranks, clocks, dim)
            ids = np.array(sorted(want), np.uint64)
            got = c.pull_rows("e", ids, min_version=clocks if sync else 0)
            for i, rid in enumerate(ids):
                np.testing.assert_array_equal(got[i], want[int(rid)], err_msg=f"row {rid}")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_exact_sums(cluster, mode):
    cl = cluster(workers=3, mode=mode, tables={"e": 4})
    cmds = [PYWORKER + ["--config", cl.path, "--rank", str(r), "--clocks", str(CLOCKS), "--rows"]
            + (["--async-calls"] if r == 2 else []) for r in range(3)]
    outs = run_workers(cmds)
    for r, out in enumerate(outs):
        assert f"worker {r} done at clock {CLOCKS}" in out
    check(cl, range(3), CLOCKS, dim=4, sync=mode == "sync")


def test_pushpull_and_rows_in_process(cluster):
    """One worker, in this process: pushpull (sync and as a handle) and the
    rows calls, against the sums it expects."""
    cl = cluster(workers=1, tables={"e": 3})
    with ps.Client(cl.path, 0) as c:
        names = list(cl.tensors)
        out = {n: np.zeros(k, np.float32) for n, k in cl.tensors.items()}
        g0 = {n: gradient(i, 0, 0, cl.tensors[n]) for i, n in enumerate(names)}
        assert c.pushpull(g0, out) == 1
        g1 = {n: gradient(i, 0, 1, cl.tensors[n]) for i, n in enumerate(names)}
        h = c.pushpull_async(g1, out)
        assert h.wait(timeout=30) == 2
        for i, n in enumerate(names):
            np.testing.assert_array_equal(out[n], -(g0[n] + g1[n]))
        ids = np.array([7, 3, 7, 7], np.int64)
        grads = np.arange(12, dtype=np.float32).reshape(4, 3)
        c.push_rows("e", ids, grads)       # clock 2, then the dense push ends it
        c.push(g0, end_clock=True)
        rows = c.pull_rows_async("e", np.array([3, 7], np.uint64)).wait(timeout=30)
        np.testing.assert_array_equal(rows[0], -grads[1])
        np.testing.assert_array_equal(rows[1], -(grads[0] + grads[2] + grads[3]))
        assert c.clock() == 3
