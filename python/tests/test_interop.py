"""A Python worker and a C worker (cworker.c over libps.so) side by side in
one cluster: the weights are the exact sum of both workers' gradients."""
import os
import subprocess

from conftest import PYWORKER, ROOT, run_workers
from test_sums import check

HERE = os.path.dirname(__file__)


def build_cworker(tmp_path):
    exe = str(tmp_path / "cworker")
    lib = os.path.join(ROOT, "lib")
    subprocess.run(["gcc", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-o", exe,
                    os.path.join(HERE, "cworker.c"), "-I" + os.path.join(ROOT, "worker", "client"),
                    "-I" + os.path.join(ROOT, "common"), "-L" + lib, "-Wl,-rpath," + lib, "-lps"],
                   check=True)
    return exe


def test_python_and_c_workers(cluster, tmp_path):
    cl = cluster(workers=2)
    exe = build_cworker(tmp_path)
    outs = run_workers([PYWORKER + ["--config", cl.path, "--rank", "0", "--clocks", "4"],
                        [exe, cl.path, "1", "4"]])
    assert "worker 0 done at clock 4" in outs[0]
    assert "cworker 1 done" in outs[1]
    check(cl, range(2), 4)
