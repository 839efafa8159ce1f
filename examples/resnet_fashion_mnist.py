"""A small ResNet with BatchNorm on Fashion-MNIST, trained through the shards.

    scripts/ps-local.sh conf/pytorch.yaml --worker-cmd "python3 examples/resnet_fashion_mnist.py"

A model the C worker cannot express: residual blocks, batch normalisation.
Its BatchNorm running statistics are buffers, not gradients: passed as
`model=`, they are averaged through the shards every --buffers-every steps
and by sync_buffers() before each evaluation, so every worker evaluates the
same model. --device cuda trains on the GPU (gradients are copied to host
memory for the shards, the pulled weights back).
"""
import argparse
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import ps.torch as pst                                  # ps:
from fashion_mnist import evaluate, load


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                       nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (self.short(x) if self.short is not None else x))


class ResNet(nn.Module):
    """conv 3x3x16, blocks of 16, 32 (stride 2), 64 (stride 2), pool, dense 10."""

    def __init__(self, width=16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, width, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU())
        self.blocks = nn.Sequential(Block(width, width, 1), Block(width, 2 * width, 2),
                                    Block(2 * width, 4 * width, 2))
        self.fc = nn.Linear(4 * width, 10)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64, help="per worker and step")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--limit", type=int, default=0, help="train on the first N samples only")
    ap.add_argument("--test-limit", type=int, default=0, help="test on the first N samples only")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--buffers-every", type=int, default=50)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    torch.manual_seed(0)

    pst.init()                                          # ps:
    rank, size = pst.rank(), pst.size()                 # ps:
    x, y = load("train")
    if args.limit:
        x, y = x[:args.limit], y[:args.limit]
    x, y = x[rank::size], y[rank::size]                 # ps: this worker's part
    tx, ty = load("t10k")
    if args.test_limit:
        tx, ty = tx[:args.test_limit], ty[:args.test_limit]

    model = ResNet().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    opt = pst.DistributedOptimizer(opt, named_parameters=model.named_parameters(),  # ps:
                                   model=model, buffers_every=args.buffers_every)   # ps:
    steps = len(x) // args.batch
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr,
                                                total_steps=max(steps * args.epochs, 1))
    for epoch in range(args.epochs):
        perm = torch.randperm(len(x))
        t0, seen, loss_sum = time.time(), 0, 0.0
        for s in range(steps):
            idx = perm[s * args.batch:(s + 1) * args.batch]
            opt.zero_grad()
            loss = F.cross_entropy(model(x[idx].to(dev)), y[idx].to(dev))
            loss.backward()
            opt.step()
            sched.step()
            seen += len(idx)
            loss_sum += loss.item()
            if rank == 0 and (s + 1) % 50 == 0:
                print(f"epoch {epoch + 1} step {s + 1}/{steps} loss {loss_sum / (s + 1):.4f} "
                      f"{seen / (time.time() - t0):.0f} samples/s", flush=True)
        dt = time.time() - t0
        opt.sync_buffers()                              # ps: the same statistics everywhere
        acc = evaluate(model, tx, ty)
        print(f"worker {rank}: epoch {epoch + 1}: loss {loss_sum / max(steps, 1):.4f} "
              f"test accuracy {acc:.2f}% {seen / dt:.0f} samples/s ({seen} samples, {dt:.1f} s)",
              flush=True)
    pst.shutdown()                                      # ps:
    return 0


if __name__ == "__main__":
    sys.exit(main())
