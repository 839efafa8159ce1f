"""The reference for bench_torch.py: an example's model on Fashion-MNIST
under PyTorch's DistributedDataParallel, one process per rank, on this
machine (gloo on the CPU, NCCL on a GPU).

    python3 ddp_bench.py --world 2 [--model cnn|resnet] [--device cpu|cuda]
                         [--epochs 1] [--batch 64] [--limit N] [--threads 1]

Prints one JSON line per rank: samples/s and test accuracy. --no-comm runs
the same processes, data split, model and steps with no communication at all
(no process group, no DDP): each rank trains alone on its part. Its samples/s
bound what any distributed method that computes with torch can reach on this
machine. The model, the
data split (every world-th sample from the rank), the optimizer and the
batch are the example's (examples/cnn_fashion_mnist.py: SGD momentum 0.9
lr 0.01; examples/resnet_fashion_mnist.py: SGD momentum 0.9, weight decay
5e-4, OneCycle to lr 0.05).
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
from resnet_fashion_mnist import ResNet  # noqa: E402
from fashion_mnist import evaluate, load  # noqa: E402


def run(rank, args, port):
    torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank % torch.cuda.device_count())
    if not args.no_comm:
        dist.init_process_group("nccl" if cuda else "gloo",
                                init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=args.world)
    dev = torch.device(args.device)
    torch.manual_seed(0)
    x, y = load("train")
    if args.limit:
        x, y = x[:args.limit], y[:args.limit]
    x, y = x[rank::args.world], y[rank::args.world]
    tx, ty = load("t10k")
    if args.test_limit:
        tx, ty = tx[:args.test_limit], ty[:args.test_limit]
    net = (Net() if args.model == "cnn" else ResNet()).to(dev)
    if args.channels_last:
        net = net.to(memory_format=torch.channels_last)
    model = net if args.no_comm else torch.nn.parallel.DistributedDataParallel(
        net, device_ids=[dev.index or 0] if cuda else None)
    steps = len(x) // args.batch
    if args.model == "cnn":
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        sched = None
    else:
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr,
                                                    total_steps=max(steps * args.epochs, 1))
    seen = 0
    t0 = time.time()
    for _ in range(args.epochs):
        perm = torch.randperm(len(x))
        for s in range(steps):
            idx = perm[s * args.batch:(s + 1) * args.batch]
            opt.zero_grad()
            F.cross_entropy(model(x[idx].to(dev)), y[idx].to(dev)).backward()
            opt.step()
            if sched:
                sched.step()
            seen += len(idx)
    if cuda:
        torch.cuda.synchronize()
    dt = time.time() - t0
    acc = evaluate(net, tx, ty)
    print(json.dumps({"rank": rank, "samples_per_s": seen / dt, "test_accuracy": acc,
                      "samples": seen, "seconds": dt}), flush=True)
    if not args.no_comm:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--model", default="cnn", choices=("cnn", "resnet"))
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--lr", type=float, default=None, help="default: the example's")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--test-limit", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--channels-last", action="store_true",
                    help="conv weights channels-last, as the example's flag")
    ap.add_argument("--no-comm", action="store_true",
                    help="each rank trains alone: the compute-only ceiling")
    args = ap.parse_args()
    if args.lr is None:
        args.lr = 0.01 if args.model == "cnn" else 0.05
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(args, port), nprocs=args.world)


if __name__ == "__main__":
    main()
