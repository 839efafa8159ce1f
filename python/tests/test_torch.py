"""ps.torch.DistributedOptimizer against real shards (python/ps/torch.py).

Equivalence: N workers of batch b in BSP give the parameters one process
gets running the unwrapped torch.optim optimizer on batch N*b (the same
schedule, the same parameter groups), within 1e-5 relative after 20 steps.
Also: SSP's staleness bound as the pulled weights show it, the declaration
(a differing model refused, a killed worker restarted, a shard restarted
from its checkpoint), buffers, and each misuse guard's message.

The workers of the equivalence tests are threads of this process, each with
its own ps.Client, model and optimizer (the shards are real processes);
the restart tests run workers as processes (torchworker.py) so they can be
killed.
"""
import os
import signal
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (Debian: python3-torch)")
import ps  # noqa: E402
import ps.torch as pst  # noqa: E402
from conftest import in_threads  # noqa: E402

torch.set_num_threads(1)
HERE = os.path.dirname(__file__)
TORCHWORKER = [sys.executable, os.path.join(HERE, "torchworker.py")]
STEPS, BATCH, NIN, NHID, NOUT = 20, 8, 12, 16, 5


def make_model(seed=1):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(NIN, NHID), torch.nn.Tanh(),
                               torch.nn.Linear(NHID, NOUT))


def data(nworkers, seed=7):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(STEPS, nworkers * BATCH, NIN, generator=g)
    y = torch.randint(0, NOUT, (STEPS, nworkers * BATCH), generator=g)
    return x, y


def make_optimizer(model, spec):
    """spec: (kind, kwargs, groups?, schedule)."""
    kind, kw, two_groups, _ = spec
    if two_groups:   # biases without weight decay, at half the learning rate
        decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
        plain = [p for n, p in model.named_parameters() if n.endswith("bias")]
        params = [{"params": decay},
                  {"params": plain, "weight_decay": 0.0, "lr": kw["lr"] / 2}]
    else:
        params = model.parameters()
    return getattr(torch.optim, kind)(params, **kw)


def make_schedule(opt, spec):
    if spec[3] == "step":
        return torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    if spec[3] == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)
    return None


def reference(spec, nworkers):
    """One process, plain torch, batch nworkers * BATCH."""
    model = make_model()
    opt = make_optimizer(model, spec)
    sched = make_schedule(opt, spec)
    x, y = data(nworkers)
    for s in range(STEPS):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[s]), y[s]).backward()
        opt.step()
        if sched:
            sched.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def worker(path, rank, nworkers, spec, model, out, mode="server", clip=None, **kw):
    c = ps.Client(path, rank)
    opt = pst.DistributedOptimizer(make_optimizer(model, spec),
                                   named_parameters=model.named_parameters(), client=c,
                                   mode=mode, **kw)
    sched = make_schedule(opt, spec)
    x, y = data(nworkers)
    part = slice(rank * BATCH, (rank + 1) * BATCH)
    for s in range(STEPS):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[s][part]), y[s][part]).backward()
        if clip:
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
        if sched:
            sched.step()
    out[rank] = {n: p.detach().clone() for n, p in model.named_parameters()}
    c.close()


def run_workers(path, nworkers, spec, **kw):
    out = {}
    # made here: torch.manual_seed is the process's, not the thread's;
    # rank 0's values win, the others' are overwritten by the declaration
    models = [make_model(seed=1 if r == 0 else 100 + r) for r in range(nworkers)]
    in_threads(lambda r: worker(path, r, nworkers, spec, models[r], out, **kw), range(nworkers))
    assert len(out) == nworkers
    return out


