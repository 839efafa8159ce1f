"""The DLRM-style example through the shards against the C ctr preset and
plain PyTorch, in one run (`make bench-dlrm`; BENCHMARKS.md).

    build/pyvenv/bin/python python/bench/bench_dlrm.py [--samples N] [--scale F]
        [--mode sync|async] [--interaction cat|dot] [--json FILE]

Writes a ps-ctrgen log of N examples (default 200,000, --scale 0.01) and a
held-out tenth, then trains one epoch, batch 1024 per worker, one torch or
BLAS thread per worker, 2 workers:

  ps    examples/dlrm_criteo.py, 2 shards (table `cat`, dim 16, rowwise
        adagrad lr 0.05; dense Adam lr 0.001), with Prefetch
  c     ps-worker's ctr preset on the same data and shards' table settings
        (its own MLP: 26 bags + 13 numeric, dense 256-128-2, Adam)
  ddp   the same DLRM model with torch.nn.Embedding(sparse=True) (ids mod
        2^20 rows), Adagrad on the table, DDP gloo (ddp_dlrm.py)

and prints samples/s per worker (training steps only), held-out AUC, the
generator's best achievable AUC, and ps/c, ps/ddp.
"""
import argparse
import glob
import json
import os
import re
import sys
import tempfile

import bench_torch   # the helpers both benchmarks use (free_ports, run)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PY = sys.executable
TABLE = "{name: cat, dim: 16, init: uniform, scale: 0.01, optimizer: rowwise_adagrad, lr: 0.05}"


def run(cmd):
    """bench_torch.run with the configs' own secret (not the caller's)."""
    return bench_torch.run(cmd, env=dict(os.environ, PS_SECRET_FILE=""), timeout=3600)


def config(tmp, name, args, extra):
    p0, p1 = bench_torch.free_ports(2)
    lines = ["cluster:", f"  servers: [127.0.0.1:{p0}, 127.0.0.1:{p1}]", "  workers: 2",
             "consistency:", f"  mode: {args.mode}", "seed: 42", "security:",
             f"  secret_file: {tmp}/ps.secret", "log:", "  level: warn"] + extra
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=200000)
    ap.add_argument("--scale", type=float, default=0.01)
    ap.add_argument("--mode", default="sync", choices=("sync", "async"))
    ap.add_argument("--interaction", default="cat", choices=("cat", "dot"),
                    help="the DLRM model's (examples/dlrm_criteo.py)")
    ap.add_argument("--json")
    args = ap.parse_args()
    res = {}
    with tempfile.TemporaryDirectory(prefix="bench-dlrm.") as tmp:
        train, test = os.path.join(tmp, "train.tsv"), os.path.join(tmp, "test.tsv")
        gen = os.path.join(ROOT, "bin", "ps-ctrgen")
        run([gen, "--out", train, "--samples", str(args.samples), "--scale", str(args.scale),
             "--seed", "5"])
        best = json.loads(run([gen, "--out", test, "--samples", str(args.samples // 10),
                               "--skip", str(args.samples), "--scale", str(args.scale),
                               "--seed", "5", "--json"]))["best_auc"]
        print(f"bench_dlrm: {args.samples} examples (scale {args.scale}), {args.mode}; "
              f"best achievable held-out AUC {best:.4f}", flush=True)

        cfg = config(tmp, "ps.yaml", args, ["model:", "  embeddings:", f"    - {TABLE}"])
        out = run(["scripts/ps-local.sh", cfg, "--logs", f"{tmp}/pslogs", "--worker-cmd",
                   f"{PY} examples/dlrm_criteo.py --train {train} --test {test} --threads 1 "
                   f"--interaction {args.interaction}"])
        text = out + "".join(open(f).read() for f in glob.glob(f"{tmp}/pslogs/worker-*.log"))
        rows = {w: (float(s), float(a)) for w, a, s in re.findall(
            r"worker (\d+): epoch 1: test AUC ([\d.]+) logloss \S+ (\d+) samples/s", text)}
        if len(rows) != 2:
            sys.exit(f"bench_dlrm: the Python workers' results not found:\n{out[-3000:]}")
        res["ps"] = (sum(r[0] for r in rows.values()) / 2, rows["0"][1])
        print(f"  ps  {res['ps'][0]:8.0f} samples/s per worker, AUC {res['ps'][1]:.4f}", flush=True)

        cfg = config(tmp, "c.yaml", args, [
            "model:", "  preset: ctr", "  embeddings:", f"    - {TABLE}",
            "optimizer: {name: adam, lr: 0.001}",
            f"train: {{train_file: '{train}', test_file: '{test}', batch: 1024, epochs: 1, "
            f"threads: 1, metrics_dir: '{tmp}/cm'}}"])
        run(["scripts/ps-local.sh", cfg, "--logs", f"{tmp}/clogs"])
        ms = [json.loads([ln for ln in open(f) if ln.strip()][-1])
              for f in sorted(glob.glob(f"{tmp}/cm/worker-*.jsonl"))]
        res["c"] = (sum(m["samples_per_s"] for m in ms) / len(ms),
                    ms[0].get("test_auc", float("nan")))
        print(f"  c   {res['c'][0]:8.0f} samples/s per worker, AUC {res['c'][1]:.4f}", flush=True)

        out = run([PY, "python/bench/ddp_dlrm.py", "--train", train, "--test", test,
                   "--interaction", args.interaction])
        rs = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
        res["ddp"] = (sum(r["samples_per_s"] for r in rs) / len(rs), rs[0]["auc"])
        print(f"  ddp {res['ddp'][0]:8.0f} samples/s per worker, AUC {res['ddp'][1]:.4f}",
              flush=True)
    print(f"ps / c: {res['ps'][0] / res['c'][0]:.3f} (target >= 0.8); ps / ddp: "
          f"{res['ps'][0] / res['ddp'][0]:.3f} (target >= 1.5); ps AUC {best - res['ps'][1]:.4f} "
          "below the ceiling (target <= 0.01)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"samples": args.samples, "scale": args.scale, "mode": args.mode,
                       "interaction": args.interaction,
                       "best_auc": best, **{k: {"samples_per_s": v[0], "auc": v[1]}
                                            for k, v in res.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
