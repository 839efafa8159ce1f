"""ps: the Python client of the parameter server, over libps.so.

    import numpy as np, ps
    with ps.Client("cluster.yaml", rank=0) as c:     # or $PS_CONFIG / $PS_RANK
        w = {n: np.zeros(k, np.float32) for n, k in c.config.tensors.items()}
        g = {n: np.ones(k, np.float32) for n, k in c.config.tensors.items()}
        c.push(g)                # ends this worker's clock
        c.pull(w)                # sync: waits for every worker's push of that clock

With a config that names no model, the workers declare it first:
c.declare({name: array, ...}) in the model's order (rank 0's arrays seed the
shards; every rank's arrays then hold the shards' values; docs/python.md).

Arrays are any C-contiguous float32 buffer (numpy arrays; torch CPU tensors
are taken through their .numpy() view), passed without copies. Every call
that can wait releases the GIL; libps's threads never call Python. The
*_async forms return a Handle (wait(timeout), done()) that keeps the arrays
alive until the call completes. Errors are ps.Error subclasses carrying the
libps code (e.code, e.code_name). docs/python.md has the whole story.
"""
import os

from . import _ps
from ._ps import (  # noqa: F401  (re-exported)
    ArrayError, AuthError, ClosedError, Config, ConfigError, ConnectionError, Error, ForkError,
    Handle, NotFiniteError, ProtocolError, RefusedError, StateError, TimeoutError, TooBigError,
    UnknownNameError, strerror, version,
)

_EXPORT_NAMES = ("Export", "ExportLookup", "ExportTable", "export_lookup", "load_export")


def __getattr__(name):
    # ps.load_export & co. (ps/export.py) import numpy, so only when used
    if name in _EXPORT_NAMES:
        from . import export
        return getattr(export, name)
    raise AttributeError(f"module 'ps' has no attribute {name!r}")

__all__ = [
    "Client", "Config", "Handle", "connect", "monitor", "reader", "strerror", "version",
    "RANK_READER",
    "Error", "ArrayError", "AuthError", "ClosedError", "ConfigError", "ConnectionError",
    "ForkError", "NotFiniteError", "ProtocolError", "RefusedError", "StateError",
    "TimeoutError", "TooBigError", "UnknownNameError",
    "ENV_CONFIG", "ENV_RANK",
    "Export", "ExportLookup", "ExportTable", "export_lookup", "load_export",
]

#: The environment variables the launchers (ps-local.sh, ps-cluster.sh,
#: ps.sbatch, ps-worker@.service) set for a --worker-cmd, read when Client
#: is given no config or rank.
ENV_CONFIG = "PS_CONFIG"
ENV_RANK = "PS_RANK"
#: A Kubernetes Indexed Job's pod index: the rank when neither rank nor
#: $PS_RANK is given.
ENV_JOB_INDEX = "JOB_COMPLETION_INDEX"

#: The rank of a reader (Client(config, reader=True)), PS_RANK_READER in C.
RANK_READER = -2

# The PS_E* codes, as ps.PS_ECONFIG etc.
globals().update({k: v for k, v in vars(_ps).items() if k.startswith("PS_E")})


def _config_arg(config):
    if isinstance(config, Config):
        return config
    if config is None:
        config = os.environ.get(ENV_CONFIG)
        if not config:
            raise ConfigError(f"no config given and ${ENV_CONFIG} is not set "
                              "(the launchers set it for --worker-cmd)")
    return Config(os.fspath(config))


def _rank_arg(rank):
    """The rank given, else $PS_RANK, else $JOB_COMPLETION_INDEX (what a
    Kubernetes Indexed Job gives each pod), as ps-worker takes it."""
    if rank is not None:
        return int(rank)
    for name in (ENV_RANK, ENV_JOB_INDEX):
        text = os.environ.get(name)
        if text:
            break
    else:
        raise ConfigError(f"no rank given and neither ${ENV_RANK} nor ${ENV_JOB_INDEX} is set "
                          "(the launchers set PS_RANK for --worker-cmd, a Kubernetes Indexed "
                          "Job JOB_COMPLETION_INDEX; monitor=True for a monitor)")
    try:
        rank = int(text)
    except ValueError:
        raise ConfigError(f"${name}={text!r}: a worker rank (0, 1, ...) expected") from None
    if rank < 0:
        raise ConfigError(f"${name}={text!r}: a worker rank is 0 or more")
    return rank


# torch.optim's defaults per kind (SGD's lr as torch 2.x: 1e-3).
_GROUP_DEFAULTS = {
    "sgd": dict(lr=1e-3, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0),
    "adam": dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0),
    "adamw": dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2),
    "adagrad": dict(lr=1e-2, lr_decay=0.0, weight_decay=0.0, initial_accumulator_value=0.0,
                    eps=1e-10),
    "reduce": dict(lr=0.0),
}
_GROUP_KEYS = ("kind", "lr", "momentum", "dampening", "nesterov", "betas", "eps",
               "weight_decay", "lr_decay", "initial_accumulator_value", "average")


