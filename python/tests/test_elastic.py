"""Elastic membership from Python (docs/reliability.md): a worker joins a
running sync cluster at the clock the shards agree on, one leaves, and
every clock's sum is over exactly its members; members() tells each worker
its place for data loading."""
import threading

import numpy as np
import pytest

import ps


def test_join_leave_members(cluster):
    # ranks 0 and 1 start; rank 2 joins at run time (cluster.initial_workers)
    cl = cluster(workers="3\n  initial_workers: 2", tensors={"c": 5})
    ones = np.ones(5, np.float32)
    w = np.zeros(5, np.float32)
    with ps.Client(cl.path, 0) as c0, ps.Client(cl.path, 1) as c1:
        c0.push({"c": ones})          # clock 0: ranks 0 and 1
        c1.push({"c": 2 * ones})
        with ps.Client(cl.path, 2) as c2:
            # clock 0 has closed, clock 1 not: the shards hold clock 1 open
            # while the join is agreed, and count rank 2 from clock 2
            assert c2.clock() == 2
            c0.push({"c": ones})      # clock 1: still ranks 0 and 1
            c1.push({"c": 2 * ones})
            c0.pull({"c": w}, min_version=2)
            m0, = [c0.members()]
            c2.pull({"c": w}, min_version=2)
            m2 = c2.members()
            assert (m0["clock"], m0["count"], m0["index"], m0["before"]) == (2, 3, 0, 4)
            assert (m2["count"], m2["index"], m2["epoch"]) == (3, 2, 1)
            c1.pull({"c": w}, min_version=2)
            c1.leave()                # rank 1 ends clock 2 without a gradient, and leaves
            c0.push({"c": ones})      # clock 2: ranks 0, 1 (nothing) and 2
            c2.push({"c": 3 * ones})
            c0.pull({"c": w}, min_version=3)
            m0 = c0.members()
            assert (m0["clock"], m0["count"], m0["index"], m0["before"], m0["epoch"]) == \
                (3, 2, 0, 7, 2)
            np.testing.assert_array_equal(w, -np.full(5, 3 + 3 + 4, np.float32))
            with pytest.raises(ps.Error, match="left the cluster at clock 3"):
                c1.push({"c": ones}, clock=3)
            st = c0.stats(0)
            assert (st["joins"], st["leaves"], st["members"]) == (1, 1, [0, 2])


def test_leave_begin_async_staleness(cluster):
    # async, staleness 2: rank 1 (the slowest) asks to leave after ending
    # clock 0 while rank 0 has been told clock 2: it trains up to clock 2,
    # the highest clock told with it as a member, and rank 0's pull for
    # clock 3 waits until it has left (no later clock is told with it)
    cl = cluster(workers=2, mode="async", tensors={"c": 5}, consistency=["  staleness: 2"])
    ones = np.ones(5, np.float32)
    w = np.zeros(5, np.float32)
    with ps.Client(cl.path, 0) as c0, ps.Client(cl.path, 1) as c1:
        c1.push({"c": ones})              # rank 1 ends clock 0
        for clock in range(0, 3):         # rank 0 runs ahead: clocks 0..2
            c0.pull({"c": w})
            assert c0.members()["count"] == 2
            if clock < 2:
                c0.push({"c": ones})
        last = c1.leave_begin()
        assert last == 2
        c0.push({"c": ones})              # rank 0 ends clock 2
        got = {}

        def pull_clock_3():
            c0.pull({"c": w})
            got["m"] = c0.members()
        t = threading.Thread(target=pull_clock_3)
        t.start()
        t.join(0.5)
        assert t.is_alive(), "rank 0 was told clock 3 before rank 1 left"
        for clock in range(1, last):      # rank 1 trains through its last clock
            c1.push({"c": ones})
        c1.push({"c": ones}, end_clock=False)
        c1.leave(last)
        t.join(30)
        assert not t.is_alive()
        m = got["m"]                      # clock 3: rank 1 has left
        assert (m["clock"], m["count"], m["index"]) == (3, 1, 0)
        np.testing.assert_array_equal(w, -np.full(5, 3 + 3, np.float32))
        st = c0.stats(0)
        assert (st["leaves"], st["members"]) == (1, [0])
    # sync: the current clock, nothing asked of the shards
    cl2 = cluster(workers=1, tensors={"c": 5})
    with ps.Client(cl2.path, 0) as c:
        c.push({"c": ones})
        assert c.leave_begin() == 1
