"""ps.torch: train a PyTorch model through the shards.

Change about ten lines of a training script (docs/pytorch.md):

    import ps.torch as pst
    pst.init()                                   # $PS_CONFIG / $PS_RANK (the launchers set them)
    model = Net()                                # any model, any layers
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = pst.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   model=model)  # model: its buffers too
    sched = torch.optim.lr_scheduler.StepLR(opt, 10)   # unchanged
    for x, y in loader:                          # each worker its own part (pst.rank(), pst.size())
        opt.zero_grad()
        loss_fn(model(x), y).backward()          # gradients leave as autograd makes them
        opt.step()                               # waits for the shards' weights

The wrapper declares the model's parameters to the shards (names and shapes
in the model's order; rank 0's values seed them and every rank starts from
them), so no shape goes into the YAML. Two modes:

- mode="server" (the default): the shards apply the optimizer. SGD
  (momentum, dampening, nesterov, weight_decay), Adam, AdamW and Adagrad are
  mapped, per parameter group, to the shards' rules; each push carries each
  group's current learning rate, so schedulers work unchanged. In sync mode
  the shards average the workers' gradients: N workers of batch b give the
  result of one process on batch N*b. The optimizer state lives on the
  shards (and in their checkpoints).
- mode="local": the shards only average the gradients (as an all-reduce
  would) and every worker runs its own torch optimizer on the averages, as
  Horovod and BytePS do: any optimizer works, and gradient clipping or AMP
  unscaling between synchronize() and step() sees the averaged gradient.
  Sync consistency only.

Gradients are pushed from a hook on each parameter's gradient accumulation
as soon as autograd produces them (small tensors bucketed), each bucket's
results are pulled as its push completes, and step() waits for them. This
module imports torch; the rest of the package does not, and nothing links
libtorch.
"""
import collections
import contextlib
import errno
import os
import time
import warnings
from typing import Any, Callable, Iterable

import numpy as np
import torch
from torch.optim.optimizer import required as _required

from . import Client, ConfigError, ConnectionError, StateError, _config_arg, _ps

__all__ = ["init", "shutdown", "client", "rank", "size", "index", "members", "DistributedOptimizer",
           "Average", "Sum", "supported_optimizers", "Embedding", "EmbeddingBag", "Prefetch"]

#: How a sync clock's gradients are combined (hvd.Average, hvd.Sum).
Average = "average"
Sum = "sum"

_client = None


def init(config: "str | os.PathLike | None" = None, rank: "int | None" = None) -> Client:
    """Connects this process to the shards (ps.Client(config, rank); the
    launchers' $PS_CONFIG and $PS_RANK, else $JOB_COMPLETION_INDEX, when
    None) and returns the client. DistributedOptimizer uses it unless given
    another. Shards that refuse the connection (still starting, as pods of
    a StatefulSet do after their names resolve) are asked again every
    second for limits.connect_timeout_ms, as ps-worker does."""
    global _client
    if _client is None or _client.closed:
        cfg = _config_arg(config)
        deadline = time.monotonic() + cfg.connect_timeout
        while True:
            try:
                _client = Client(cfg, rank)
                break
            except ConnectionError as e:
                if e.code != -errno.ECONNREFUSED or time.monotonic() + 1 > deadline:
                    raise
                time.sleep(1)
    return _client


def shutdown() -> None:
    """Closes the client init() opened."""
    global _client
    if _client is not None:
        _client.close()
        _client = None


def client() -> Client:
    """The client init() opened (ps.StateError before init())."""
    if _client is None or _client.closed:
        raise StateError("ps.torch.init() has not been called")
    return _client


def rank() -> int:
    """This worker's rank."""
    return client().rank


def size() -> int:
    """The number of workers that are members of this worker's next clock
    (cluster.workers in a cluster whose membership never changed; fewer or
    more once workers joined or left: docs/reliability.md)."""
    return client().members()["count"]


def index() -> int:
    """This worker's place among the members of its next clock (ascending
    ranks; its rank in a cluster whose membership never changed), -1 when it
    is not one (it left)."""
    return client().members()["index"]


def members() -> dict:
    """The membership of this worker's next clock as the last pull told it:
    {"clock", "epoch", "before", "count", "index"}. A data loader that takes
    batch slot before + index of each step trains every slot of its order
    once, whoever joins or leaves (docs/python.md)."""
    return client().members()