def _group_tuple(i, g):
    """Optimizer group i (a dict) as the settings tuple _ps.Client.declare takes."""
    if not isinstance(g, dict):
        raise ConfigError(f"declare: optimizer group {i} is not a dict")
    for k in g:
        if k not in _GROUP_KEYS:
            raise ConfigError(f"declare: optimizer group {i}: unknown key {k!r} (known: "
                              f"{', '.join(_GROUP_KEYS)})")
    kind = g.get("kind")
    if kind not in _GROUP_DEFAULTS:
        raise ConfigError(f"declare: optimizer group {i}: kind {kind!r}, expected one of "
                          f"{', '.join(_GROUP_DEFAULTS)}")
    d = dict(_GROUP_DEFAULTS[kind])
    d.update(g)
    try:
        b1, b2 = d.get("betas", (0.0, 0.0))
        return (kind, float(d["lr"]), float(d.get("momentum", 0.0)),
                float(d.get("dampening", 0.0)), bool(d.get("nesterov", False)), float(b1),
                float(b2), float(d.get("eps", 0.0)), float(d.get("weight_decay", 0.0)),
                float(d.get("lr_decay", 0.0)), float(d.get("initial_accumulator_value", 0.0)),
                bool(d.get("average", True)))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"declare: optimizer group {i}: {e}") from None


# model.embeddings[]'s keys a declared table takes (docs/embeddings.md).
_TABLE_KEYS = ("name", "dim", "init", "scale", "value", "optimizer", "lr", "eps", "beta1",
               "beta2", "initial_accumulator", "l1", "l2", "ftrl_beta", "admission", "ttl",
               "max_rows")
_TABLE_FLOATS = ("lr", "eps", "beta1", "beta2", "initial_accumulator", "l1", "l2", "ftrl_beta")


def _table_tuple(i, t):
    """Table i (a dict of model.embeddings keys) as the tuple _ps.Client.declare_tables takes."""
    if not isinstance(t, dict):
        raise ConfigError(f"declare_tables: table {i} is not a dict")
    for k in t:
        if k not in _TABLE_KEYS:
            raise ConfigError(f"declare_tables: table {i}: unknown key {k!r} (known: "
                              f"{', '.join(_TABLE_KEYS)})")
    name = t.get("name")
    if not isinstance(name, str):
        raise ConfigError(f"declare_tables: table {i}: name must be a str, got {name!r}")
    init = t.get("init", "uniform")
    if "scale" in t and init not in ("uniform", "normal"):
        raise ConfigError(f"declare_tables: table {name!r}: scale is not used by init {init!r}")
    if "value" in t and init != "const":
        raise ConfigError(f"declare_tables: table {name!r}: value is not used by init {init!r}")
    ints = {}
    for k, hi in (("dim", 4096), ("admission", 255), ("ttl", 1 << 30), ("max_rows", 1 << 40)):
        v = t.get(k, 0 if k != "dim" else None)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= hi:
            raise ConfigError(f"declare_tables: table {name!r}: {k} must be an integer in "
                              f"{1 if k == 'dim' else 0}..{hi}, got {v!r}")
        ints[k] = v
    try:
        fl = [float(t.get(k, 0.0)) for k in _TABLE_FLOATS]
        init_value = float(t.get("scale", t.get("value", 0.0)))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"declare_tables: table {name!r}: {e}") from None
    return (name, ints["dim"], init, init_value, t.get("optimizer"), *fl, ints["admission"],
            ints["ttl"], ints["max_rows"])