def relerr(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def declared_cluster(cluster, shards=2, workers=2, mode="sync", **kw):
    return cluster(shards=shards, workers=workers, mode=mode, declare=True, **kw)


SPECS = {
    "sgd-momentum-wd-step": ("SGD", {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3}, False,
                             "step"),
    "sgd-nesterov-dampening-2groups": ("SGD", {"lr": 0.1, "momentum": 0.8, "nesterov": True,
                                               "weight_decay": 1e-3}, True, "cosine"),
    "sgd-dampening": ("SGD", {"lr": 0.05, "momentum": 0.9, "dampening": 0.3}, False, "step"),
    "adam-wd-cosine": ("Adam", {"lr": 0.01, "weight_decay": 1e-3}, False, "cosine"),
    "adamw-2groups-step": ("AdamW", {"lr": 0.01, "weight_decay": 0.05, "betas": (0.8, 0.99)},
                           True, "step"),
    "adagrad-2groups": ("Adagrad", {"lr": 0.1, "lr_decay": 0.01, "weight_decay": 1e-3,
                                    "initial_accumulator_value": 0.1}, True, "cosine"),
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_equivalent_to_one_process_on_the_combined_batch(cluster, name):
    spec = SPECS[name]
    cl = declared_cluster(cluster)
    ref = reference(spec, 2)
    # small buckets: several pushes and per-bucket pulls per step
    got = run_workers(cl.path, 2, spec, bucket_bytes=256)
    start = {n: p.detach() for n, p in make_model().named_parameters()}
    for r in (0, 1):
        for n, want in ref.items():
            assert relerr(got[r][n], want) <= 1e-5, (name, r, n, relerr(got[r][n], want))
            assert relerr(start[n], want) > 1e-3, (name, n, "did not train")


def make_conv(seed=1):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, NOUT)
                               ).to(memory_format=torch.channels_last)


def test_channels_last_conv_model_equivalent(cluster):
    """A conv model kept channels-last (what the cnn example's --channels-last
    and make bench-pytorch use): its gradients are not C-contiguous, so the
    wrapper pushes a copy; the weights it writes back keep the layout, and
    2 workers equal one process on the combined batch, as for the MLP."""
    spec = SPECS["sgd-momentum-wd-step"]
    g = torch.Generator().manual_seed(7)
    x = torch.randn(STEPS, 2 * BATCH, 2, 6, 6, generator=g)
    y = torch.randint(0, NOUT, (STEPS, 2 * BATCH), generator=g)

    def train(model, opt, sched, part):
        for s in range(STEPS):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[s][part]), y[s][part]).backward()
            opt.step()
            sched.step()

    ref = make_conv()
    opt = make_optimizer(ref, spec)
    train(ref, opt, make_schedule(opt, spec), slice(None))
    cl = declared_cluster(cluster)
    models = [make_conv(seed=1 if r == 0 else 100 + r) for r in range(2)]
    out = {}

    def run(rank):
        c = ps.Client(cl.path, rank)
        model = models[rank]
        opt = pst.DistributedOptimizer(make_optimizer(model, spec), client=c,
                                       named_parameters=model.named_parameters())
        train(model, opt, make_schedule(opt, spec), slice(rank * BATCH, (rank + 1) * BATCH))
        out[rank] = model
        c.close()
    in_threads(run, range(2))
    start = make_conv()
    for r in (0, 1):
        conv = out[r][0].weight
        assert conv.is_contiguous(memory_format=torch.channels_last), (r, conv.stride())
        assert not conv.is_contiguous(), (r, "the test's premise: a non-C-contiguous weight")
        for (n, got), want, first in zip(out[r].named_parameters(), ref.parameters(),
                                        start.parameters()):
            assert relerr(got.detach(), want.detach()) <= 1e-5, (r, n)
            assert relerr(first.detach(), want.detach()) > 1e-3, (n, "did not train")


def test_local_mode_with_clipping_equals_one_process(cluster):
    """mode='local': the shards average the gradients; synchronize() gives
    them to clip_grad_norm_ before the wrapped optimizer's step."""
    spec = ("RMSprop", {"lr": 0.01}, False, "step")   # not mappable to the shards: local runs it
    cl = declared_cluster(cluster)
    got = run_workers(cl.path, 2, spec, mode="local", clip=0.5)
    model = make_model()
    opt = make_optimizer(model, spec)
    sched = make_schedule(opt, spec)
    x, y = data(2)
    for s in range(STEPS):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[s]), y[s]).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        sched.step()
    for n, p in model.named_parameters():
        for r in (0, 1):
            assert relerr(got[r][n], p.detach()) <= 1e-5, (r, n)


