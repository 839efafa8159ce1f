"""examples/: each PyTorch example run as README says, by scripts/ps-local.sh
with 2 shards and 2 Python workers (--worker-cmd), on a short run: it must
exit 0, and every worker must print a test accuracy well above chance.
"""
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="PyTorch is not installed (Debian: python3-torch)")
from conftest import ROOT, free_ports  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"


def run_example(tmp_path, args, timeout=300, extra=(), mode="sync"):
    cfg = tmp_path / "pytorch.yaml"
    p0, p1 = free_ports(2)
    cfg.write_text("\n".join([
        "cluster:", f"  servers: [127.0.0.1:{p0}, 127.0.0.1:{p1}]",
        "  workers: 2", "consistency:", f"  mode: {mode}", "seed: 42", "log:", "  level: warn",
    ] + list(extra)) + "\n")
    logs = tmp_path / "logs"
    p = subprocess.run(["scripts/ps-local.sh", str(cfg), "--logs", str(logs), "--worker-cmd",
                        f"{sys.executable} {args}"], cwd=ROOT, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=timeout)
    out = p.stdout.decode(errors="replace")
    texts = out + "".join(f.read_text(errors="replace") for f in logs.glob("worker-*.log"))
    assert p.returncode == 0, out[-4000:]
    acc = {int(w): float(a) for w, a in
           re.findall(r"worker (\d+): .*test (?:accuracy|AUC) ([\d.]+)", texts)}
    assert sorted(acc) == [0, 1], texts[-4000:]
    return acc, texts


needs_data = pytest.mark.skipif(not os.path.isdir(DATA), reason=f"{DATA} missing "
                                "(Debian: dataset-fashion-mnist)")


@needs_data
def test_cnn_example(tmp_path):
    acc, _ = run_example(tmp_path, "examples/cnn_fashion_mnist.py --limit 6400 --test-limit 2000 "
                         "--threads 1")
    assert min(acc.values()) > 50, acc          # chance: 10%
    assert acc[0] == acc[1], acc                # the same weights on both workers


@needs_data
def test_resnet_example_with_batchnorm_buffers(tmp_path):
    acc, _ = run_example(tmp_path, "examples/resnet_fashion_mnist.py --limit 8192 "
                         "--test-limit 2000 --threads 1 --buffers-every 20")
    assert min(acc.values()) > 50, acc
    # sync_buffers() before evaluating: the same running statistics on both
    assert acc[0] == acc[1], acc


def test_transformer_example(tmp_path):
    acc, texts = run_example(tmp_path, "examples/transformer_text.py --steps 40 --threads 1")
    assert min(acc.values()) > 15, acc         # next character: a space or 'e' is ~17%
    assert acc[0] == acc[1], acc
    losses = [float(x) for x in re.findall(r"step \d+/40 loss ([\d.]+)", texts)]
    assert losses and losses[-1] < 3.5, losses  # ln(256) = 5.5 at the start


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_dlrm_example(tmp_path, mode):
    """The DLRM-style model on a ps-ctrgen log: dense layers and the
    shards' table in the same clocks, with Prefetch; held-out AUC within
    0.05 of the generator's ceiling after 40,000 examples."""
    gen = os.path.join(ROOT, "bin", "ps-ctrgen")
    train, test = tmp_path / "train.tsv", tmp_path / "test.tsv"
    subprocess.run([gen, "--out", str(train), "--samples", "40000", "--scale", "0.002",
                    "--seed", "3"], check=True, capture_output=True)
    best = subprocess.run([gen, "--out", str(test), "--samples", "5000", "--skip", "40000",
                           "--scale", "0.002", "--seed", "3", "--json"], check=True,
                          capture_output=True, text=True).stdout
    best = float(re.search(r'"best_auc":([\d.]+)', best).group(1))
    table = ["model:", "  embeddings:",
             "    - {name: cat, dim: 16, init: uniform, scale: 0.01, "
             "optimizer: rowwise_adagrad, lr: 0.05}"]
    auc, texts = run_example(tmp_path, f"examples/dlrm_criteo.py --train {train} --test {test} "
                             "--batch 512 --threads 1", extra=table, mode=mode)
    assert min(auc.values()) > best - 0.05, (auc, best)
    if mode == "sync":
        assert auc[0] == auc[1], auc      # the same model on both workers
