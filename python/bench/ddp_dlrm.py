"""The plain-PyTorch reference for bench_dlrm.py: examples/dlrm_criteo.py's
model with a torch.nn.Embedding of sparse gradients (ids hashed into
--rows rows, id mod rows) under DistributedDataParallel, gloo, one process
per rank: dense layers with Adam, the table with Adagrad on its sparse
gradients (the shards' table uses rowwise adagrad, the same lr).

    python3 ddp_dlrm.py --train F --test F [--world 2] [--batch 1024] [--rows N]

Prints one JSON line per rank: samples/s (training steps only) and held-out AUC.
"""
import argparse
import json
import os
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from criteo import auc, load  # noqa: E402
from dlrm_criteo import DLRM  # noqa: E402


class Hashed(torch.nn.Module):
    def __init__(self, rows, dim):
        super().__init__()
        self.rows = rows
        self.emb = torch.nn.Embedding(rows, dim, sparse=True)
        torch.nn.init.uniform_(self.emb.weight, -0.01, 0.01)

    def forward(self, cats):
        return self.emb(torch.from_numpy((cats % np.uint64(self.rows)).astype(np.int64)))


def run(rank, args, port):
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=args.world)
    torch.manual_seed(0)
    y, dense, cats = load(args.train, args.limit, part=(rank, args.world))
    ty, tdense, tcats = load(args.test)
    net = DLRM(emb=Hashed(args.rows, 16), interaction=args.interaction)
    model = torch.nn.parallel.DistributedDataParallel(net)
    emb_params = list(net.emb.parameters())
    dense_params = [p for p in net.parameters() if all(p is not q for q in emb_params)]
    opt_d = torch.optim.Adam(dense_params, lr=1e-3)
    opt_e = torch.optim.Adagrad(emb_params, lr=0.05)
    g = torch.Generator().manual_seed(rank)
    perm = torch.randperm(len(y), generator=g).numpy()
    steps = len(perm) // args.batch
    t0 = time.time()
    for s in range(steps):
        idx = perm[s * args.batch:(s + 1) * args.batch]
        opt_d.zero_grad()
        opt_e.zero_grad()
        F.binary_cross_entropy_with_logits(model(torch.from_numpy(dense[idx]), cats[idx]),
                                           torch.from_numpy(y[idx])).backward()
        opt_d.step()
        opt_e.step()
    dt = time.time() - t0
    net.eval()
    with torch.no_grad():
        p = np.concatenate([torch.sigmoid(net(torch.from_numpy(tdense[i:i + 4096]),
                                              tcats[i:i + 4096])).numpy()
                            for i in range(0, len(ty), 4096)])
    print(json.dumps({"rank": rank, "samples_per_s": steps * args.batch / dt,
                      "auc": auc(ty, p)}), flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--rows", type=int, default=1 << 20)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--interaction", default="cat", choices=("cat", "dot"))
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(args, port), nprocs=args.world)


if __name__ == "__main__":
    main()
