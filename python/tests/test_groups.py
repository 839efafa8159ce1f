"""Client.declare with optimizer groups and Client.set_lr, against real
shards (server/declare.c, server/optimizer.c): the shards apply each
group's torch.optim rule to the mean of the workers' gradients with the
learning rate set for each step, equal to torch.optim run locally on that
mean; a worker whose groups differ is refused naming the field; bad groups
and learning rates are refused.
"""
import threading

import numpy as np
import pytest

import ps

try:
    import torch
except ImportError:  # pragma: no cover - Debian's python3-torch is installed here
    torch = None

# One tensor per kind, each its own group (torch's param_group settings).
GROUPS = [
    dict(kind="sgd", lr=0.1, momentum=0.9, dampening=0.25, weight_decay=0.01),
    dict(kind="sgd", lr=0.05, momentum=0.8, nesterov=True),
    dict(kind="adam", lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.02),
    dict(kind="adamw", lr=0.01, weight_decay=0.1),
    dict(kind="adagrad", lr=0.1, lr_decay=0.05, initial_accumulator_value=0.2,
         weight_decay=0.01),
    dict(kind="sgd", lr=0.2),
]
NAMES = ["sgd_damp", "sgd_nest", "adam", "adamw", "adagrad", "sgd_plain"]
SHAPES = [(3, 5), (7,), (4, 4), (9,), (2, 3), (6,)]
STEPS = 5


def init_values():
    rng = np.random.default_rng(1)
    return {n: rng.uniform(-1, 1, s).astype(np.float32) for n, s in zip(NAMES, SHAPES)}


def grads(rank, step):
    """Each rank's gradient of step (different per rank, so the mean matters)."""
    rng = np.random.default_rng(100 * step + rank + 7)
    return {n: rng.normal(0, 1, s).astype(np.float32) for n, s in zip(NAMES, SHAPES)}


def lr_at(g, step):
    """The schedule: every group's lr decays by 0.7 per step."""
    return GROUPS[g]["lr"] * 0.7 ** step


def declare_two(path, groups=GROUPS):
    c0, c1 = ps.Client(path, 0), ps.Client(path, 1)
    m0, m1 = init_values(), {n: np.zeros(s, np.float32) for n, s in zip(NAMES, SHAPES)}
    err = []

    def rank1():
        try:
            c1.declare(m1, groups, list(range(len(NAMES))))
        except Exception as e:  # noqa: BLE001  (re-raised below)
            err.append(e)
    t = threading.Thread(target=rank1)
    t.start()
    c0.declare(m0, groups, list(range(len(NAMES))))
    t.join()
    assert not err, err
    return c0, m0, c1, m1


def torch_reference(steps):
    """torch.optim on the mean gradient, one optimizer per group."""
    params = {n: torch.nn.Parameter(torch.from_numpy(v.copy()))
              for n, v in init_values().items()}
    opts = []
    for n, g in zip(NAMES, GROUPS):
        kw = {k: v for k, v in g.items() if k != "kind"}
        if g["kind"] == "adagrad":
            kw["initial_accumulator_value"] = kw.pop("initial_accumulator_value")
        cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW,
               "adagrad": torch.optim.Adagrad}[g["kind"]]
        opts.append(cls([params[n]], **kw))
    for step in range(steps):
        g0, g1 = grads(0, step), grads(1, step)
        for i, (n, opt) in enumerate(zip(NAMES, opts)):
            for pg in opt.param_groups:
                pg["lr"] = lr_at(i, step)
            params[n].grad = torch.from_numpy((g0[n] + g1[n]) / np.float32(2))
            opt.step()
    return {n: p.detach().numpy() for n, p in params.items()}


def test_groups_match_torch(cluster):
    if torch is None:
        print("torch is not importable: the comparison with torch.optim is skipped")
        pytest.skip("torch is not importable")
    cl = cluster(shards=2, workers=2, declare=True)
    c0, m0, c1, m1 = declare_two(cl.path)
    for step in range(STEPS):
        for rank, (c, m) in enumerate(((c0, m0), (c1, m1))):
            for g in range(len(GROUPS)):
                c.set_lr(g, lr_at(g, step))
            c.push(grads(rank, step))
        for c, m in ((c0, m0), (c1, m1)):
            c.pull(m)
    want = torch_reference(STEPS)
    for n in NAMES:
        np.testing.assert_array_equal(m0[n], m1[n], err_msg=n)
        rel = np.max(np.abs(m0[n] - want[n]) / np.maximum(np.abs(want[n]), 1e-3))
        print(f"{n}: max relative error {rel:.3g} against torch {torch.__version__}")
        assert rel <= 1e-5, (n, rel, m0[n], want[n])
    c0.close()
    c1.close()


def test_groups_reduce_is_the_mean(cluster):
    cl = cluster(shards=1, workers=2, declare=True)
    c0, c1 = ps.Client(cl.path, 0), ps.Client(cl.path, 1)
    m0, m1 = {"g": np.zeros(5, np.float32)}, {"g": np.zeros(5, np.float32)}
    t = threading.Thread(target=c1.declare, args=(m1, [dict(kind="reduce")]))
    t.start()
    c0.declare(m0, [dict(kind="reduce")])
    t.join()
    c0.push({"g": np.arange(5, dtype=np.float32)})
    c1.push({"g": np.full(5, 3.0, np.float32)})
    c0.pull(m0)
    np.testing.assert_array_equal(m0["g"], (np.arange(5, dtype=np.float32) + 3) / 2)
    c0.close()
    c1.close()


def test_groups_refused(cluster):
    cl = cluster(shards=1, workers=2, declare=True)
    c0, m0, c1, m1 = declare_two(cl.path)
    with pytest.raises(ps.Error, match="optimizer group 9"):
        c0.set_lr(9, 0.1)
    with pytest.raises(ps.Error, match="learning rate nan"):
        c0.set_lr(0, float("nan"))
    with pytest.raises(ps.Error, match="learning rate -1"):
        c0.set_lr(0, -1.0)
    c1.close()
    # a worker whose groups differ: refused naming the group, field and both values
    other = [dict(g) for g in GROUPS]
    other[2]["betas"] = (0.9, 0.99)
    c1 = ps.Client(cl.path, 1)
    with pytest.raises(ps.ConfigError, match=r"optimizer group 2: beta1 is 0.8 on the shard, "
                       r"0.9 in this declaration"):
        c1.declare({n: np.zeros(s, np.float32) for n, s in zip(NAMES, SHAPES)}, other,
                   list(range(len(NAMES))))
    c1.close()
    c1 = ps.Client(cl.path, 1)
    with pytest.raises(ps.ConfigError, match="unknown key 'momentun'"):
        c1.declare(m1, [dict(kind="sgd", momentun=0.9)])
    with pytest.raises(ps.ConfigError, match="kind 'rmsprop'"):
        c1.declare(m1, [dict(kind="rmsprop")])
    with pytest.raises(ps.Error, match="optimizer group 7, expected 0..5"):
        c1.declare(m1, GROUPS, [0, 1, 2, 3, 4, 7])
    with pytest.raises(ps.ConfigError, match="beta2 is 1"):
        c1.declare(m1, [dict(kind="adam", betas=(0.9, 1.0))])
    c0.close()
    c1.close()
