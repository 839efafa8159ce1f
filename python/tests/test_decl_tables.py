"""Client.declare_tables: embedding tables declared at run time, against real
shards (server/decl_tables.c).

Two workers declare two tables (different dims and optimizers) beside the
config's YAML table, push integer row gradients with push_rows and read them
back with pull_rows: every row is the exact sum. Client.tables lists the
declared tables with their dim; an unknown key, a value out of bounds, a
YAML table's name and a differing declaration are refused naming the key or
the field; dense tensors declared after the tables work beside them.
"""
import threading

import numpy as np
import pytest

import ps

TABLES = [
    {"name": "emb_a", "dim": 4, "init": "zeros", "optimizer": "sgd", "lr": 1.0},
    {"name": "emb_b", "dim": 3, "init": "const", "value": 10.0, "optimizer": "sgd", "lr": 0.5},
    {"name": "emb_c", "dim": 5, "optimizer": "adam", "lr": 0.001, "admission": 2, "ttl": 3600,
     "max_rows": 100000},
]
IDS = np.arange(1, 31, dtype=np.uint64) * 1000003


def grads(rank, ids, dim, clock):
    """Small integers, different per rank, id, element and clock."""
    j = np.arange(dim)
    return (((ids[:, None].astype(np.int64) * 7 + j * 3 + clock * 5 + rank * 11) % 9) - 4
            ).astype(np.float32)


def declare_both(path, tables):
    c0, c1 = ps.Client(path, 0), ps.Client(path, 1)
    err = []

    def rank1():
        try:
            c1.declare_tables(tables)
        except Exception as e:  # noqa: BLE001  (re-raised below)
            err.append(e)
    t = threading.Thread(target=rank1)
    t.start()
    c0.declare_tables(tables)
    t.join()
    assert not err, err
    return c0, c1


def test_declare_tables_round_trip(cluster):
    cl = cluster(shards=2, workers=2, declare=True, tables={"yaml_t": 2})
    assert ps.Config(cl.path).tables == {"yaml_t": 2}
    c0, c1 = declare_both(cl.path, TABLES)
    for c in (c0, c1):
        assert c.tables == {"yaml_t": 2, "emb_a": 4, "emb_b": 3, "emb_c": 5}
    want = {"emb_a": np.zeros((len(IDS), 4), np.float32),
            "emb_b": np.full((len(IDS), 3), 10.0, np.float32),
            "yaml_t": np.zeros((len(IDS), 2), np.float32)}
    lr = {"emb_a": 1.0, "emb_b": 0.5, "yaml_t": 1.0}
    for clock in range(3):
        for rank, c in enumerate((c0, c1)):
            ids = IDS if rank == 0 else np.ascontiguousarray(IDS[::2])  # rank 1: every other row
            for name, dim in c.tables.items():
                c.push_rows(name, ids, grads(rank, ids, dim, clock), clock=clock)
                if name in want:
                    sel = np.isin(IDS, ids)
                    want[name][sel] -= lr[name] * grads(rank, ids, dim, clock)
    for c in (c0, c1):
        for name, w in want.items():
            got = c.pull_rows(name, IDS, min_version=3)
            assert got.shape == w.shape
            np.testing.assert_array_equal(got, w, err_msg=name)
        c_rows = c.pull_rows("emb_c", IDS, min_version=3)
        assert c_rows.shape == (len(IDS), 5)

    # a restarted worker re-declares; a differing one is refused naming the field
    c1.close()
    c1 = ps.Client(cl.path, 1)
    bad = [dict(t) for t in TABLES]
    bad[1]["lr"] = 0.25
    with pytest.raises(ps.ConfigError, match=r"table 'emb_b': lr differs: 0.5 on the shard, "
                                             r"0.25 in this declaration"):
        c1.declare_tables(bad)
    c1.close()
    c1 = ps.Client(cl.path, 1)
    c1.declare_tables(TABLES)
    np.testing.assert_array_equal(c1.pull_rows("emb_a", IDS, min_version=3), want["emb_a"])
    with pytest.raises(ps.StateError, match="declared its tables already"):
        c1.declare_tables(TABLES)

    # dense tensors declared after the tables, beside them
    m0, m1 = {"w": np.ones(6, np.float32)}, {"w": np.zeros(6, np.float32)}
    t = threading.Thread(target=c1.declare, args=(m1,))
    t.start()
    c0.declare(m0)
    t.join()
    assert (m1["w"] == 1).all()
    assert c0.tables["emb_b"] == 3 and c0.tensors == {"w": 6}
    c0.close()
    c1.close()


def test_declare_tables_refused(cluster):
    cl = cluster(shards=1, workers=1, tables={"yaml_t": 2})
    with ps.Client(cl.path, 0) as c:
        with pytest.raises(ps.ConfigError, match="unknown key 'dims'"):
            c.declare_tables([{"name": "t", "dims": 4}])
        with pytest.raises(ps.ConfigError, match="dim is 0, expected an integer in 1..4096"):
            c.declare_tables([{"name": "t", "dim": 0}])
        with pytest.raises(ps.ConfigError, match="optimizer 'rmsprop'"):
            c.declare_tables([{"name": "t", "dim": 4, "optimizer": "rmsprop"}])
        with pytest.raises(ps.ConfigError, match="'yaml_t' is a table of"):
            c.declare_tables([{"name": "yaml_t", "dim": 2}])
        with pytest.raises(ps.ConfigError, match="scale is not used by init 'zeros'"):
            c.declare_tables([{"name": "t", "dim": 2, "init": "zeros", "scale": 1.0}])
        with pytest.raises(ps.ConfigError, match=r"lr is -1, expected a number in \(0, "):
            c.declare_tables([{"name": "t", "dim": 2, "lr": -1}])
        with pytest.raises(ps.TooBigError):
            c.declare_tables([{"name": f"t{i}", "dim": 1} for i in range(64)])
        c.declare_tables({"name": "t", "dim": 2})  # one dict: one table
        assert c.tables == {"yaml_t": 2, "t": 2}
        out = c.pull_rows("t", IDS[:3])
        assert out.shape == (3, 2) and (np.abs(out) <= 0.01).all()  # uniform(0.01)
