"""The reference for bench_torch.py: the Fashion-MNIST cnn under PyTorch's
DistributedDataParallel (gloo, one process per rank, on this machine).

    python3 ddp_cnn.py --world 2 [--epochs 1] [--batch 64] [--limit N] [--threads 1]

Prints one JSON line per rank: samples/s and test accuracy. The model, the
data split (every world-th sample from the rank), the optimizer (SGD,
momentum 0.9, lr 0.01) and the batch are examples/cnn_fashion_mnist.py's.
"""
import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from cnn_fashion_mnist import Net  # noqa: E402
from fashion_mnist import evaluate, load  # noqa: E402


def run(rank, args, port):
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=args.world)
    torch.manual_seed(0)
    x, y = load("train")
    if args.limit:
        x, y = x[:args.limit], y[:args.limit]
    x, y = x[rank::args.world], y[rank::args.world]
    tx, ty = load("t10k")
    model = torch.nn.parallel.DistributedDataParallel(Net())
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    steps = len(x) // args.batch
    seen = 0
    t0 = time.time()
    for _ in range(args.epochs):
        perm = torch.randperm(len(x))
        for s in range(steps):
            idx = perm[s * args.batch:(s + 1) * args.batch]
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
            seen += len(idx)
    dt = time.time() - t0
    acc = evaluate(model.module, tx, ty)
    print(json.dumps({"rank": rank, "samples_per_s": seen / dt, "test_accuracy": acc,
                      "samples": seen, "seconds": dt}), flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(args, port), nprocs=args.world)


if __name__ == "__main__":
    main()
