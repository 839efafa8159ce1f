"""The integer-valued gradients the test workers push (pyworker.py; cworker.c
computes the same in C), so every expected weight is an exact sum."""


def gradient(ti, rank, clock, n):
    """The integer-valued gradient worker `rank` pushes for tensor ti at clock
    (pyworker.py and cworker.c compute the same)."""
    import numpy as np
    return (np.arange(n, dtype=np.int64) % 7 + (rank + 1) + 3 * clock + ti).astype(np.float32)


def row_ids(rank):
    """The ids a worker pushes each clock: duplicates included."""
    return [1, 2, 2, 5, 100 + rank]


def row_grads(rank, clock, dim):
    import numpy as np
    ids = row_ids(rank)
    return np.array([[(rank + 1) * (i + 1) + clock + d for d in range(dim)]
                     for i in range(len(ids))], np.float32)