def test_backward_passes_per_step_accumulates_locally(cluster):
    """backward_passes_per_step=2: each worker's two half batches (loss
    halved, as one accumulates in plain torch) are pushed once: the same
    parameters as one process on the combined batch."""
    spec = SPECS["sgd-momentum-wd-step"]
    cl = declared_cluster(cluster)
    ref = reference(spec, 2)
    out = {}
    models = [make_model(1), make_model(5)]

    def run(rank):
        c = ps.Client(cl.path, rank)
        model = models[rank]
        opt = pst.DistributedOptimizer(make_optimizer(model, spec), model.named_parameters(),
                                       client=c, backward_passes_per_step=2)
        sched = make_schedule(opt, spec)
        x, y = data(2)
        for s in range(STEPS):
            opt.zero_grad()
            for h in (0, 1):
                lo = rank * BATCH + h * BATCH // 2
                part = slice(lo, lo + BATCH // 2)
                loss = torch.nn.functional.cross_entropy(model(x[s][part]), y[s][part])
                (loss / 2).backward()
            opt.step()
            sched.step()
        out[rank] = {n: p.detach().clone() for n, p in model.named_parameters()}
        c.close()
    in_threads(run, (0, 1), 120)
    for r in (0, 1):
        for n, want in ref.items():
            assert relerr(out[r][n], want) <= 1e-5, (r, n, relerr(out[r][n], want))


def test_compression_overrides_by_parameter_name(cluster):
    """compression.codec fp16 for every parameter but the one
    compression.tensors names (raw): the shards receive fp16 bytes for the
    others, raw float32 for it, and training matches the uncompressed
    reference to fp16's precision."""
    cl = declared_cluster(cluster, extra=["compression:", "  codec: fp16", "  lz4: off",
                                          "  tensors:", "    - {name: 2.bias, codec: none}"])
    spec = ("SGD", {"lr": 0.1, "momentum": 0.9}, False, None)
    got = run_workers(cl.path, 2, spec)
    ref = reference(spec, 2)
    for n, want in ref.items():
        assert relerr(got[0][n], want) < 1e-2, (n, relerr(got[0][n], want))
    with ps.Client(cl.path, monitor=True) as m:
        st = m.stats()
    raw = sum(s["push_raw_bytes"][0] for s in st)      # codec 0: none
    f16 = sum(s["push_raw_bytes"][1] for s in st)      # codec 1: fp16
    # 2.bias: 5 floats, 2 workers, STEPS clocks, raw; everything else fp16
    assert raw == 2 * STEPS * NOUT * 4, raw
    assert f16 == 2 * STEPS * 4 * (NIN * NHID + NHID + NHID * NOUT), f16
    wire16 = sum(s["push_wire_bytes"][1] for s in st)
    assert wire16 <= f16 // 2 + 1024 * len(st) * STEPS, (wire16, f16)


def test_batchnorm_buffers_averaged(cluster):
    """model=: BatchNorm's running mean and variance are averaged through
    the shards at the buffer steps and by sync_buffers(); the integer
    num_batches_tracked stays local."""
    cl = declared_cluster(cluster)
    torch.manual_seed(3)
    models = [torch.nn.Sequential(torch.nn.Linear(NIN, NHID), torch.nn.BatchNorm1d(NHID),
                                  torch.nn.Linear(NHID, NOUT)) for _ in (0, 1)]
    seen = {}

    def run(rank):
        c = ps.Client(cl.path, rank)
        model = models[rank]
        opt = pst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                       model.named_parameters(), client=c, model=model,
                                       buffers_every=3)
        x, y = data(2)
        bn = model[1]
        for s in range(5):
            opt.zero_grad()
            xs = x[s][rank * BATCH:(rank + 1) * BATCH] * (1 + 3 * rank)  # other statistics
            torch.nn.functional.cross_entropy(model(xs), y[s][:BATCH]).backward()
            before = bn.running_mean.clone()
            opt.step()
            seen[(rank, s)] = (before, bn.running_mean.clone())
        local = bn.running_var.clone()
        opt.sync_buffers()
        seen[(rank, "sync")] = (local, bn.running_var.clone())
        c.close()
    in_threads(run, (0, 1), 60)
    # clock 2 ends a buffer step (every 3): each worker's value becomes the mean
    b0, a0 = seen[(0, 2)]
    b1, a1 = seen[(1, 2)]
    assert not torch.allclose(b0, b1)
    torch.testing.assert_close(a0, (b0 + b1) / 2)
    torch.testing.assert_close(a1, a0)
    # other steps leave them alone
    assert torch.equal(seen[(0, 1)][0], seen[(0, 1)][1])
    l0, s0 = seen[(0, "sync")]
    l1, s1 = seen[(1, "sync")]
    torch.testing.assert_close(s0, (l0 + l1) / 2)
    torch.testing.assert_close(s1, s0)
    assert models[0][1].num_batches_tracked.item() == 5


