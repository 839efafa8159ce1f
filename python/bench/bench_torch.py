"""The PyTorch path against DDP and against the C worker, in one run.

    build/pyvenv/bin/python python/bench/bench_torch.py [--limit N] [--epochs E]
        [--mode sync|async] [--model cnn|resnet] [--device cpu|cuda] [--workers N]
        [--test-limit N] [--layout channels-last|nchw] [--json FILE]

(`make bench-pytorch` runs it; BENCHMARKS.md records the figures.) Three
runs of the Fashion-MNIST cnn, batch 64 per worker, SGD momentum 0.9 lr 0.01,
one torch/oneDNN/OpenBLAS thread per worker, the torch runs' conv weights
channels-last (oneDNN's faster layout on the CPU, about 1.2x the NCHW
default's samples/s here; --layout nchw for the default), on this machine:

  ddp   torch DistributedDataParallel, gloo, 2 processes (ddp_cnn.py)
  ps    2 shards + 2 Python workers (examples/cnn_fashion_mnist.py under
        scripts/ps-local.sh, conf/pytorch.yaml's cluster)
  c     2 shards + 2 ps-worker processes (preset cnn, the same optimizer)
  alone the ddp processes with no communication at all (ddp_bench.py
        --no-comm): the most any method computing with torch reaches here

and prints each one's samples/s per worker (the mean of the workers) and
test accuracy, then ps/ddp and ps/c. --model resnet (examples/
resnet_fashion_mnist.py, which the C worker cannot express: no c run) and
--device cuda (DDP on NCCL; one GPU holds one DDP rank, so --workers 1 there)
give the GPU comparison `make gpu-check` records. Each run's own figures come from the
same machine minutes apart: compare ratios, not absolute numbers, across
machines.
"""
import argparse
import glob
import json
import os
import re
import socket
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PY = sys.executable
EXAMPLE = {"cnn": "cnn_fashion_mnist.py", "resnet": "resnet_fashion_mnist.py"}


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def config(tmp, args, model):
    ports = free_ports(2)
    lines = ["cluster:", f"  servers: [127.0.0.1:{ports[0]}, 127.0.0.1:{ports[1]}]",
             f"  workers: {args.workers}", "consistency:", f"  mode: {args.mode}"]
    if args.mode == "async":
        lines.append(f"  staleness: {args.staleness}")
    lines += ["seed: 42", "security:", f"  secret_file: {tmp}/ps.secret", "log:", "  level: warn"]
    if model:
        lines += ["model:", "  preset: cnn", "train:", "  batch: 64", f"  epochs: {args.epochs}",
                  f"  limit: {args.limit}", "  threads: 1", f"  device: {args.device}",
                  f"  metrics_dir: {tmp}/metrics", "optimizer:", "  name: momentum",
                  "  lr: 0.01", "  momentum: 0.9", "  average: true"]
    path = os.path.join(tmp, "c.yaml" if model else "py.yaml")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def run(cmd, env=None, timeout=1800):
    p = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=timeout)
    out = p.stdout.decode(errors="replace")
    if p.returncode:
        sys.exit(f"bench_torch: {' '.join(cmd)} exited {p.returncode}:\n{out[-3000:]}")
    return out


def cl_flag(args):
    """The torch runs' layout flag: every torch run (ddp, alone, ps) gets the same."""
    return ["--channels-last"] if args.layout == "channels-last" and args.model == "cnn" else []


def ddp(args, no_comm=False):
    out = run([PY, "python/bench/ddp_bench.py", "--world", str(args.workers), "--epochs",
               str(args.epochs), "--limit", str(args.limit), "--threads", "1", "--model",
               args.model, "--device", args.device, "--test-limit", str(args.test_limit)]
              + (["--no-comm"] if no_comm else []) + cl_flag(args))
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return (sum(r["samples_per_s"] for r in rows) / len(rows),
            sum(r["test_accuracy"] for r in rows) / len(rows))


def ps_path(args, tmp):
    cfg = config(tmp, args, False)
    env = dict(os.environ, PS_SECRET_FILE="")
    out = run(["scripts/ps-local.sh", cfg, "--logs", os.path.join(tmp, "pylogs"), "--worker-cmd",
               f"{PY} examples/{EXAMPLE[args.model]} --epochs {args.epochs} --limit {args.limit} "
               f"--threads 1 --test-limit {args.test_limit} {' '.join(cl_flag(args))}"
               + (f" --device {args.device}" if args.model == "resnet" else "")], env)
    rows = {}
    texts = [out] + [open(f).read() for f in glob.glob(os.path.join(tmp, "pylogs", "worker-*"))]
    for text in texts:   # worker 0 prints on ps-local.sh's terminal, the others in their logs
        for m in re.finditer(r"worker (\d+): epoch (\d+): loss \S+ test accuracy ([\d.]+)% "
                             r"(\d+) samples/s", text):
            if int(m.group(2)) == args.epochs:
                rows[m.group(1)] = (float(m.group(4)), float(m.group(3)))
    rows = list(rows.values())
    if len(rows) != args.workers:
        sys.exit(f"bench_torch: the Python workers' results not found:\n{out[-3000:]}")
    return (sum(r[0] for r in rows) / len(rows), sum(r[1] for r in rows) / len(rows))


