"""Click logs in Criteo's format (ps-ctrgen writes them) as numpy arrays.

    from criteo import load
    y, dense, cats = load("train.tsv")   # y float32 [n]; dense float32 [n, 13]: log(1 + x)
                                         # for x > 0, else 0; cats uint64 [n, 26]: ids
Each categorical value becomes the id the C worker's ctr preset gives it
(worker/criteo.c, ps_criteo_id: a 64-bit mix of the field number and the
value, missing values an id of their own per field), so a Python model and
`ps-worker` train the same rows of the same tables. Plain or gzip files; a
malformed line raises ValueError naming the file and line.
"""
import gzip

import numpy as np

NUM, CAT = 13, 26
_M1, _M2, _GOLD = np.uint64(0xbf58476d1ce4e5b9), np.uint64(0x94d049bb133111eb), \
    np.uint64(0x9e3779b97f4a7c15)


def criteo_id(field, value, missing):
    """ps_criteo_id over numpy arrays (uint64 arithmetic wraps, as C's)."""
    with np.errstate(over="ignore"):
        z = (np.uint64(field + 1) << np.uint64(56)) ^ value ^ \
            np.where(missing, np.uint64(0xa5a5a5a5a5a5a5a5), np.uint64(0))
        z = z + _GOLD
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def load(path, limit=0, part=(0, 1)):
    """(labels, dense, cats) of the first `limit` examples (0: all); part
    (k, n): only every n-th example from the k-th (a worker's share: the
    other lines are not parsed)."""
    opener = gzip.open if path.endswith(".gz") else open
    labels, nums, vals, miss = [], [], [], []
    k, n = part
    with opener(path, "rt") as f:
        for ln, line in enumerate(f, 1):
            if limit and ln > limit:
                break
            if (ln - 1) % n != k:
                continue
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 1 + NUM + CAT:
                raise ValueError(f"{path}:{ln}: {len(parts)} fields, expected {1 + NUM + CAT}")
            try:
                labels.append(float(parts[0]))
                nums.append([float(x) if x else 0.0 for x in parts[1:1 + NUM]])
                c = parts[1 + NUM:]
                vals.append([int(x, 16) if x else 0 for x in c])
                miss.append([not x for x in c])
            except ValueError as e:
                raise ValueError(f"{path}:{ln}: {e}") from None
    if not labels:
        raise ValueError(f"{path}: no examples")
    x = np.asarray(nums, np.float32)
    dense = np.where(x > 0, np.log1p(np.maximum(x, 0)), 0).astype(np.float32)
    v, m = np.asarray(vals, np.uint64), np.asarray(miss, bool)
    cats = np.empty_like(v)
    for fld in range(CAT):
        cats[:, fld] = criteo_id(fld, v[:, fld], m[:, fld])
    return np.asarray(labels, np.float32), dense, cats


def auc(y, p):
    """Area under the ROC curve (ties averaged)."""
    order = np.argsort(p, kind="mergesort")
    ranks = np.empty(len(p), np.float64)
    sp = p[order]
    i = 0
    while i < len(p):
        j = i
        while j + 1 < len(p) and sp[j + 1] == sp[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    pos = y > 0.5
    npos, nneg = pos.sum(), (~pos).sum()
    if npos == 0 or nneg == 0:
        return float("nan")
    return float((ranks[pos].sum() - npos * (npos + 1) / 2) / (npos * nneg))
