"""A DLRM-style click model on a Criteo-format log, through the shards.

    bin/ps-ctrgen --out train.tsv --samples 200000 --scale 0.01 --seed 5
    bin/ps-ctrgen --out test.tsv --samples 20000 --skip 200000 --scale 0.01 --seed 5
    scripts/ps-local.sh conf/pytorch-ctr.yaml --worker-cmd \\
        "python3 examples/dlrm_criteo.py --train train.tsv --test test.tsv"

A bottom MLP over the 13 numeric features, the 26 categorical fields looked
up in the shards' embedding table `cat` (conf/pytorch-ctr.yaml: dim 16,
rowwise adagrad on the shards), the 27 vectors concatenated (or, with
--interaction dot, their pairwise dot products: DLRM's interaction), a top
MLP, the logistic loss. The dense layers train
with Adam through DistributedOptimizer, the table's rows through the
ps.torch.Embedding module, both in the same clocks; ps.torch.Prefetch asks
for the next batch's rows while the current one computes. Prints progress
(worker 0) and each worker's held-out AUC and logloss.
"""
import argparse
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import ps.torch as pst                                  # ps:
from criteo import CAT, NUM, auc, load


class DLRM(nn.Module):
    """emb: the module that maps a [B, 26] batch of ids to [B, 26, dim]
    (the shards' table by default)."""

    def __init__(self, table="cat", dim=16, emb=None, interaction="cat"):
        super().__init__()
        if interaction not in ("cat", "dot"):
            raise ValueError(f"interaction {interaction!r}: cat or dot")
        self.interaction = interaction
        self.bottom = nn.Sequential(nn.Linear(NUM, 64), nn.ReLU(), nn.Linear(64, dim), nn.ReLU())
        self.emb = emb if emb is not None else pst.Embedding(table)   # ps: the shards' table
        n = CAT + 1
        # dot: the pairs i < j of the n x n dot products, as positions in the
        # flattened matrix: index_select's backward is a fraction of
        # advanced indexing's (14 against 33 ms at batch 1024 on one core)
        iu = torch.triu_indices(n, n, 1)
        self.register_buffer("pairs", iu[0] * n + iu[1], persistent=False)
        width = dim + n * (n - 1) // 2 if interaction == "dot" else n * dim
        self.top = nn.Sequential(nn.Linear(width, 128), nn.ReLU(), nn.Linear(128, 1))

    def forward(self, dense, cats):
        b = self.bottom(dense)                          # [B, dim]
        e = self.emb(cats)                              # [B, 26, dim]
        if self.interaction == "cat":                   # the 27 vectors side by side
            return self.top(torch.cat([b, e.flatten(1)], 1)).squeeze(1)
        z = torch.cat([b.unsqueeze(1), e], 1)           # [B, 27, dim]
        # torch 1.13's CPU bmm loops over the batch: the pairwise dots cost
        # 3 bmm of 1024 27x16 matrices a step, most of the step on one core
        dots = torch.bmm(z, z.transpose(1, 2)).flatten(1).index_select(1, self.pairs)
        return self.top(torch.cat([b, dots], 1)).squeeze(1)


def batches(y, dense, cats, batch, perm):
    for s in range(len(perm) // batch):
        idx = perm[s * batch:(s + 1) * batch]
        yield torch.from_numpy(y[idx]), torch.from_numpy(dense[idx]), cats[idx]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", required=True, help="Criteo-format log (ps-ctrgen --out)")
    ap.add_argument("--test", required=True, help="held-out log")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=1024, help="per worker and step")
    ap.add_argument("--lr", type=float, default=1e-3, help="Adam's, for the dense layers")
    ap.add_argument("--limit", type=int, default=0, help="first N training examples only")
    ap.add_argument("--no-prefetch", action="store_true")
    ap.add_argument("--interaction", default="cat", choices=("cat", "dot"),
                    help="how the 27 vectors meet: concatenated (default) or DLRM's pairwise "
                         "dot products")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    pst.init()                                          # ps:
    rank, size = pst.rank(), pst.size()                 # ps:
    t0 = time.time()
    y, dense, cats = load(args.train, args.limit, part=(rank, size))   # ps: this worker's part
    ty, tdense, tcats = load(args.test)
    if rank == 0:
        print(f"read {len(y)} training examples (this worker's part) and {len(ty)} test "
              f"examples in {time.time() - t0:.1f} s", flush=True)

    model = DLRM(interaction=args.interaction)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    opt = pst.DistributedOptimizer(opt, named_parameters=model.named_parameters(),  # ps:
                                   model=model)                                     # ps:
    g = torch.Generator().manual_seed(rank)
    for epoch in range(args.epochs):
        perm = torch.randperm(len(y), generator=g).numpy()
        data = batches(y, dense, cats, args.batch, perm)
        if not args.no_prefetch:
            data = pst.Prefetch(data, lambda b: {model.emb: b[2]})  # ps: next batch's rows
        t0, seen, loss_sum, steps = time.time(), 0, 0.0, len(perm) // args.batch
        for s, (yb, xb, cb) in enumerate(data):
            opt.zero_grad()
            loss = F.binary_cross_entropy_with_logits(model(xb, cb), yb)
            loss.backward()
            opt.step()
            seen += len(yb)
            loss_sum += loss.item()
            if rank == 0 and (s + 1) % 50 == 0:
                print(f"epoch {epoch + 1} step {s + 1}/{steps} logloss {loss_sum / (s + 1):.4f} "
                      f"{seen / (time.time() - t0):.0f} samples/s", flush=True)
        dt = time.time() - t0
        model.eval()
        with torch.no_grad():
            p = np.concatenate([torch.sigmoid(model(torch.from_numpy(tdense[i:i + 4096]),
                                                    tcats[i:i + 4096])).numpy()
                                for i in range(0, len(ty), 4096)])
        model.train()
        ll = float(-np.mean(ty * np.log(np.clip(p, 1e-7, 1)) +
                            (1 - ty) * np.log(np.clip(1 - p, 1e-7, 1))))
        print(f"worker {rank}: epoch {epoch + 1}: test AUC {auc(ty, p):.4f} logloss {ll:.4f} "
              f"{seen / dt:.0f} samples/s ({seen} samples, {dt:.1f} s)", flush=True)
    pst.shutdown()                                      # ps:
    return 0


if __name__ == "__main__":
    sys.exit(main())