# ---- mapping torch optimizers to the shards' rules ----

def supported_optimizers() -> "dict[str, str]":
    """The torch optimizers mode="server" maps, with the options they may use."""
    return {
        "SGD": "lr, momentum, dampening, nesterov, weight_decay",
        "Adam": "lr, betas, eps, weight_decay (amsgrad and maximize off)",
        "AdamW": "lr, betas, eps, weight_decay (decoupled; amsgrad and maximize off)",
        "Adagrad": "lr, lr_decay, weight_decay, initial_accumulator_value, eps (maximize off)",
    }


def _supported_text():
    return "; ".join(f"torch.optim.{k} ({v})" for k, v in supported_optimizers().items())


# Options that change nothing the shards compute (how torch would run it
# locally), and options that must keep their default.
_IGNORED = {"params", "foreach", "fused", "capturable", "differentiable", "initial_lr"}
_MUST_BE = {"maximize": False, "amsgrad": False}


def _group_of(optimizer, group, index, average):
    """The shards' settings for torch param_group `group` (a dict for
    Client.declare), or ps.ConfigError naming what cannot be mapped."""
    base = type(optimizer).__mro__[1]   # the script's class (optimizer is the wrapper)
    if isinstance(optimizer, torch.optim.AdamW):       # before Adam: 2.x derives it from Adam
        kind, keys = "adamw", {"lr", "betas", "eps", "weight_decay"}
    elif isinstance(optimizer, torch.optim.Adam):
        kind, keys = "adam", {"lr", "betas", "eps", "weight_decay"}
    elif isinstance(optimizer, torch.optim.SGD):
        kind, keys = "sgd", {"lr", "momentum", "dampening", "nesterov", "weight_decay"}
    elif isinstance(optimizer, torch.optim.Adagrad):
        kind, keys = "adagrad", {"lr", "lr_decay", "weight_decay", "initial_accumulator_value",
                                 "eps"}
    else:
        raise ConfigError(f"DistributedOptimizer(mode='server'): the shards cannot apply "
                          f"{base.__module__}.{base.__name__}; supported: "
                          f"{_supported_text()}; or use mode='local' (the shards average the "
                          "gradients and each worker runs its own optimizer)")
    out = {"kind": kind, "average": average}
    if kind in ("adam", "adamw") and "decoupled_weight_decay" in group:   # torch >= 2.6
        kind = out["kind"] = "adamw" if group["decoupled_weight_decay"] else "adam"
    for k, v in group.items():
        if k == "decoupled_weight_decay":
            continue
        if k in keys:
            if torch.is_tensor(v):
                v = v.item()
            out[k] = v
        elif k in _MUST_BE:
            if bool(v) != _MUST_BE[k]:
                raise ConfigError(f"DistributedOptimizer(mode='server'): param_groups[{index}] "
                                  f"{k}={v!r} is not supported on the shards; supported: "
                                  f"{_supported_text()}")
        elif k not in _IGNORED:
            raise ConfigError(f"DistributedOptimizer(mode='server'): param_groups[{index}] has "
                              f"option {k!r}, which the shards' {kind} does not know; supported: "
                              f"{_supported_text()}")
    if "lr" not in out or out["lr"] is _required:
        raise ConfigError(f"DistributedOptimizer: param_groups[{index}] has no learning rate")
    if kind == "sgd" and out.get("nesterov") and (out.get("momentum", 0) <= 0 or
                                                  out.get("dampening", 0) != 0):
        raise ConfigError("DistributedOptimizer: nesterov needs momentum > 0 and dampening 0 "
                          "(as torch.optim.SGD)")
    return out


def _lr(group):
    lr = group["lr"]
    return float(lr.item() if torch.is_tensor(lr) else lr)


def _names(optimizer, named_parameters):
    """(name, param, group index) of every parameter the optimizer trains,
    in the model's order (named_parameters), which every worker derives the
    same way; ps.ConfigError for a parameter without a name, a name given
    twice, or one parameter in two groups."""
    owner = {}
    for gi, g in enumerate(optimizer.param_groups):
        for p in g["params"]:
            if p in owner:
                raise ConfigError("DistributedOptimizer: a parameter is in two param_groups")
            owner[p] = gi
    if named_parameters is None:
        return [(f"param.{gi}.{i}", p, gi) for gi, g in enumerate(optimizer.param_groups)
                for i, p in enumerate(g["params"])]
    seen, out = set(), []
    for name, p in list(named_parameters):
        if name in seen:
            raise ConfigError(f"DistributedOptimizer: parameter name {name!r} given twice")
        seen.add(name)
        if p in owner:
            out.append((name, p, owner.pop(p)))
    if owner:
        raise ConfigError(f"DistributedOptimizer: {len(owner)} parameter(s) of the optimizer "
                          "are not in named_parameters (pass model.named_parameters() of the "
                          "model the optimizer trains)")
    return out