def c_path(args, tmp):
    cfg = config(tmp, args, True)
    env = dict(os.environ, PS_SECRET_FILE="")
    run(["scripts/ps-local.sh", cfg, "--logs", os.path.join(tmp, "clogs")], env)
    rows = []
    for f in sorted(glob.glob(os.path.join(tmp, "metrics", "worker-*.jsonl"))):
        last = [json.loads(line) for line in open(f) if line.strip()][-1]
        rows.append((last["samples_per_s"], 100.0 * last.get("test_accuracy", float("nan"))))
    return sum(r[0] for r in rows) / len(rows), rows[0][1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=0, help="first N training images (0: all)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--mode", default="sync", choices=("sync", "async"))
    ap.add_argument("--staleness", type=int, default=1)
    ap.add_argument("--model", default="cnn", choices=("cnn", "resnet"))
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--test-limit", type=int, default=0)
    ap.add_argument("--layout", default="channels-last", choices=("channels-last", "nchw"),
                    help="the cnn's conv weights in torch (ddp, alone and ps alike): "
                         "channels-last is oneDNN's faster layout on the CPU")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    # One thread per worker for every run, BLAS included: torch.set_num_threads
    # does not reach Debian's torch's OpenBLAS (BLAS_INFO=generic), which would
    # otherwise run the Linear layers on two threads in each of two processes
    # on two cores.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="bench-torch.") as tmp:
        res = {}
        be = "nccl" if args.device == "cuda" else "gloo"
        print(f"bench_torch: {args.model} on {args.device}, {args.workers} worker(s)"
              + (f", torch layout {args.layout}" if args.model == "cnn" else ""), flush=True)
        print(f"bench_torch: ddp ({be}, {args.workers} processes) ...", flush=True)
        res["ddp"] = ddp(args)
        print(f"  {res['ddp'][0]:.0f} samples/s per worker, test accuracy {res['ddp'][1]:.2f}%",
              flush=True)
        print(f"bench_torch: ps (2 shards, {args.workers} Python workers, {args.mode}) ...",
              flush=True)
        res["ps"] = ps_path(args, tmp)
        print(f"  {res['ps'][0]:.0f} samples/s per worker, test accuracy {res['ps'][1]:.2f}%",
              flush=True)
        if args.model == "cnn":
            print(f"bench_torch: c (2 shards, {args.workers} ps-worker) ...", flush=True)
            res["c"] = c_path(args, tmp)
            print(f"  {res['c'][0]:.0f} samples/s per worker, test accuracy {res['c'][1]:.2f}%",
                  flush=True)
        if args.device == "cpu":
            print(f"bench_torch: alone ({args.workers} processes, no communication) ...",
                  flush=True)
            res["alone"] = ddp(args, no_comm=True)
            print(f"  {res['alone'][0]:.0f} samples/s per worker", flush=True)
    r1 = res["ps"][0] / res["ddp"][0]
    print(f"ps / ddp samples/s: {r1:.3f} (target >= 1.1 on the CPU); accuracy "
          f"{res['ps'][1]:.2f}% vs {res['ddp'][1]:.2f}% ({res['ps'][1] - res['ddp'][1]:+.2f} "
          "points; target within 0.5)")
    figures = {"ps_over_ddp": r1}
    if "c" in res:
        figures["ps_over_c"] = res["ps"][0] / res["c"][0]
        print(f"ps / c   samples/s: {figures['ps_over_c']:.3f} (target >= 0.85)")
    if "alone" in res:
        figures["alone_over_ddp"] = res["alone"][0] / res["ddp"][0]
        print(f"alone / ddp samples/s: {figures['alone_over_ddp']:.3f} (the ceiling of ps / ddp "
              "for torch's compute on this machine)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "device": args.device, "workers": args.workers,
                       "layout": args.layout if args.model == "cnn" else None,
                       "mode": args.mode, "limit": args.limit, "epochs": args.epochs,
                       **{k: {"samples_per_s": v[0], "test_accuracy": v[1]}
                          for k, v in res.items()}, **figures}, f, indent=1)


if __name__ == "__main__":
    main()
