"""A ps.torch worker of test_reshard_live.py: an Embedding of table e (the
YAML's: zeros, sgd at lr 1) and a declared dense layer under one
DistributedOptimizer (op=Sum, the dense part at lr 0). Each step pushes
integer-valued row gradients, so at the end every row is minus their
exact sum over the workers, which the worker checks. Config and rank come
from $PS_CONFIG / $PS_RANK as ps-local.sh sets them."""
import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
import ps  # noqa: E402
import ps.torch as pst  # noqa: E402

V = 40

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--pace-ms", type=float, default=0)
ap.add_argument("--workers", type=int, default=2)
a = ap.parse_args()


def ids_of(rank, step):
    return np.array([(rank * 7 + step * 3 + j * j) % V for j in range(8)], np.int64)


def coef_of(rank, step):
    return np.array([((j + rank + step) % 5) - 2 for j in range(8)], np.float32)


torch.set_num_threads(1)
with ps.Client(None, None) as c:
    rank = c.rank
    emb = pst.Embedding("e", client=c)
    model = torch.nn.ModuleDict({"emb": emb, "fc": torch.nn.Linear(1, 1)})
    opt = pst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                   model.named_parameters(), client=c, model=model, op=pst.Sum)
    for step in range(a.steps):
        opt.zero_grad()
        out = emb(torch.from_numpy(ids_of(rank, step)))
        coef = torch.from_numpy(coef_of(rank, step)).unsqueeze(1)
        ((out * coef).sum() + 0 * model["fc"].weight.sum()).backward()
        opt.step()
        if a.pace_ms:
            time.sleep(a.pace_ms / 1000)
    want = np.zeros((V, c.config.tables["e"]), np.float32)
    for r in range(a.workers):
        for s in range(a.steps):
            for i, k in zip(ids_of(r, s), coef_of(r, s)):
                want[i] -= k
    got = c.pull_rows("e", np.arange(V), min_version=a.steps)
    assert np.array_equal(got, want), f"rows {got[:3]} != the exact sums {want[:3]}"
    print("worker", rank, "checked the rows of", a.workers, "workers", flush=True)
    print("worker", rank, "done at clock", c.clock(), flush=True)
