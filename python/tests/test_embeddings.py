"""ps.torch.Embedding / EmbeddingBag / Prefetch against real shards.

The module's gradient equals torch.nn.EmbeddingBag's for the same weights
and ids (sum, mean, max, repeated ids, empty bags, per-sample weights), the
pooling over the module's distinct-id mapping passes gradcheck, integer
gradients from several workers leave every row at its exact sum, a model
mixing tables and dense layers trains under one DistributedOptimizer, and
sync training gives bit-identical weights with and without Prefetch.
"""
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (Debian: python3-torch)")
import ps  # noqa: E402
from ps import _ps  # noqa: E402
import ps.torch as pst  # noqa: E402
from conftest import in_threads  # noqa: E402

F = torch.nn.functional
MODEL_LOCK = threading.Lock()
torch.set_num_threads(1)
DIM, V = 4, 50


def table_cluster(cluster, workers=1, init="uniform", optimizer="sgd", lr=1.0, mode="sync"):
    # a config with a table and no dense model: the dense part is declared
    cl = cluster(shards=2, workers=workers, mode=mode, declare=True,
                 tables={"t": DIM})
    with open(cl.path) as f:
        text = f.read()
    text = text.replace(
        "init: zeros, optimizer: sgd, lr: 1",
        f"init: {init}{', scale: 0.5' if init != 'zeros' else ''}, optimizer: {optimizer}, "
        f"lr: {lr}")
    with open(cl.path, "w") as f:
        f.write(text)
    for k in range(len(cl.procs)):      # restart with the edited table
        cl.stop(k)
        cl.start(k)
    return cl


class Tiny(torch.nn.Module):
    def __init__(self, client, mode="sum", seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = pst.EmbeddingBag("t", mode=mode, client=client)
        self.fc = torch.nn.Linear(DIM, 1)

    def forward(self, ids, offsets=None, psw=None):
        return self.fc(self.emb(ids, offsets, psw))


CASES = {
    "sum-repeats-empty": ("sum", [3, 7, 3, 3, 9, 7], [0, 2, 2, 5], None),
    "mean-repeats-empty": ("mean", [3, 7, 3, 3, 9, 7], [0, 2, 2, 5], None),
    "max": ("max", [1, 2, 3, 2, 1], [0, 3], None),
    "sum-weights": ("sum", [4, 4, 5, 6], [0, 1], [0.5, 2.0, -1.0, 3.0]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_gradient_equals_torch_embedding_bag(cluster, case):
    mode, ids, offsets, psw = CASES[case]
    cl = table_cluster(cluster)
    c = ps.Client(cl.path, 0)
    model = Tiny(c, mode)
    opt = pst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   model.named_parameters(), client=c, model=model, op=pst.Sum)
    # torch's own module over the same weights: every row of the table
    ref = torch.nn.EmbeddingBag(V, DIM, mode=mode)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(c.pull_rows("t", np.arange(V))))
    ids_t, off_t = torch.tensor(ids), torch.tensor(offsets)
    psw_t = torch.tensor(psw) if psw else None
    out = model.emb(ids_t, off_t, psw_t)
    want = ref(ids_t, off_t, per_sample_weights=psw_t)
    torch.testing.assert_close(out, want)
    up = torch.randn(out.shape)
    (out * up).sum().backward()
    (want * up).sum().backward()
    (u, g), = opt._rowgrads["t"]
    assert sorted(u) == sorted(set(ids)) and len(u) == len(set(ids))
    torch.testing.assert_close(torch.from_numpy(g), ref.weight.grad[torch.from_numpy(u)])
    assert ref.weight.grad[[i for i in range(V) if i not in ids]].abs().sum() == 0
    opt.synchronize()
    opt.step()
    c.close()


def test_pooling_over_the_distinct_ids_gradcheck():
    ids = torch.tensor([5, 1, 5, 9, 1, 1])
    offsets = torch.tensor([0, 2, 2, 4])
    u, inv = pst.EmbeddingBag._unique(ids)
    w = torch.randn(10, 3, dtype=torch.float64, requires_grad=True)
    for mode in ("sum", "mean"):
        def via_rows(rows):
            return F.embedding_bag(inv, rows, offsets, mode=mode)
        rows = w.detach()[torch.from_numpy(u)].clone().requires_grad_()
        assert torch.autograd.gradcheck(via_rows, (rows,))
        torch.testing.assert_close(via_rows(rows), F.embedding_bag(ids, w, offsets, mode=mode))


@pytest.mark.parametrize("declared", [False, True], ids=["yaml-table", "declared-table"])
def test_integer_gradients_from_three_workers_exact(cluster, declared):
    """zeros, sgd lr 1, op=Sum: after one step each row is minus the sum of
    every worker's integer gradient for it; the table from the YAML, or
    declared at run time by the modules' dim= and options."""
    if declared:
        cl = cluster(shards=2, workers=3, declare=True)
    else:
        cl = table_cluster(cluster, workers=3, init="zeros")
    want = np.zeros((V, DIM), np.float64)
    ids_of = {r: np.array([r, 7, 7, 11 + r, 7, 30], np.int64) for r in range(3)}
    coef = {r: torch.arange(1, 7, dtype=torch.float32).unsqueeze(1) * (r + 1) for r in range(3)}
    for r in range(3):
        for i, k in zip(ids_of[r], coef[r][:, 0].tolist()):
            want[i] -= k

    def run(rank):
        c = ps.Client(cl.path, rank)
        emb = pst.Embedding("t", client=c, **(dict(dim=DIM, init="zeros", optimizer="sgd",
                                                   lr=1.0) if declared else {}))
        model = torch.nn.ModuleDict({"emb": emb, "fc": torch.nn.Linear(1, 1)})
        opt = pst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                       model.named_parameters(), client=c, model=model,
                                       op=pst.Sum)
        opt.zero_grad()
        out = emb(torch.from_numpy(ids_of[rank]))
        ((out * coef[rank]).sum() + 0 * model["fc"].weight.sum()).backward()
        opt.step()
        c.close()
    in_threads(run, range(3), 60)
    with ps.Client(cl.path, 0) as c:
        if declared:   # a new client knows a declared table once it declares it too
            c.declare_tables([{"name": "t", "dim": DIM, "init": "zeros", "optimizer": "sgd",
                               "lr": 1.0}])
        got = c.pull_rows("t", np.arange(V), min_version=1)
    np.testing.assert_array_equal(got, want.astype(np.float32))


