"""A PyTorch worker process for test_torch.py's restart tests.

    torchworker.py CONFIG RANK UNTIL_CLOCK OUT [--die-after N] [--checkpoint]
                   [--save-start FILE] [--load-local FILE]

Trains test_torch's model with SGD (momentum 0.9) through the shards until
the cluster's clock reaches UNTIL_CLOCK (a restarted worker goes on from the
clock the shards give it, printing "resumed at clock K"), then saves its
parameters to OUT (torch.save of a name -> tensor dict). --die-after N:
SIGKILLs itself after N steps. --checkpoint: opt.checkpoint(OUT.local,
epoch=7, note=...) at the end. --load-local FILE: opt.load_checkpoint(FILE)
after the declaration, printing what it gives back. --save-start: saves the
parameters it got from the shards' declaration before training.
"""
import os
import signal
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import ps  # noqa: E402
import ps.torch as pst  # noqa: E402
from test_torch import BATCH, STEPS, data, make_model  # noqa: E402


def main(argv):
    path, rank, until, out = argv[0], int(argv[1]), int(argv[2]), argv[3]
    die = int(argv[argv.index("--die-after") + 1]) if "--die-after" in argv else None
    torch.set_num_threads(1)
    c = ps.Client(path, rank)
    nworkers = c.config.nworkers
    model = make_model(seed=1 if rank == 0 else 50 + rank)
    opt = pst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters(), client=c)
    if "--save-start" in argv:
        torch.save({n: p.detach().clone() for n, p in model.named_parameters()},
                   argv[argv.index("--save-start") + 1])
    print(f"resumed at clock {c.clock()}", flush=True)
    if "--load-local" in argv:
        extra = opt.load_checkpoint(argv[argv.index("--load-local") + 1])
        print(f"local state {sorted(extra.items())}", flush=True)
    x, y = data(nworkers)
    part = slice(rank * BATCH, (rank + 1) * BATCH)
    steps = 0
    while c.clock() < until:
        s = c.clock() % STEPS
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[s][part]), y[s][part]).backward()
        opt.step()
        steps += 1
        if die is not None and steps == die:
            os.kill(os.getpid(), signal.SIGKILL)
    if "--checkpoint" in argv:
        opt.checkpoint(out + ".local", epoch=7, note=f"rank {rank}")
    torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, out)
    c.close()
    print(f"done at clock {c.clock() if not c.closed else until}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
