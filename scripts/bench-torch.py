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
DistributedDataParallel, 1 thread each, batch 64 per process, each model of
--models; prints the total samples/s of both processes ("mode":"ddp").
--ddp --epoch: instead of timing --seconds, trains one whole epoch of
Fashion-MNIST (--data; each process a shuffled half, momentum --momentum,
lr --lr) and reports samples/s over the epoch and the test accuracy after it
("test_accuracy"), as a 2-shard 2-worker cluster of ours reports its own.
--init ours: weights uniform in +-sqrt(6 / fan_in) and zero biases, the
presets' initialization (PyTorch's default draws from +-1/sqrt(fan_in)), so
that one epoch of each trains the same model the same way; --normalize
MEAN,STD feeds (pixel / 255 - MEAN) / STD as ps-worker does (worker/dataset.h).

--device cuda (scripts/gpu-check.sh): the same models on the GPU, eager
mode, batches uploaded from pinned host memory each step (non_blocking, as a
DataLoader with pin_memory does) as our worker uploads its own; --tf32
off|conv|all sets torch.backends.cudnn.allow_tf32 (convolutions) and
torch.backends.cuda.matmul.allow_tf32 (matmuls) as our train.tf32 does
(conv = PyTorch's default: convolutions on TF32, matmuls full fp32);
--steps N times exactly N steps after the warm-up, between two
torch.cuda.synchronize() calls, and reports first_step_ms (the first warm-up
step: cuDNN's and cuBLAS's set-up) too.

Data: random by default (speed does not depend on it); --data DIR reads
Fashion-MNIST from the IDX .gz files in DIR (Debian's dataset-fashion-mnist
installs them under /usr/share/datasets/fashion-mnist).

Needs Debian's python3-torch (apt-get install python3-torch), run with
/usr/bin/python3, or any python3 with torch (on the GPU machines:
/opt/torch/.venv/bin/python3); no other dependencies.
"""
import argparse
import gzip
import json
import os
import socket
import struct
import sys
import time

# one thread unless told otherwise (--threads N): must be set before torch
# loads its BLAS (Debian's torch calls the system OpenBLAS, pthread build)
# and OpenMP
_threads = "1"
for _i, _a in enumerate(sys.argv):
    if _a == "--threads" and _i + 1 < len(sys.argv):
        _threads = sys.argv[_i + 1]
    elif _a.startswith("--threads="):
        _threads = _a.split("=", 1)[1]
for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    if not os.environ.get(_v, "").isdigit():
        os.environ[_v] = _threads if _threads.isdigit() else "1"

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    sys.exit("bench-torch.py: PyTorch missing: apt-get install -y python3-torch "
             "(and run this script with /usr/bin/python3)")


def init_ours(model):
    """Our presets' initialization: U(+-sqrt(6 / fan_in)) weights, zero biases."""
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            fan_in = m.weight[0].numel()
            bound = (6.0 / fan_in) ** 0.5
            with torch.no_grad():
                m.weight.uniform_(-bound, bound)
                m.bias.zero_()
    return model


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


def run_steps(model, opt, batches, seconds, warmup, device=None, nsteps=0):
    """Warm-up steps, then steps for `seconds` (or exactly `nsteps`);
    returns (steps, elapsed, first step's seconds)."""
    cuda = device is not None and device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def step(i):
        x, y = batches[i % len(batches)]
        if device is not None:
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    sync()
    t_first = time.perf_counter()
    for i in range(max(warmup, 1)):
        step(i)
        if i == 0:
            sync()
            t_first = time.perf_counter() - t_first
    sync()
    steps, t0 = 0, time.perf_counter()
    if nsteps:
        for steps in range(1, nsteps + 1):
            step(steps)
        sync()
        return nsteps, time.perf_counter() - t0, t_first
    while True:
        step(steps)
        steps += 1
        t = time.perf_counter() - t0
        if t >= seconds:
            return steps, t, t_first


def single(args):
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    batches = load_batches(args.data, args.batch)
    device, extra = None, {}
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("bench-torch.py: --device cuda: torch.cuda.is_available() is False "
                     f"(torch {torch.__version__}, built for CUDA {torch.version.cuda})")
        device = torch.device("cuda")
        torch.backends.cudnn.allow_tf32 = args.tf32 in ("conv", "all")
        torch.backends.cuda.matmul.allow_tf32 = args.tf32 == "all"
        torch.backends.cudnn.benchmark = args.cudnn_benchmark
        batches = [(x.pin_memory(), y.pin_memory()) for x, y in batches]
        extra = {"gpu": torch.cuda.get_device_name(0), "cuda": torch.version.cuda,
                 "cudnn": torch.backends.cudnn.version(), "tf32": args.tf32,
                 "cudnn_benchmark": args.cudnn_benchmark}
    for name in args.models:
        model = make_model(name).to(device) if device else make_model(name)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=args.momentum)
        steps, t, t_first = run_steps(model, opt, batches, args.seconds, args.warmup,
                                      device, args.steps)
        print(json.dumps({"impl": "pytorch", "model": name, "batch": args.batch,
                          "device": args.device, "threads": torch.get_num_threads(),
                          "steps": steps, "ms_per_step": round(t * 1e3 / steps, 3),
                          "samples_per_s": round(steps * args.batch / t, 1),
                          "first_step_ms": round(t_first * 1e3, 3),
                          "torch": torch.__version__, **extra}), flush=True)