def test_ssp_pulled_weights_within_the_staleness_bound(cluster):
    """Async, staleness 2, op=Sum, SGD lr 1 on loss = sum(w): every push
    moves w by -1, so 10 - w counts the updates a worker's pull saw. After
    its step t (t+1 pushes) a worker must have seen its own pushes and the
    other's first t+1-2 at least (the other sleeps to stretch the gap)."""
    cl = declared_cluster(cluster, shards=1, mode="async", consistency=["  staleness: 2"])
    seen = {0: [], 1: []}

    def run(rank):
        c = ps.Client(cl.path, rank)
        w = torch.nn.Parameter(torch.full((4,), 10.0))
        opt = pst.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), [("w", w)], client=c,
                                       op=pst.Sum)
        for _ in range(12):
            opt.zero_grad()
            w.sum().backward()
            opt.step()
            seen[rank].append(10.0 - float(w[0]))
            if rank == 1:
                time.sleep(0.05)
        c.close()
    in_threads(run, (0, 1), 60)
    for rank in (0, 1):
        for t, applied in enumerate(seen[rank]):
            # its own t+1 pushes, and the other's first t+1-2 at least
            bound = (t + 1) + max(0, t + 1 - 2)
            assert bound <= applied <= 24, (rank, t, applied, seen[rank])
    # worker 0 ran ahead of the sleeping worker 1, as far as the bound let it
    assert min(seen[0][t] - ((t + 1) + max(0, t - 1)) for t in range(12)) == 0, seen[0]
    assert any(seen[0][t] < 2 * (t + 1) for t in range(12)), seen[0]


# ---- declaration: refused, restarted ----

def test_differing_model_refused_naming_both(cluster):
    cl = declared_cluster(cluster)
    c0, c1 = ps.Client(cl.path, 0), ps.Client(cl.path, 1)
    m0 = make_model()
    pst.DistributedOptimizer(torch.optim.SGD(m0.parameters(), lr=0.1), m0.named_parameters(),
                             client=c0)
    m1 = torch.nn.Sequential(torch.nn.Linear(NIN, NHID + 1), torch.nn.Tanh(),
                             torch.nn.Linear(NHID + 1, NOUT))
    with pytest.raises(ps.ConfigError, match=r"the shard has 0.weight\[16,12\], this worker "
                       r"declares 0.weight\[17,12\]"):
        pst.DistributedOptimizer(torch.optim.SGD(m1.parameters(), lr=0.1), m1.named_parameters(),
                                 client=c1)
    c1.close()
    c1 = ps.Client(cl.path, 1)
    with pytest.raises(ps.ConfigError, match="momentum"):
        m2 = make_model()
        pst.DistributedOptimizer(torch.optim.SGD(m2.parameters(), lr=0.1, momentum=0.5),
                                 m2.named_parameters(), client=c1)


