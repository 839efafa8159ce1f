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

__all__ = [
    "Client", "Config", "Handle", "connect", "monitor", "strerror", "version",
    "Error", "ArrayError", "AuthError", "ClosedError", "ConfigError", "ConnectionError",
    "ForkError", "NotFiniteError", "ProtocolError", "RefusedError", "StateError",
    "TimeoutError", "TooBigError", "UnknownNameError",
    "ENV_CONFIG", "ENV_RANK",
]

#: The environment variables the launchers (ps-local.sh, ps-cluster.sh,
#: ps.sbatch, ps-worker@.service) set for a --worker-cmd, read when Client
#: is given no config or rank.
ENV_CONFIG = "PS_CONFIG"
ENV_RANK = "PS_RANK"

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
    if rank is not None:
        return int(rank)
    text = os.environ.get(ENV_RANK)
    if text is None:
        raise ConfigError(f"no rank given and ${ENV_RANK} is not set "
                          "(the launchers set it for --worker-cmd; monitor=True for a monitor)")
    try:
        rank = int(text)
    except ValueError:
        raise ConfigError(f"${ENV_RANK}={text!r}: a worker rank (0, 1, ...) expected") from None
    if rank < 0:
        raise ConfigError(f"${ENV_RANK}={text!r}: a worker rank is 0 or more")
    return rank


class Client(_ps.Client):
    """A connection to every shard of a config, as worker `rank`.

    Client(config=None, rank=None, *, monitor=False)

    config: a path or a ps.Config ($PS_CONFIG when None); rank: the worker
    rank ($PS_RANK when None); monitor=True connects as a monitor (rank -1)
    that only reads stats and asks for checkpoints, and succeeds with shards
    down (shard_error(k) says why). Raises ps.ConfigError (file:line),
    ps.AuthError, ps.RefusedError, ps.ConnectionError, ps.TimeoutError.

    Use it in the process that created it: after fork() the child gets
    ps.ForkError (start workers with the 'spawn' or 'forkserver' method).
    """

    def __init__(self, config=None, rank=None, *, monitor=False):
        cfg = _config_arg(config)
        super().__init__(cfg, -1 if monitor else _rank_arg(rank))

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
            out = numpy.empty((len(ids), self.config.tables[table]
                               if table in self.config.tables else 0), numpy.float32)
        return super().pull_rows(table, ids, out, min_version, asynchronous)

    def pull_rows_async(self, table, ids, out=None, min_version=None):
        """pull_rows() without waiting: a Handle whose wait() returns out."""
        return self.pull_rows(table, ids, out, min_version, True)

    def push_rows_async(self, table, ids, grads, clock=None, fp16=False):
        """push_rows() without waiting: a Handle whose wait() returns None."""
        return self.push_rows(table, ids, grads, clock, fp16, True)

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


def monitor(config=None):
    """Client(config, monitor=True): a monitor's connection (stats, checkpoints)."""
    return Client(config, monitor=True)
