"""A small character-level transformer on a Debian text corpus, through the shards.

    scripts/ps-local.sh conf/pytorch.yaml --worker-cmd "python3 examples/transformer_text.py"

The corpus is the licence texts base-files ships in /usr/share/common-licenses
(every Debian system has them; --corpus takes other files or folders). The
last tenth of it is held out: the test accuracy is the share of its
characters the model predicts from the --context characters before them.
AdamW with a cosine schedule, applied by the shards (decoupled weight decay
on the weights, none on biases, norms and embeddings: two parameter groups).
"""
import argparse
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import ps.torch as pst                                  # ps:


def read_corpus(paths):
    text = []
    for p in paths:
        files = [os.path.join(p, f) for f in sorted(os.listdir(p))] if os.path.isdir(p) else [p]
        for f in files:
            if os.path.isfile(f) and not os.path.islink(f):
                with open(f, "rb") as fh:
                    text.append(fh.read())
    data = b"\n".join(text)
    if len(data) < 10000:
        raise SystemExit(f"transformer_text: corpus {paths}: {len(data)} bytes, need >= 10000")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


class CharTransformer(nn.Module):
    def __init__(self, context, dim=128, heads=4, layers=2):
        super().__init__()
        self.tok = nn.Embedding(256, dim)
        self.pos = nn.Embedding(context, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.body = nn.TransformerEncoder(layer, layers)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 256)
        self.register_buffer("mask", torch.triu(torch.full((context, context), float("-inf")), 1))

    def forward(self, idx):
        t = idx.shape[1]
        h = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        return self.head(self.norm(self.body(h, mask=self.mask[:t, :t])))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", nargs="+", default=["/usr/share/common-licenses"])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=32, help="sequences per worker and step")
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)

    pst.init()                                          # ps:
    rank = pst.rank()                                   # ps:
    data = read_corpus(args.corpus)
    cut = len(data) * 9 // 10
    train, test = data[:cut], data[cut:]
    gen = torch.Generator().manual_seed(1000 + rank)    # ps: each worker its own batches

    torch.manual_seed(0)
    model = CharTransformer(args.context).to(dev)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "tok" not in n
             and "pos" not in n]
    other = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "tok" not in n
                                                             and "pos" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}], lr=args.lr)
    opt = pst.DistributedOptimizer(opt, named_parameters=model.named_parameters())  # ps:
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    ctx = args.context
    t0 = time.time()
    for s in range(args.steps):
        starts = torch.randint(0, len(train) - ctx - 1, (args.batch,), generator=gen)
        xb = torch.stack([train[i:i + ctx] for i in starts]).to(dev)
        yb = torch.stack([train[i + 1:i + ctx + 1] for i in starts]).to(dev)
        opt.zero_grad()
        loss = F.cross_entropy(model(xb).reshape(-1, 256), yb.reshape(-1))
        loss.backward()
        opt.step()
        sched.step()
        if rank == 0 and (s + 1) % 25 == 0:
            print(f"step {s + 1}/{args.steps} loss {loss.item():.3f} "
                  f"({math.exp(loss.item()):.1f} perplexity) "
                  f"{(s + 1) * args.batch * ctx / (time.time() - t0):.0f} chars/s", flush=True)
    model.eval()
    right = total = 0
    with torch.no_grad():
        for i in range(0, len(test) - ctx - 1, ctx):
            xb = test[i:i + ctx].unsqueeze(0).to(dev)
            yb = test[i + 1:i + ctx + 1].to(dev)
            right += (model(xb)[0].argmax(-1) == yb).sum().item()
            total += ctx
    print(f"worker {rank}: {args.steps} steps, loss {loss.item():.3f}, test accuracy "
          f"{100.0 * right / max(total, 1):.2f}% (next character, {total} held out), "
          f"{time.time() - t0:.1f} s", flush=True)
    pst.shutdown()                                      # ps:
    return 0


if __name__ == "__main__":
    sys.exit(main())