class _Param:
    """What the wrapper keeps for one declared parameter."""
    __slots__ = ("name", "p", "group", "count", "delay", "out", "host_grad", "pushed",
                 "hook")

    def __init__(self, name, p, group):
        self.name, self.p, self.group = name, p, group
        self.count = p.numel()
        self.delay = 0
        self.pushed = False
        # the pulled result lands here: the weights (server mode) or the
        # averaged gradient (local mode), copied into the parameter by step()
        self.out = np.empty(tuple(p.shape), np.float32)
        self.host_grad = None   # a CPU copy of a gradient on a device
        self.hook = None


class _DistributedOptimizer(torch.optim.Optimizer):
    """The methods DistributedOptimizer puts on a subclass of the user's
    optimizer class (so isinstance() and the schedulers see their class)."""

    def __init__(self, params, named_parameters, client, backward_passes_per_step, bucket_bytes,
                 mode, op, model, buffers_every):
        super(self.__class__, self).__init__(params)
        if mode not in ("server", "local"):
            raise ConfigError(f"DistributedOptimizer: mode={mode!r}: expected 'server' or 'local'")
        if op not in (Average, Sum):
            raise ConfigError(f"DistributedOptimizer: op={op!r}: expected ps.torch.Average or Sum")
        if backward_passes_per_step < 1:
            raise ConfigError("DistributedOptimizer: backward_passes_per_step must be >= 1")
        self._ps = client if client is not None else init()
        self._mode, self._op = mode, op
        self._bpps = int(backward_passes_per_step)
        self._bucket_bytes = int(bucket_bytes)
        cfg = self._ps.config
        self._sync = cfg.sync
        if mode == "local" and not self._sync:
            raise ConfigError(f"DistributedOptimizer(mode='local') needs consistency.mode sync "
                              f"({cfg.path} is async)")
        params = [_Param(n, p, g) for n, p, g in _names(self, named_parameters)
                  if p.requires_grad]
        for q in params:
            if q.p.dtype != torch.float32:
                raise ConfigError(f"DistributedOptimizer: parameter {q.name!r} is {q.p.dtype}; "
                                  "the shards hold float32 (keep the master weights in float32; "
                                  "autocast computes in lower precision)")
            if q.p.is_sparse:
                raise ConfigError(f"DistributedOptimizer: parameter {q.name!r} is sparse")
        self._params = params
        # buffers (BatchNorm running statistics): averaged through the
        # shards every buffers_every steps and by sync_buffers()
        self._buffers = []
        if model is not None and self._sync:
            for name, b in model.named_buffers():
                if b.dtype == torch.float32:
                    q = _Param("buffer:" + name, b, len(self.param_groups))
                    self._buffers.append(q)
        self._buffers_every = int(buffers_every)
        # embedding modules (ps.torch.Embedding, EmbeddingBag) in the model:
        # their row gradients are pushed by step(), before the push that
        # ends the clock, once per table
        self._embeddings = []
        if model is not None:
            self._embeddings = [m for m in model.modules() if isinstance(m, _TableModule)]
        for m in self._embeddings:
            m._attach(self)
        self._declare_tables()
        self._rowgrads = {}
        self._row_scale = 1.0 / cfg.nworkers if op == Average else 1.0
        self._declare()
        self._lrs = [None] * len(self.param_groups)
        self._send_lrs()
        self._reset_step()
        self._synchronized = False
        self._pending_weights = False   # server mode: pulled weights not yet in the parameters
        self._should_synchronize = True
        for q in params:
            self._hook(q)

    # ---- declaration ----
    def _declare_tables(self):
        """Declares the tables of the model's embedding modules that were
        given dim= (in one call: a client declares its tables once)."""
        decls = {}
        for m in self._embeddings:
            if m._decl is None:
                continue
            if m.table in decls and decls[m.table] != m._decl:
                raise ConfigError(f"DistributedOptimizer: table {m.table!r} declared twice with "
                                  f"different settings: {decls[m.table]} and {m._decl}")
            decls[m.table] = m._decl
        if decls:
            self._ps.declare_tables([decls[t] for t in sorted(decls)])

    def _declare(self):
        avg = self._op == Average
        if self._mode == "server":
            groups = [_group_of(self, g, i, avg) for i, g in enumerate(self.param_groups)]
        else:
            groups = [{"kind": "reduce", "average": avg} for _ in self.param_groups]
        group_of = [q.group for q in self._params]
        if self._buffers:
            groups.append({"kind": "reduce", "average": True})
            group_of += [len(groups) - 1] * len(self._buffers)
        values = {}
        for q in self._params + self._buffers:
            values[q.name] = q.out
            q.out[...] = q.p.detach().cpu().numpy()
        self._ps.declare(values, groups=groups, group_of=group_of)
        # every rank starts from the shards' values (rank 0's in a new run)
        with torch.no_grad():
            for q in self._params + self._buffers:
                q.p.copy_(torch.from_numpy(q.out))

    def _send_lrs(self):
        if self._mode != "server":
            return
        for i, g in enumerate(self.param_groups):
            lr = _lr(g)
            if lr != self._lrs[i]:
                self._ps.set_lr(i, lr)
                self._lrs[i] = lr

    # ---- hooks ----
    def _hook(self, q):
        def after_accumulate(*_):
            self._ready(q)
        if hasattr(q.p, "register_post_accumulate_grad_hook"):     # torch >= 2.1
            q.hook = q.p.register_post_accumulate_grad_hook(after_accumulate)
        else:   # torch 1.13: a hook on the AccumulateGrad node (kept alive in q.hook)
            acc = q.p.expand_as(q.p).grad_fn.next_functions[0][0]
            acc.register_hook(after_accumulate)
            q.hook = acc

    def _reset_step(self):
        self._clock = None
        self._ended = False          # the push that ends this step's clock has gone
        self._bucket, self._bucket_size = [], 0
        self._handles = []
        self._npushed = 0
        for q in self._params:
            q.delay = self._bpps
            q.pushed = False

    def _grad_array(self, q, grad):
        """A float32 C-contiguous CPU array of q's gradient (a view when it
        already is one, else a copy)."""
        if grad is None:
            return np.zeros(q.out.shape, np.float32)
        if grad.is_sparse:
            raise StateError(f"parameter {q.name!r} got a sparse gradient; the shards take dense "
                             "ones (nn.Embedding(sparse=False), or ps.torch's embedding modules)")
        g = grad.detach()
        if g.device.type == "cpu" and g.dtype == torch.float32 and g.is_contiguous():
            return g.numpy()
        if q.host_grad is None:
            q.host_grad = torch.empty(tuple(g.shape), dtype=torch.float32,
                                      pin_memory=g.device.type == "cuda")
        q.host_grad.copy_(g)        # waits for the device's work on g
        return q.host_grad.numpy()

    def _ready(self, q):
        q.delay -= 1
        if q.delay < 0 or q.pushed:
            raise StateError(f"the gradient of {q.name!r} was computed more than "
                             f"backward_passes_per_step={self._bpps} times before step(): call "
                             "step() (or synchronize()) after each backward pass, or raise "
                             "backward_passes_per_step to accumulate gradients locally")
        if q.delay > 0:
            return
        if self._clock is None:
            self._begin()
        q.pushed = True
        self._bucket.append((q, self._grad_array(q, q.p.grad)))
        self._bucket_size += 4 * q.count
        self._npushed += 1
        if self._npushed == len(self._params) and not self._buffer_step() and \
                not self._embeddings:
            self._flush(last=True)
        elif self._bucket_size >= self._bucket_bytes:
            self._flush(last=False)

    def _begin(self):
        self._clock = self._ps.clock()
        self._synchronized = False
        self._send_lrs()

    def _buffer_step(self):
        return bool(self._buffers) and self._buffers_every > 0 and \
            (self._clock + 1) % self._buffers_every == 0

    def _flush(self, last):
        if not self._bucket and not last:
            return
        grads = {q.name: a for q, a in self._bucket}
        outs = {q.name: q.out for q, _ in self._bucket}
        if self._sync:
            h = self._ps.pushpull_async(grads, outs, clock=self._clock, end_clock=last,
                                        min_version=self._clock + 1, after_clock=not last)
        else:
            h = self._ps.pushpull_async(grads, outs, clock=self._clock, end_clock=last,
                                        after_clock=not last)
        self._handles.append(h)
        self._bucket, self._bucket_size = [], 0
        self._ended = self._ended or last

    def _row_grad(self, table, ids, grad):
        """An embedding module's gradient for its rows ids (unique), from
        autograd: kept until synchronize() pushes each table once."""
        if self._clock is None:
            self._begin()
        g = grad.detach()
        if g.device.type != "cpu":
            g = g.cpu()
        g = g.to(torch.float32).numpy()
        if self._row_scale != 1.0:
            g = g * np.float32(self._row_scale)
        self._rowgrads.setdefault(table, []).append((ids, g))

    # ---- the optimizer's API ----
    def synchronize(self):
        """Pushes what backward has not (zeros for parameters that got no
        gradient), then waits until every push is applied and every result
        pulled: in mode="local" the parameters' .grad then hold the
        workers' averaged gradients (clip or unscale them now, then call
        step() under skip_synchronize())."""
        if self._clock is None:
            if self._synchronized:
                return
            self._begin()
        missing = [q for q in self._params if not q.pushed]
        for q in missing:
            if q.delay != self._bpps and q.delay != 0:
                raise StateError(f"synchronize(): {q.name!r} has had {self._bpps - q.delay} of "
                                 f"its backward_passes_per_step={self._bpps} backward passes")
            q.pushed = True
            self._bucket.append((q, self._grad_array(q, q.p.grad)))
            self._npushed += 1
        bufstep = self._buffer_step()
        for table, parts in self._rowgrads.items():
            ids = np.concatenate([i for i, _ in parts])
            grads = np.ascontiguousarray(np.concatenate([g for _, g in parts]), np.float32)
            self._handles.append(self._ps.push_rows_async(table, ids, grads, clock=self._clock))
        self._rowgrads = {}
        if not self._ended:   # deferred (buffers, rows) or parameters pushed just now
            if bufstep:
                for b in self._buffers:
                    self._bucket.append((b, np.ascontiguousarray(
                        b.p.detach().cpu().numpy(), np.float32)))
            self._flush(last=True)
        try:
            for h in self._handles:
                h.wait()
        finally:
            self._handles = []
        with torch.no_grad():
            if self._mode == "local":
                for q in self._params:
                    g = torch.from_numpy(q.out)
                    if q.p.grad is None:
                        q.p.grad = g.to(q.p.device).clone()
                    else:
                        q.p.grad.copy_(g)
            if bufstep:
                for b in self._buffers:
                    b.p.copy_(torch.from_numpy(b.out))
        self._synchronized = True
        self._pending_weights = self._mode == "server"
        self._clock = None

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() inside this context does not synchronize(): call
        synchronize() first yourself (gradient clipping, AMP)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        """Waits for the shards (synchronize()) and writes the new weights
        into the parameters (mode="server"), or runs the wrapped optimizer
        on the averaged gradients (mode="local")."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._should_synchronize:
            if self._synchronized and self._clock is None:
                warnings.warn("optimizer.step() called without skip_synchronize() after "
                              "optimizer.synchronize(): the step is not synchronized again")
            else:
                self.synchronize()
        elif not self._synchronized:
            raise StateError("optimizer.step() under skip_synchronize() before synchronize(): "
                             "call optimizer.synchronize() first")
        if self._mode == "server":
            if self._pending_weights:
                with torch.no_grad():
                    for q in self._params:
                        q.p.copy_(torch.from_numpy(q.out))
                self._pending_weights = False
        else:
            super(self.__class__, self).step()
        self._reset_step()
        self._synchronized = False
        return loss

    def zero_grad(self, set_to_none=None):
        """The wrapped optimizer's zero_grad(); refused between backward and
        step(), where it would zero gradients still being pushed."""
        if self._handles or self._bucket or self._npushed or self._rowgrads:
            raise StateError("optimizer.zero_grad() was called after loss.backward() and "
                             "before optimizer.step() or optimizer.synchronize(): the "
                             "gradients are still being pushed")
        if set_to_none is None:
            return super(self.__class__, self).zero_grad()
        return super(self.__class__, self).zero_grad(set_to_none=set_to_none)

    def sync_buffers(self):
        """Averages the model's float buffers (BatchNorm running statistics)
        through the shards now: every worker must call it at the same point
        (before evaluation or saving). It ends a clock of its own."""
        if not self._buffers:
            return
        if self._clock is not None or self._npushed:
            raise StateError("sync_buffers() between backward and step()")
        clock = self._ps.clock()
        vals = {b.name: np.ascontiguousarray(b.p.detach().cpu().numpy(), np.float32)
                for b in self._buffers}
        self._ps.pushpull(vals, {b.name: b.out for b in self._buffers}, clock=clock,
                          end_clock=True, min_version=clock + 1)
        with torch.no_grad():
            for b in self._buffers:
                b.p.copy_(torch.from_numpy(b.out))

    @property
    def client(self):
        """The ps.Client this optimizer pushes through."""
        return self._ps

    def checkpoint(self, path=None, **extra):
        """Rank 0 asks every shard to write its checkpoint now (the weights
        and the optimizer state live there; after step() every shard has
        applied this worker's last clock, and in sync mode every worker's).
        Every rank, when path is given, saves its own part there
        (torch.save): the clock, each group's learning rate and `extra` (a
        scheduler's state_dict(), the epoch). Raises ps.StateError when a
        shard's write failed. A cluster restarted from the checkpoints
        resumes: the workers declare again and get the shards' weights;
        load_checkpoint(path) gives back `extra`."""
        if self._clock is not None or self._npushed:
            raise StateError("checkpoint() between backward and step()")
        if self._ps.rank == 0:
            for k in range(self._ps.config.nshards):
                deadline = time.monotonic() + 60
                while True:
                    st = self._ps.checkpoint(k)
                    code = st.get("checkpoint_status", 0)
                    # -EBUSY: a periodic checkpoint is being written: ask again
                    if code != -errno.EBUSY or time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
                if code:
                    raise StateError(f"shard {k}: checkpoint failed: "
                                     f"{st.get('checkpoint_error')}")
        if path is not None:
            state = {"clock": self._ps.clock(), "lrs": [_lr(g) for g in self.param_groups],
                     "extra": extra}
            tmp = f"{path}.tmp{os.getpid()}"
            torch.save(state, tmp)
            os.replace(tmp, path)

    def load_checkpoint(self, path):
        """Reads what checkpoint(path) saved; sets each group's learning rate
        and returns `extra`."""
        state = torch.load(path)
        for g, lr in zip(self.param_groups, state["lrs"]):
            g["lr"] = lr
        self._send_lrs()
        return state["extra"]


# ---- embedding tables as modules ----

class _TableModule(torch.nn.Module):
    """What Embedding and EmbeddingBag share: a table of the shards looked
    up by id. forward() pulls the batch's rows (each distinct id once) into
    a leaf tensor; autograd's gradient for it (already summed per id) goes
    to the DistributedOptimizer the module is part of (model=), which
    pushes each table once per step, before the push that ends the clock,
    so the shards' row optimizer (the table's, from the config) applies it.
    With op=Average the row gradients are divided by the number of workers,
    as the dense ones are averaged."""

    def __init__(self, table, client=None, dim=None, **options):
        super().__init__()
        self.table = table
        self._client = client
        self._opt = None
        self._pending = collections.deque()    # prefetched: (ids, u, inv, handle, rows)
        # dim given: a table declared at run time (by the DistributedOptimizer
        # this module joins, with the options: model.embeddings' keys)
        self._decl = None
        if dim is not None:
            self._decl = dict(options, name=table, dim=int(dim))
            self.embedding_dim = int(dim)
            return
        if options:
            raise ConfigError(f"ps.torch: table {table!r}: options {sorted(options)} need dim= "
                              "(a table declared at run time)")
        tables = self._ps().tables      # the config's and the declared ones
        if table not in tables:
            raise ConfigError(f"ps.torch: no embedding table {table!r} in "
                              f"{self._ps().config.path} (model.embeddings: "
                              f"{', '.join(sorted(tables)) or 'none'}); give dim= (and the "
                              "table's options) to declare it at run time")
        self.embedding_dim = tables[table]

    def _ps(self):
        return self._client if self._client is not None else client()

    def _attach(self, opt):
        if self._opt is not None and self._opt is not opt:
            raise StateError(f"embedding module of table {self.table!r} is part of another "
                             "DistributedOptimizer")
        self._opt = opt
        if self._client is None:
            self._client = opt.client

    @staticmethod
    def _unique(ids):
        """(distinct ids as a numpy array, in the order of their first
        occurrence; inverse indices as a torch tensor of ids' shape): one
        hashing pass in the extension (ps._ps.unique_ids), not a sort."""
        if isinstance(ids, np.ndarray):
            if ids.dtype.kind not in "iu":
                raise TypeError(f"embedding ids: integers expected, got {ids.dtype}")
            flat = ids.reshape(-1)
            if flat.dtype.itemsize != 8:
                flat = flat.astype(np.int64)
        else:
            if ids.dtype not in (torch.int64, torch.int32):
                raise TypeError(f"embedding ids: int64 or int32 expected, got {ids.dtype}")
            flat = ids.reshape(-1).cpu().to(torch.int64).numpy()
        flat = np.ascontiguousarray(flat)
        if flat.dtype.kind == "i" and flat.size and flat.min() < 0:
            raise ValueError("embedding ids must be >= 0")
        u, inv = np.empty(flat.size, flat.dtype), np.empty(flat.size, np.int64)
        k = _ps.unique_ids(flat, u, inv)
        return u[:k], torch.from_numpy(inv).reshape(ids.shape)

    def _prefetch(self, ids, min_version):
        """Asks for ids' rows now (ps.torch.Prefetch): the next forward with
        the same ids takes them without waiting."""
        u, inv = self._unique(ids)
        rows = np.empty((len(u), self.embedding_dim), np.float32)
        h = self._ps().pull_rows_async(self.table, u, rows, min_version=min_version)
        self._pending.append((ids, u, inv, h, rows))

    def _rows(self, ids):
        """(distinct ids, inverse indices, their rows): the prefetched ones
        when they are for these ids (the same object: its distinct ids are
        not computed again; else compared), else pulled now."""
        u = inv = None
        while self._pending:
            pids, pu, pinv, h, rows = self._pending.popleft()
            h.wait()
            if pids is ids:
                return pu, pinv, rows
            if u is None:
                u, inv = self._unique(ids)
            if pu.shape == u.shape and np.array_equal(pu, u):
                return u, inv, rows
        if u is None:
            u, inv = self._unique(ids)
        rows = np.empty((len(u), self.embedding_dim), np.float32)
        if len(u):
            self._ps().pull_rows(self.table, u, rows)
        return u, inv, rows

    def _lookup(self, ids):
        """(inverse indices on ids' device, the rows as a leaf tensor)."""
        u, inv, rows = self._rows(ids)
        dev = ids.device if torch.is_tensor(ids) else torch.device("cpu")
        rows = torch.from_numpy(rows)
        if dev.type != "cpu":
            rows, inv = rows.to(dev), inv.to(dev)
        if self.training and torch.is_grad_enabled():
            if self._opt is None:
                raise StateError(f"ps.torch embedding of table {self.table!r} in training but "
                                 "part of no DistributedOptimizer: pass model= to "
                                 "DistributedOptimizer (or call model.eval())")
            rows.requires_grad_()
            table, opt = self.table, self._opt
            rows.register_hook(lambda g: opt._row_grad(table, u, g))
        return inv, rows


class EmbeddingBag(_TableModule):
    """torch.nn.EmbeddingBag over a table of the shards.

    EmbeddingBag(table, mode="mean", include_last_offset=False, client=None)
    forward(input, offsets=None, per_sample_weights=None): as
    torch.nn.EmbeddingBag (a 2-D input is one bag per row; a 1-D input with
    offsets; "sum", "mean" or "max"), ids int64 or int32 tensors >= 0, or a
    numpy uint64/int64 array. The table (dim, initializer, row optimizer,
    admission, TTL, row cap) is the config's model.embeddings entry, or,
    given dim= and model.embeddings' other keys as options (init, scale,
    optimizer, lr, admission, ttl, max_rows, ...), a table declared at run
    time by the DistributedOptimizer the module joins."""

    def __init__(self, table: str, mode: str = "mean", include_last_offset: bool = False,
                 client: "Client | None" = None, dim: "int | None" = None, **options):
        super().__init__(table, client, dim, **options)
        if mode not in ("sum", "mean", "max"):
            raise ConfigError(f"EmbeddingBag: mode={mode!r}: expected sum, mean or max")
        self.mode = mode
        self.include_last_offset = include_last_offset

    def forward(self, input, offsets=None, per_sample_weights=None) -> torch.Tensor:
        inv, rows = self._lookup(input)
        if offsets is not None and torch.is_tensor(offsets) and offsets.device != inv.device:
            offsets = offsets.to(inv.device)
        elif offsets is not None and not torch.is_tensor(offsets):
            offsets = torch.as_tensor(np.asarray(offsets, np.int64), device=inv.device)
        return torch.nn.functional.embedding_bag(
            inv, rows, offsets, mode=self.mode, per_sample_weights=per_sample_weights,
            include_last_offset=self.include_last_offset)

    def extra_repr(self):
        return f"table={self.table!r}, dim={self.embedding_dim}, mode={self.mode!r}"


class Embedding(_TableModule):
    """torch.nn.Embedding over a table of the shards: forward(ids) gives
    ids.shape + (dim,)."""

    def forward(self, input):
        inv, rows = self._lookup(input)
        return torch.nn.functional.embedding(inv, rows)

    def extra_repr(self):
        return f"table={self.table!r}, dim={self.embedding_dim}"


class Prefetch:
    """Pulls the next batch's rows while the current batch computes.

        for batch in pst.Prefetch(loader, lambda b: {model.user: b["user"],
                                                     model.item: b["item"]}):
            ...                           # the loop body as before

    ids_of(batch) names, for each embedding module, the ids its forward()
    will look up. When batch k is handed out, the rows of batch k+1 are
    asked for at once: in sync mode with min_version k+1, so each shard
    answers as soon as it has applied clock k (during step k's own wait)
    and the rows are exactly those a pull at step k+1 would get: training
    is the same with and without prefetch. In async mode the rows satisfy
    the staleness bound of the clock they were asked at, one before the
    step that uses them: at most one clock staler than without prefetch.
    A forward whose ids differ from the prefetched ones pulls them itself."""

    def __init__(self, iterable: Iterable, ids_of: Callable[[Any], dict]):
        self.iterable, self.ids_of = iterable, ids_of

    def _issue(self, batch, ahead):
        for module, ids in self.ids_of(batch).items():
            if not isinstance(module, _TableModule):
                raise TypeError("Prefetch: ids_of must map ps.torch embedding modules to ids")
            c = module._ps()
            clock = c.clock()
            module._prefetch(ids, clock + 1 if ahead and c.config.sync else None)

    def __iter__(self):
        it = iter(self.iterable)
        end = object()
        cur = next(it, end)
        if cur is end:
            return
        self._issue(cur, False)
        while True:
            nxt = next(it, end)
            if nxt is not end:
                self._issue(nxt, True)
            yield cur
            if nxt is end:
                return
            cur = nxt


def DistributedOptimizer(optimizer: torch.optim.Optimizer,
                         named_parameters: "Iterable[tuple[str, torch.Tensor]] | None" = None, *,
                         client: "Client | None" = None, backward_passes_per_step: int = 1,
                         bucket_bytes: int = 1 << 20, mode: str = "server", op: str = Average,
                         model: "torch.nn.Module | None" = None,
                         buffers_every: int = 100) -> torch.optim.Optimizer:
    """Wraps a torch optimizer so that a step trains through the shards.

    optimizer: the script's torch.optim optimizer (its param_groups, their
    hyperparameters and learning rates are used; mode="server" maps SGD,
    Adam, AdamW and Adagrad, anything else is refused listing them).
    named_parameters: model.named_parameters() (names are how workers agree;
    without it parameters are named by group and position). client: a
    ps.Client (default: ps.torch.init()). backward_passes_per_step: backward
    passes whose gradients accumulate locally before one push. bucket_bytes:
    gradients gathered into one push up to this size. op: Average (default,
    as DDP and Horovod) or Sum of the workers' gradients. model: its float
    buffers (BatchNorm statistics) are declared too and averaged through
    the shards every buffers_every steps (0: only by sync_buffers()).

    Returns an instance of a subclass of optimizer's class (isinstance holds,
    schedulers work) with synchronize(), skip_synchronize(), sync_buffers(),
    checkpoint() and load_checkpoint() added.
    """
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, client, backward_passes_per_step,
               bucket_bytes, mode, op, model, buffers_every)