def normalize(x, args):
    """(x - mean) / std for --normalize MEAN,STD, else x."""
    if not args.normalize:
        return x
    mean, std = (float(v) for v in args.normalize.split(","))
    return x.sub_(mean).div_(std)


def ddp_epoch(rank, world, model, opt, args, queue):
    """One epoch over this rank's half of the training set, then the test
    accuracy (rank 0 evaluates, the other waits at the barrier)."""
    import torch.distributed as dist
    xs = read_idx(os.path.join(args.data, "train-images-idx3-ubyte.gz"))
    ys = read_idx(os.path.join(args.data, "train-labels-idx1-ubyte.gz"))
    g = torch.Generator().manual_seed(42 + args.seed)
    order = torch.randperm(xs.shape[0], generator=g)
    part = order[rank::world]
    steps = part.shape[0] // args.batch
    x_all = normalize(xs.float().div_(255.0).reshape(-1, 1, 28, 28), args)
    y_all = ys.long()
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(steps):
        idx = part[i * args.batch:(i + 1) * args.batch]
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x_all[idx]), y_all[idx]).backward()
        opt.step()
    t = time.perf_counter() - t0
    acc = -1.0
    if rank == 0:
        tx = normalize(read_idx(os.path.join(args.data, "t10k-images-idx3-ubyte.gz"))
                       .float().div_(255.0), args)
        ty = read_idx(os.path.join(args.data, "t10k-labels-idx1-ubyte.gz")).long()
        right = 0
        with torch.no_grad():
            for i in range(0, tx.shape[0], 1000):
                out = model.module(tx[i:i + 1000].reshape(-1, 1, 28, 28))
                right += int((out.argmax(1) == ty[i:i + 1000]).sum())
        acc = right / tx.shape[0]
    queue.put((rank, steps, t, acc))
    dist.barrier()


def ddp_worker(rank, world, port, args, queue, name):
    import torch.distributed as dist
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(args.seed)
    net = make_model(name)
    if args.init == "ours":
        init_ours(net)
    model = nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    if args.epoch:
        ddp_epoch(rank, world, model, opt, args, queue)
        dist.destroy_process_group()
        return
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
    queue.put((rank, n, t, -1.0))
    dist.destroy_process_group()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ddp(args):
    import torch.multiprocessing as mp
    world = 2
    ctx = mp.get_context("spawn")
    for name in args.models:
        queue = ctx.SimpleQueue()
        port = free_port()
        procs = [ctx.Process(target=ddp_worker, args=(r, world, port, args, queue, name))
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
        extra = {"epochs": 1, "test_accuracy": res[0][3]} if args.epoch else {}
        print(json.dumps({"impl": "pytorch", "model": name, "mode": "ddp", "backend": "gloo",
                          "processes": world, "batch": args.batch, "steps": steps,
                          "ms_per_step": round(t * 1e3 / steps, 3),
                          "samples_per_s": round(world * steps * args.batch / t, 1),
                          "per_process_samples_per_s": per, **extra,
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
                    help="2 processes, gloo, DistributedDataParallel, each of --models; "
                    "total samples/s")
    ap.add_argument("--epoch", action="store_true",
                    help="--ddp: one whole epoch of --data, then the test accuracy")
    ap.add_argument("--init", choices=["torch", "ours"], default="torch",
                    help="--ddp: PyTorch's default initialization or our presets' "
                    "(uniform +-sqrt(6/fan_in), zero biases)")
    ap.add_argument("--normalize", metavar="MEAN,STD", default="",
                    help="--epoch: feed (pixel/255 - MEAN) / STD (default: pixel/255)")
    ap.add_argument("--seed", type=int, default=0,
                    help="--ddp: seed of the initial weights and of --epoch's shuffle (default 0)")
    ap.add_argument("--lr", type=float, default=0.01, help="SGD learning rate (default 0.01)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="single-process models on the CPU (default) or the GPU")
    ap.add_argument("--steps", type=int, default=0,
                    help="time exactly this many steps instead of --seconds")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch.set_num_threads for single-process runs (default 1)")
    ap.add_argument("--tf32", choices=["off", "conv", "all"], default="conv",
                    help="--device cuda: TF32 for nothing, convolutions (default, "
                    "PyTorch's own default) or convolutions and matmuls")
    ap.add_argument("--cudnn-benchmark", action="store_true",
                    help="--device cuda: torch.backends.cudnn.benchmark = True "
                    "(default False, PyTorch's default)")
    args = ap.parse_args()
    if args.seconds <= 0 or args.batch < 1 or args.steps < 0 or args.threads < 1:
        ap.error("--seconds must be > 0, --batch and --threads >= 1, --steps >= 0")
    if args.ddp and args.device != "cpu":
        ap.error("--ddp runs on the CPU only")
    if args.epoch and not (args.ddp and args.data):
        ap.error("--epoch needs --ddp and --data")
    ddp(args) if args.ddp else single(args)


if __name__ == "__main__":
    main()
