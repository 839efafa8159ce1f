"""A monitor's view: stats as dicts with the counters ps-stat shows, and
checkpoints written on request."""
import os

import numpy as np

import ps


def test_stats_and_checkpoint(cluster, tmp_path):
    ck = tmp_path / "ckpt"
    ck.mkdir()
    cl = cluster(workers=1, tables={"e": 4},
                 extra=["checkpoint:", f"  dir: {ck}", "  on_request: true",
                        "  min_interval_s: 0"])
    with ps.Client(cl.path, 0) as c:
        g = {n: np.ones(k, np.float32) for n, k in cl.tensors.items()}
        for _ in range(3):
            c.push(g)
        c.push_rows("e", np.array([4, 4, 9], np.uint64), np.ones((3, 4), np.float32))
        c.push(g)
    with ps.monitor(cl.path) as m:
        assert m.rank == -1
        stats = m.stats()
        assert [s["shard"] for s in stats] == [0, 1]
        assert sum(s["pushes"] for s in stats) >= 8   # 4 clocks, both shards hold slices of a
        for s in stats:
            assert s["nworkers"] == 1 and s["worker_clock"] == [4] and len(s["worker_up"]) == 1
            assert len(s["push_lat"]) == len(s["pull_lat"]) > 0
            assert s["tables"][0]["name"] == "e" and s["tables"][0]["dim"] == 4
        assert sum(s["tables"][0]["rows"] for s in stats) == 2
        for s in stats:   # never re-sharded, no change under way (docs/elastic.md)
            assert (s["map_epoch"], s["reshard_in_bytes"], s["reshard_in_slices"],
                    s["reshard_in_rows"], s["stop_at"], s["stop_committed"]) == (0,) * 6
            assert s["top_clock"] == 4 and s["joining"] == {} and s["leaving"] == {}
            # the model and table e are the config's: nothing declared
            assert (s["decl_digest"], s["decl_tensors"], s["decl_tables"]) == (0, 0, 0)
        res = m.checkpoint()
        for k, r in enumerate(res):
            assert r["checkpoint_status"] == 0, r["checkpoint_error"]
            assert r["checkpoint_path"].startswith(str(ck)) and os.path.exists(r["checkpoint_path"])
            assert r["checkpoint_bytes"] > 0
        for s in m.stats():   # the health ps-stat shows: on, fresh, no failures
            assert s["checkpoint_on"] == 1 and s["checkpoint_failures"] == 0
            assert 0 <= s["checkpoint_age_s"] < 60, s["checkpoint_age_s"]
            assert s["tables"][0]["cap_rows"] > 0   # the table's budget, in rows
        try:
            m.stats(2)
            raise AssertionError("shard 2 of 2 answered")
        except ps.Error as e:
            assert "shards 0..1" in str(e)
