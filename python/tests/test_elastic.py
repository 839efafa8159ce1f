"""Elastic membership from Python (docs/reliability.md): a worker joins a
running sync cluster at the clock the shards agree on, one leaves, and
every clock's sum is over exactly its members; members() tells each worker
its place for data loading."""
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