def torchworker(path, rank, steps, out, *extra):
    return subprocess.Popen(TORCHWORKER + [path, str(rank), str(steps), out] + list(extra),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def finish(p, timeout=90):
    out, _ = p.communicate(timeout=timeout)
    assert p.returncode == 0, out.decode(errors="replace")
    return out.decode()


def test_worker_killed_and_restarted_continues(cluster, tmp_path):
    """Worker 1 dies after 5 steps; worker 0 waits for it (drop_timeout
    long); the restarted worker 1 declares again, gets the shards' weights,
    goes on from clock 5, and both end on the same weights."""
    cl = declared_cluster(cluster, limits=["  drop_timeout_ms: 60000"])
    a = torchworker(cl.path, 0, 12, str(tmp_path / "w0.pt"))
    b = torchworker(cl.path, 1, 12, str(tmp_path / "w1.pt"), "--die-after", "5")
    out_b = b.communicate(timeout=90)[0].decode()
    assert b.returncode == -signal.SIGKILL, out_b
    b = torchworker(cl.path, 1, 12, str(tmp_path / "w1.pt"))
    out_b = finish(b)
    finish(a)
    assert "resumed at clock 5" in out_b, out_b
    w0, w1 = torch.load(tmp_path / "w0.pt"), torch.load(tmp_path / "w1.pt")
    for n in w0:
        assert torch.equal(w0[n], w1[n]), n


def test_cluster_restarted_from_checkpoints_resumes(cluster, tmp_path):
    """6 steps, opt.checkpoint() (rank 0 has every shard write its
    checkpoint; each rank saves its own part), every shard SIGKILLed and
    started again from its checkpoint, 4 more steps: the restarted cluster
    hands the workers the weights of clock 6, load_checkpoint() gives each
    rank its own part back, and the run ends bit-identical to a cluster
    that ran 10 steps uninterrupted (so the optimizer state came back too)."""
    ck = tmp_path / "ck"
    ck.mkdir()
    cl = declared_cluster(cluster, extra=["checkpoint:", f"  dir: {ck}",
                                          "  on_request: true", "  min_interval_s: 0"])
    procs = [torchworker(cl.path, r, 6, str(tmp_path / f"a{r}.pt"), "--checkpoint")
             for r in (0, 1)]
    for p in procs:
        finish(p)
    for k in (0, 1):
        cl.stop(k, signal.SIGKILL)
    for k in (0, 1):
        cl.start(k)
    procs = [torchworker(cl.path, r, 10, str(tmp_path / f"b{r}.pt"), "--save-start",
                         str(tmp_path / f"s{r}.pt"), "--load-local",
                         str(tmp_path / f"a{r}.pt.local")) for r in (0, 1)]
    outs = [finish(p) for p in procs]
    for r, o in enumerate(outs):
        assert "resumed at clock 6" in o, o
        assert f"local state [('epoch', 7), ('note', 'rank {r}')]" in o, o
    a0, s0 = torch.load(tmp_path / "a0.pt"), torch.load(tmp_path / "s0.pt")
    for n in a0:
        assert torch.equal(a0[n], s0[n]), n
    ref = declared_cluster(cluster)
    procs = [torchworker(ref.path, r, 10, str(tmp_path / f"r{r}.pt")) for r in (0, 1)]
    for p in procs:
        finish(p)
    b0, r0 = torch.load(tmp_path / "b0.pt"), torch.load(tmp_path / "r0.pt")
    for n in b0:
        assert torch.equal(b0[n], r0[n]), n


def test_misuse_guards(cluster):
    cl = declared_cluster(cluster, workers=1)
    c = ps.Client(cl.path, 0)
    model = make_model()
    with pytest.raises(ps.ConfigError, match=r"cannot apply torch.optim.rmsprop.RMSprop; "
                       r"supported: torch.optim.SGD"):
        pst.DistributedOptimizer(torch.optim.RMSprop(model.parameters(), lr=0.1),
                                 model.named_parameters(), client=c)
    with pytest.raises(ps.ConfigError, match="amsgrad=True is not supported"):
        pst.DistributedOptimizer(torch.optim.Adam(model.parameters(), amsgrad=True),
                                 model.named_parameters(), client=c)
    opt = pst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   model.named_parameters(), client=c)
    assert isinstance(opt, torch.optim.SGD)
    x, y = data(1)
    loss = lambda: torch.nn.functional.cross_entropy(model(x[0]), y[0])  # noqa: E731
    loss().backward()
    with pytest.raises(ps.StateError, match=r"zero_grad\(\) was called after loss.backward\(\)"):
        opt.zero_grad()
    with pytest.raises(Exception, match="computed more than backward_passes_per_step=1 times"):
        loss().backward()
    opt.synchronize()
    with pytest.warns(UserWarning, match="without skip_synchronize"):
        opt.step()
    opt.zero_grad()
    with pytest.raises(ps.StateError, match=r"under skip_synchronize\(\) before synchronize"):
        with opt.skip_synchronize():
            opt.step()
    c.close()


def test_init_waits_for_shards_that_start_late(cluster):
    """pst.init() asks again while a shard refuses the connection (a pod
    whose name resolves before its process listens), for as long as
    limits.connect_timeout_ms; then gives up with ps.ConnectionError."""
    import threading
    cl = declared_cluster(cluster, shards=1, workers=1)   # connect_timeout_ms: 3000
    assert cl.stop(0) == 0
    assert ps.Config(cl.path).connect_timeout == 3.0
    t0 = time.monotonic()
    with pytest.raises(ps.ConnectionError, match="refused"):
        pst.init(cl.path, 0)
    assert 2.0 <= time.monotonic() - t0 < 8.0
    late = threading.Timer(1.2, cl.start, (0,))
    late.start()
    try:
        t0 = time.monotonic()
        c = pst.init(cl.path, 0)
        assert time.monotonic() - t0 >= 1.0 and c.rank == 0 and not c.closed
    finally:
        late.join()
        pst.shutdown()