class Client(_ps.Client):
    """A connection to every shard of a config, as worker `rank`.

    Client(config=None, rank=None, *, monitor=False, reader=False)

    config: a path or a ps.Config ($PS_CONFIG when None); rank: the worker
    rank ($PS_RANK, else $JOB_COMPLETION_INDEX, when None); monitor=True connects as a monitor (rank -1)
    that only reads stats and asks for checkpoints, and succeeds with shards
    down (shard_error(k) says why). reader=True connects as a reader (rank
    -2, ps.RANK_READER): it proves the reader key (security.reader_key_file
    or $PS_READER_KEY_FILE) instead of the cluster secret, may pull tensors
    and rows and read stats, and every push, row push, declaration or
    checkpoint request it makes is refused by the shards (ps.RefusedError,
    "a reader may only pull: push refused"); it is not a worker (no clock). Raises ps.ConfigError (file:line),
    ps.AuthError, ps.RefusedError, ps.ConnectionError, ps.TimeoutError.

    Use it in the process that created it: after fork() the child gets
    ps.ForkError (start workers with the 'spawn' or 'forkserver' method).
    """

    def __init__(self, config=None, rank=None, *, monitor=False, reader=False):
        cfg = _config_arg(config)
        if monitor and reader:
            raise ConfigError("Client: monitor=True and reader=True: choose one role")
        super().__init__(cfg, RANK_READER if reader else -1 if monitor else _rank_arg(rank))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        state = "closed" if self.closed else "open"
        return f"<ps.Client rank={self.rank} {self.config.path if self.config else '?'} {state}>"

    # The *_async forms: the same arguments, a Handle back.
    def push_async(self, tensors, clock=None, end_clock=True):
        """push() without waiting: a Handle whose wait() returns None."""
        return self.push(tensors, clock, end_clock, True)

    def pull_async(self, tensors, min_version=None):
        """pull() without waiting: a Handle whose wait() returns the lowest version."""
        return self.pull(tensors, min_version, True)

    def pushpull_async(self, grads, out, clock=None, end_clock=True, min_version=None,
                       after_clock=False):
        """pushpull() without waiting: a Handle whose wait() returns the lowest version."""
        return self.pushpull(grads, out, clock, end_clock, min_version, after_clock, True)

    def pull_rows(self, table, ids, out=None, min_version=None, asynchronous=False):
        """Rows of table for ids into out (len(ids) x dim float32, allocated when None)."""
        if out is None:
            import numpy
            tables = self.tables  # the config's and the declared ones
            out = numpy.empty((len(ids), tables[table] if table in tables else 0),
                              numpy.float32)
        return super().pull_rows(table, ids, out, min_version, asynchronous)

    def pull_rows_async(self, table, ids, out=None, min_version=None):
        """pull_rows() without waiting: a Handle whose wait() returns out."""
        return self.pull_rows(table, ids, out, min_version, True)

    def push_rows_async(self, table, ids, grads, clock=None, fp16=False):
        """push_rows() without waiting: a Handle whose wait() returns None."""
        return self.push_rows(table, ids, grads, clock, fp16, True)

    def declare(self, params, groups=None, group_of=None):
        """Declares the model's tensors: params {name: float32 array} in the model's order
        (a config without a model); every array then holds the shards' values.

        groups: optimizer groups the shards apply (torch param_groups), a list of dicts with
        keys kind ("sgd", "adam", "adamw", "adagrad", "reduce"), lr, momentum, dampening,
        nesterov, betas, eps, weight_decay, lr_decay, initial_accumulator_value, average;
        a missing key takes torch's default for the kind (average: True, the mean of the
        workers' gradients). group_of: each parameter's group index (default all 0 when
        there is one group). None: the config's optimizer section updates every tensor."""
        if groups is None:
            if group_of is not None:
                raise ConfigError("declare: group_of given without groups")
            return super().declare(params)
        if isinstance(groups, dict):
            groups = [groups]
        return super().declare(params, [_group_tuple(i, g) for i, g in enumerate(groups)],
                               None if group_of is None else [int(x) for x in group_of])

    def declare_tables(self, tables):
        """Declares embedding tables beside the config's model.embeddings: tables is a list
        of dicts with model.embeddings[]'s keys (name, dim, init, scale or value, optimizer,
        lr, eps, beta1, beta2, initial_accumulator, l1, l2, ftrl_beta, admission, ttl,
        max_rows), a missing key taking its YAML default. Every worker declares the same
        list (rank 0's creates the tables; the others wait for it); then pull_rows and
        push_rows take the tables by name and Client.tables lists them with their dim.
        Raises ps.ConfigError (an unknown key, a value out of bounds, a name of the config's
        tables, a declaration that differs from the shards': the table, field and both
        values named), ps.StateError (declared already), ps.TimeoutError (rank 0 never
        declared)."""
        if isinstance(tables, dict):
            tables = [tables]
        return super().declare_tables([_table_tuple(i, t) for i, t in enumerate(tables)])

    def stats(self, shard=None):
        """The counters of shard (a dict), or a list of every shard's when None."""
        if shard is None:
            return [super(Client, self).stats(k) for k in range(self.config.nshards)]
        return super().stats(shard)

    def checkpoint(self, shard=None, write=True):
        """Asks shard (every shard when None) to write its checkpoint now; the
        stats dict(s) with checkpoint_status/path/bytes/seconds/error."""
        if shard is None:
            return [super(Client, self).checkpoint(k, write) for k in range(self.config.nshards)]
        return super().checkpoint(shard, write)


def connect(config=None, rank=None):
    """Client(config, rank): a worker's connection."""
    return Client(config, rank)


def reader(config=None):
    """Client(config, reader=True): a read-only connection (pulls tensors and rows)."""
    return Client(config, reader=True)


def monitor(config=None):
    """Client(config, monitor=True): a monitor's connection (stats, checkpoints)."""
    return Client(config, monitor=True)
