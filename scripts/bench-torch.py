#!/usr/bin/python3
"""bench-torch.py - PyTorch reference for build/rel/tests/bench_train and ps-local.sh.

Trains the same two models as our `mlp` and `cnn` presets with PyTorch's
default layers (NCHW, float32, softmax cross-entropy, plain SGD), batch 64,
on the CPU, and prints one JSON line per measurement:

  {"impl":"pytorch","model":"cnn","batch":64,"steps":...,"ms_per_step":...,"samples_per_s":...}

Default: one process, torch.set_num_threads(1), mlp then cnn; each step is
forward, loss, backward, optimizer.step(); a few warm-up steps, then timed
for --seconds.

--ddp: 2 processes (torch.distributed, gloo, 127.0.0.1 on a free port),
DistributedDataParallel, 1 thread each, batch 64 per process, cnn; prints
the total samples/s of both processes ("model":"cnn","mode":"ddp").

Data: random by default (speed does not depend on it); --data DIR reads
Fashion-MNIST from the IDX .gz files in DIR (Debian's dataset-fashion-mnist
installs them under /usr/share/datasets/fashion-mnist).

Needs Debian's python3-torch (apt-get install python3-torch), run with
/usr/bin/python3; no other dependencies.
"""
import argparse
import gzip
import json
import os
import socket
import struct
import sys
import time

# one thread unless told otherwise: must be set before torch loads its BLAS
# (Debian's torch calls the system OpenBLAS, pthread build) and OpenMP
for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    if not os.environ.get(_v, "").isdigit():
        os.environ[_v] = "1"

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    sys.exit("bench-torch.py: PyTorch missing: apt-get install -y python3-torch "
             "(and run this script with /usr/bin/python3)")


def make_model(name):
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(),
                             nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    if name == "cnn":
        return nn.Sequential(nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(3136, 256), nn.ReLU(), nn.Linear(256, 10))
    raise ValueError(name)


def read_idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    magic, = struct.unpack(">I", raw[:4])
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    t = torch.frombuffer(bytearray(raw[4 + 4 * ndim:]), dtype=torch.uint8)
    return t.reshape(dims)


def load_batches(data_dir, batch, count=64):
    """`count` batches (x: batch x 1 x 28 x 28 float32, y: batch int64)."""
    if data_dir:
        xs = read_idx(os.path.join(data_dir, "train-images-idx3-ubyte.gz"))
        ys = read_idx(os.path.join(data_dir, "train-labels-idx1-ubyte.gz"))
        n = min(count, xs.shape[0] // batch)
        x = xs[:n * batch].float().div_(255.0).reshape(n, batch, 1, 28, 28)
        y = ys[:n * batch].long().reshape(n, batch)
        return [(x[i].contiguous(), y[i].contiguous()) for i in range(n)]
    g = torch.Generator().manual_seed(1)
    return [(torch.rand(batch, 1, 28, 28, generator=g),
             torch.randint(0, 10, (batch,), generator=g)) for _ in range(count)]


def run_steps(model, opt, batches, seconds, warmup):
    """Warm-up steps, then steps for `seconds`; returns (steps, elapsed)."""
    def step(i):
        x, y = batches[i % len(batches)]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    for i in range(warmup):
        step(i)
    steps, t0 = 0, time.perf_counter()
    while True:
        step(steps)
        steps += 1
        t = time.perf_counter() - t0
        if t >= seconds:
            return steps, t


def single(args):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    batches = load_batches(args.data, args.batch)
    for name in args.models:
        model = make_model(name)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=args.momentum)
        steps, t = run_steps(model, opt, batches, args.seconds, args.warmup)
        print(json.dumps({"impl": "pytorch", "model": name, "batch": args.batch,
                          "threads": torch.get_num_threads(), "steps": steps,
                          "ms_per_step": round(t * 1e3 / steps, 3),
                          "samples_per_s": round(steps * args.batch / t, 1),
                          "torch": torch.__version__}), flush=True)


def ddp_worker(rank, world, port, args, queue):
    import torch.distributed as dist
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(make_model("cnn"))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=args.momentum)
    batches = load_batches(args.data, args.batch, count=16)
    if args.data:   # each rank its own part of the data
        batches = batches[rank::world]
    # every rank must do the same number of steps (allreduce): warm up, then
    # time a fixed step count agreed from rank 0's warm-up speed
    for i in range(args.warmup):
        x, y = batches[i % len(batches)]
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    t0 = time.perf_counter()
    for i in range(2):
        x, y = batches[i % len(batches)]
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    est = torch.tensor([max(1, int(args.seconds / ((time.perf_counter() - t0) / 2)))])
    dist.broadcast(est, 0)
    n = int(est.item())
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(n):
        x, y = batches[i % len(batches)]
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    t = time.perf_counter() - t0
    queue.put((rank, n, t))
    dist.destroy_process_group()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ddp(args):
    import torch.multiprocessing as mp
    world = 2
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=ddp_worker, args=(r, world, port, args, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if any(p.exitcode != 0 for p in procs):
        sys.exit("bench-torch.py: a DDP process failed")
    res = sorted(queue.get() for _ in range(world))
    steps = res[0][1]
    t = max(r[2] for r in res)
    per = [round(r[1] * args.batch / r[2], 1) for r in res]
    print(json.dumps({"impl": "pytorch", "model": "cnn", "mode": "ddp", "backend": "gloo",
                      "processes": world, "batch": args.batch, "steps": steps,
                      "ms_per_step": round(t * 1e3 / steps, 3),
                      "samples_per_s": round(world * steps * args.batch / t, 1),
                      "per_process_samples_per_s": per,
                      "torch": torch.__version__}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 epilog="Prints one JSON line per measurement.")
    ap.add_argument("--seconds", type=float, default=5, help="timed seconds per model (default 5)")
    ap.add_argument("--batch", type=int, default=64, help="batch per process (default 64)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed warm-up steps (default 3)")
    ap.add_argument("--models", nargs="+", default=["mlp", "cnn"], choices=["mlp", "cnn"],
                    help="single-process models (default mlp cnn)")
    ap.add_argument("--momentum", type=float, default=0.0,
                    help="SGD momentum (default 0: plain SGD)")
    ap.add_argument("--data", metavar="DIR", nargs="?", const="/usr/share/datasets/fashion-mnist",
                    default=None, help="Fashion-MNIST IDX .gz folder instead of random data "
                    "(default folder /usr/share/datasets/fashion-mnist)")
    ap.add_argument("--ddp", action="store_true",
                    help="2 processes, gloo, DistributedDataParallel, cnn; total samples/s")
    args = ap.parse_args()
    if args.seconds <= 0 or args.batch < 1:
        ap.error("--seconds must be > 0 and --batch >= 1")
    ddp(args) if args.ddp else single(args)


if __name__ == "__main__":
    main()