def train(path, rank, steps, prefetch, out, seed=0):
    c = ps.Client(path, rank)
    with MODEL_LOCK:   # torch.manual_seed is the process's, not the thread's
        model = Tiny(c, "mean", seed)
    opt = pst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   model.named_parameters(), client=c, model=model)
    g = torch.Generator().manual_seed(100 + rank)
    batches = [(torch.randint(0, V, (24,), generator=g), torch.randn(6, 1, generator=g))
               for _ in range(steps)]
    offsets = torch.arange(0, 24, 4)
    it = pst.Prefetch(batches, lambda b: {model.emb: b[0]}) if prefetch else batches
    for ids, y in it:
        opt.zero_grad()
        F.mse_loss(model(ids, offsets), y).backward()
        opt.step()
    out[rank] = ({n: p.detach().clone() for n, p in model.named_parameters()},
                 c.pull_rows("t", np.arange(V)))
    c.close()


def test_prefetch_gives_the_same_training(cluster):
    results = []
    for prefetch in (False, True):
        cl = table_cluster(cluster, workers=2, optimizer="adagrad", lr=0.1)
        out = {}
        in_threads(lambda r: train(cl.path, r, 12, prefetch, out), (0, 1))
        results.append(out)
    (d0, r0), (d1, r1) = results[0][0], results[1][0]
    np.testing.assert_array_equal(r0, r1)
    for n in d0:
        assert torch.equal(d0[n], d1[n]), n
    assert np.abs(r0).sum() > 0


def test_embedding_without_optimizer_refused(cluster):
    cl = table_cluster(cluster)
    c = ps.Client(cl.path, 0)
    emb = pst.EmbeddingBag("t", client=c)
    with pytest.raises(ps.StateError, match="part of no DistributedOptimizer"):
        emb(torch.tensor([[1, 2]]))
    emb.eval()
    assert emb(torch.tensor([[1, 2]])).shape == (1, DIM)
    with pytest.raises(ps.ConfigError, match=r"no embedding table 'x'.*model.embeddings: t"):
        pst.Embedding("x", client=c)
    with pytest.raises(ValueError, match=">= 0"):
        emb(torch.tensor([[1, -2]]))
    c.close()


