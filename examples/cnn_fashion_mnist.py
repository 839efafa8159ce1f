"""The Fashion-MNIST cnn written in PyTorch, trained through the shards.

    scripts/ps-local.sh conf/pytorch.yaml --worker-cmd "python3 examples/cnn_fashion_mnist.py"

The same network as the C worker's `preset: cnn` (conv 5x5x32, pool, conv
5x5x64, pool, dense 256, dense 10). Each worker trains on its own part of
the training set (every size()-th sample from its rank), prints progress
(rank 0) and the test accuracy after each epoch. The lines marked "ps:"
are all that differs from a single-process PyTorch script.
"""
import argparse
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import ps.torch as pst                                  # ps:
from fashion_mnist import evaluate, load


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        self.fc1 = nn.Linear(64 * 7 * 7, 256)
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64, help="per worker and step")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--limit", type=int, default=0, help="train on the first N samples only")
    ap.add_argument("--test-limit", type=int, default=0, help="test on the first N samples only")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--channels-last", action="store_true",
                    help="keep the conv weights channels-last (NHWC): oneDNN's faster layout on "
                         "the CPU, about 1.2x here")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    pst.init()                                          # ps: $PS_CONFIG, $PS_RANK
    rank, size = pst.rank(), pst.size()                 # ps:
    x, y = load("train")
    if args.limit:
        x, y = x[:args.limit], y[:args.limit]
    x, y = x[rank::size], y[rank::size]                 # ps: this worker's part
    tx, ty = load("t10k")
    if args.test_limit:
        tx, ty = tx[:args.test_limit], ty[:args.test_limit]

    model = Net()
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    opt = pst.DistributedOptimizer(opt, named_parameters=model.named_parameters())  # ps:
    steps = len(x) // args.batch
    for epoch in range(args.epochs):
        perm = torch.randperm(len(x))
        t0, seen, loss_sum = time.time(), 0, 0.0
        for s in range(steps):
            idx = perm[s * args.batch:(s + 1) * args.batch]
            opt.zero_grad()
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            seen += len(idx)
            loss_sum += loss.item()
            if rank == 0 and (s + 1) % 100 == 0:
                print(f"epoch {epoch + 1} step {s + 1}/{steps} loss {loss_sum / (s + 1):.4f} "
                      f"{seen / (time.time() - t0):.0f} samples/s", flush=True)
        dt = time.time() - t0
        acc = evaluate(model, tx, ty)
        print(f"worker {rank}: epoch {epoch + 1}: loss {loss_sum / max(steps, 1):.4f} "
              f"test accuracy {acc:.2f}% {seen / dt:.0f} samples/s ({seen} samples, {dt:.1f} s)",
              flush=True)
    pst.shutdown()                                      # ps:
    return 0


if __name__ == "__main__":
    sys.exit(main())
