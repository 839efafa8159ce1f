"""Client.declare: the model's tensors declared at run time, against real
shards started from a config without a model (server/declare.c).

Rank 0's declaration creates the tensors with its arrays' values and every
other rank's arrays are overwritten with them; the declared tensors are then
pushed and pulled by name; a differing declaration is refused naming both
sides; a restarted worker, and workers after a shard restarted from its
checkpoint, continue from the shards' weights; bad arguments are refused.
"""
import signal
import threading

import numpy as np
import pytest

import ps


def model(base):
    """w [3, 4], b [4], s a 0-d scalar: rank 0's values with base 0."""
    return {"w": np.arange(12, dtype=np.float32).reshape(3, 4) + base,
            "b": np.full(4, -2.0, np.float32) + base,
            "s": np.array(5.0 + base, np.float32)}


def assert_model(m, minus):
    want = model(0)
    for k in want:
        np.testing.assert_array_equal(m[k], want[k] - minus, err_msg=k)


def declare_both(path):
    """Ranks 0 and 1 declare at the same time (rank 1 with other values)."""
    c0, c1 = ps.Client(path, 0), ps.Client(path, 1)
    m0, m1 = model(0), model(100)
    err = []

    def rank1():
        try:
            c1.declare(m1)
        except Exception as e:  # noqa: BLE001  (re-raised below)
            err.append(e)
    t = threading.Thread(target=rank1)
    t.start()
    c0.declare(m0)
    t.join()
    assert not err, err
    return c0, m0, c1, m1


def step(c0, m0, c1, m1):
    """Both push ones (sync, SGD lr 1: every weight moves by 2), then pull."""
    for c, m in ((c0, m0), (c1, m1)):
        c.push({k: np.ones_like(v) for k, v in m.items()})
    for c, m in ((c0, m0), (c1, m1)):
        c.pull(m)


def test_declare_and_train(cluster):
    cl = cluster(shards=2, workers=2, declare=True)
    cfg = ps.Config(cl.path)
    assert cfg.declared and cfg.tensors == {}
    c0, m0, c1, m1 = declare_both(cl.path)
    assert_model(m0, 0)
    assert_model(m1, 0)  # rank 1 starts from rank 0's values
    assert c1.tensors == {"w": 12, "b": 4, "s": 1}
    step(c0, m0, c1, m1)
    assert_model(m0, 2)
    assert_model(m1, 2)
    with pytest.raises(ps.StateError, match="declared its tensors already"):
        c0.declare(m0)

    # rank 1 restarted: a differing model is refused naming both sides
    c1.close()
    bad = model(7)
    bad["b"] = np.zeros(5, np.float32)
    c1 = ps.Client(cl.path, 1)
    with pytest.raises(ps.ConfigError, match=r"the shard has b\[4\], this worker declares b\[5\]"):
        c1.declare(bad)
    assert (bad["w"] == model(7)["w"]).all()  # left alone
    c1.close()
    # the same model in another order is another model
    c1 = ps.Client(cl.path, 1)
    with pytest.raises(ps.ConfigError, match=r"at #0: the shard has w\[3,4\], this worker "
                                             r"declares b\[4\]"):
        c1.declare([("b", m1["b"].copy()), ("w", m1["w"].copy()), ("s", m1["s"].copy())])
    c1.close()
    # and the same model continues from the shards' weights
    c1 = ps.Client(cl.path, 1)
    m1 = model(50)
    c1.declare(m1)
    assert_model(m1, 2)
    assert c1.clock() == 1
    step(c0, m0, c1, m1)
    assert_model(m0, 4)
    assert_model(m1, 4)
    c0.close()
    c1.close()


def test_declared_shard_restarts_from_checkpoint(cluster, tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    cl = cluster(shards=2, workers=2, declare=True,
                 extra=["checkpoint:", f"  dir: {ck}", "  on_request: true",
                        "  min_interval_s: 0"])
    c0, m0, c1, m1 = declare_both(cl.path)
    step(c0, m0, c1, m1)
    assert all(s["checkpoint_status"] == 0 for s in c0.checkpoint())
    c0.close()
    c1.close()
    assert cl.stop(1, signal.SIGKILL) == -signal.SIGKILL
    cl.start(1)
    # rank 1 first: the restarted shard has the tensors without rank 0
    c1 = ps.Client(cl.path, 1)
    m1 = model(50)
    c1.declare(m1)
    assert_model(m1, 2)
    c1.close()


def test_declare_refusals(cluster):
    cl = cluster(shards=1, workers=1, declare=True)
    c = ps.Client(cl.path, 0)
    with pytest.raises(ps.ArrayError, match="parameter 'w'.*float32"):
        c.declare({"w": np.zeros(3, np.float64)})
    with pytest.raises(ps.ArrayError, match="parameter 'w'"):
        c.declare({"w": np.zeros((4, 4), np.float32)[:, 1]})  # not contiguous
    with pytest.raises(ps.TooBigError, match="0 parameters given"):
        c.declare({})
    with pytest.raises(ps.Error, match="not a str"):
        c.declare([(3, np.zeros(3, np.float32))])
    with pytest.raises(ps.Error, match="declared twice"):
        c.declare([("a", np.zeros(3, np.float32)), ("a", np.zeros(3, np.float32))])
    with pytest.raises(ps.Error, match="a dict"):
        c.declare(5)
    # nothing was declared by those: a good declaration still works
    m = {"a": np.arange(6, dtype=np.float32).reshape(2, 3)}
    c.declare(m)
    assert c.tensors == {"a": 6}
    np.testing.assert_array_equal(m["a"], np.arange(6, dtype=np.float32).reshape(2, 3))
    c.close()
    # a monitor may not declare
    with ps.Client(cl.path, monitor=True) as mon:
        with pytest.raises(ps.Error, match="only a worker may declare"):
            mon.declare({"a": np.zeros(6, np.float32)})


def test_declare_with_a_model_in_the_config(cluster):
    cl = cluster(shards=1, workers=1)
    assert not ps.Config(cl.path).declared
    with ps.Client(cl.path, 0) as c:
        with pytest.raises(ps.ConfigError, match="names its model"):
            c.declare({"a": np.zeros(3000, np.float32)})