def test_export_round_trip_same_auc(cluster, tmp_path):
    """The DLRM example's model trained through the shards, checkpointed,
    the shards stopped, ps-export, the export loaded into plain PyTorch
    (the same model with a torch embedding over the exported rows and the
    exported dense tensors): the held-out AUC equals the live model's to
    1e-6 (a zeros-initialised table: an id the export lacks reads as zeros
    there and as its initial value, zeros, on the shards)."""
    import os
    import subprocess
    import sys
    from conftest import ROOT
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from criteo import auc, load
    from dlrm_criteo import DLRM
    gen = os.path.join(ROOT, "bin", "ps-ctrgen")
    train, test = str(tmp_path / "train.tsv"), str(tmp_path / "test.tsv")
    subprocess.run([gen, "--out", train, "--samples", "8192", "--scale", "0.001", "--seed", "2"],
                   check=True, capture_output=True)
    subprocess.run([gen, "--out", test, "--samples", "2000", "--skip", "8192", "--scale", "0.001",
                    "--seed", "2"], check=True, capture_output=True)
    ck = tmp_path / "ck"
    ck.mkdir()
    cl = cluster(shards=2, workers=1, declare=True, tables={"cat": 16},
                 extra=["checkpoint:", f"  dir: {ck}", "  on_request: true",
                        "  min_interval_s: 0"])
    c = ps.Client(cl.path, 0)
    torch.manual_seed(0)
    model = DLRM(emb=pst.Embedding("cat", client=c))
    opt = pst.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-3),
                                   model.named_parameters(), client=c, model=model)
    y, dense, cats = load(train)
    for s in range(0, len(y), 512):
        opt.zero_grad()
        F.binary_cross_entropy_with_logits(model(torch.from_numpy(dense[s:s + 512]),
                                                 cats[s:s + 512]),
                                           torch.from_numpy(y[s:s + 512])).backward()
        opt.step()
    opt.checkpoint()
    ty, tdense, tcats = load(test)
    model.eval()
    with torch.no_grad():
        live = torch.sigmoid(model(torch.from_numpy(tdense), tcats)).numpy()
    c.close()
    for k in range(2):
        assert cl.stop(k) == 0
    out = str(tmp_path / "model.npz")
    p = subprocess.run([os.path.join(ROOT, "bin", "ps-export"), "--config", cl.path, "--out",
                        out], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    exp = ps.load_export(out)
    lk = ps.export_lookup(exp, "cat")
    weight = torch.from_numpy(lk.weight)

    class Exported(torch.nn.Module):
        def forward(self, ids):
            return F.embedding(torch.from_numpy(lk.index(ids).astype(np.int64)), weight)
    plain = DLRM(emb=Exported())
    plain.load_state_dict({n: torch.from_numpy(exp.dense[n]) for n, _ in
                           plain.named_parameters()}, strict=False)
    plain.eval()
    with torch.no_grad():
        served = torch.sigmoid(plain(torch.from_numpy(tdense), tcats)).numpy()
    np.testing.assert_allclose(served, live, rtol=0, atol=1e-6)
    assert abs(auc(ty, served) - auc(ty, live)) <= 1e-6
    assert auc(ty, live) > 0.55   # it learned something (16 steps)


@pytest.mark.parametrize("n,high,dtype", [(0, 10, np.int64), (1, 10, np.int64),
                                         (26624, 100000, np.int64), (5000, 7, np.int64),
                                         (3000, 2**64 - 1, np.uint64)])
def test_unique_ids_against_numpy(n, high, dtype):
    """The extension's hashing unique: the same distinct ids as np.unique,
    in first-occurrence order, and ids == u[inv] at every position."""
    rng = np.random.default_rng(n)
    ids = rng.integers(0, high, n, dtype=dtype, endpoint=dtype is np.uint64)
    if n > 3 and dtype is np.uint64:
        ids[:3] = [0, 2**64 - 1, 2**63]   # the extremes hash like the rest
    u, inv = np.empty(n, dtype), np.empty(n, np.int64)
    k = _ps.unique_ids(ids, u, inv)
    assert k == len(np.unique(ids))
    assert np.array_equal(np.sort(u[:k]), np.unique(ids))
    assert np.array_equal(u[:k][inv], ids)
    first = {}
    for i, x in enumerate(ids.tolist()):
        first.setdefault(x, i)
    assert u[:k].tolist() == sorted(first, key=first.get)


def test_unique_ids_refusals():
    u, inv = np.empty(4, np.int64), np.empty(4, np.int64)
    with pytest.raises(ps.ArrayError, match=r"ids\[2\] = -5"):
        _ps.unique_ids(np.array([1, 2, -5], np.int64), u, inv)
    with pytest.raises(ps.ArrayError, match="int64 expected"):
        _ps.unique_ids(np.array([1, 2], np.float64), u, inv)
    with pytest.raises(ps.ArrayError, match="at least 6 elements"):
        _ps.unique_ids(np.arange(6, dtype=np.int64), u, inv)
    with pytest.raises(ValueError, match=">= 0"):
        pst.EmbeddingBag._unique(torch.tensor([3, -1]))
