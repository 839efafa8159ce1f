"""README's Python quick start, run as README says: its train.py through
scripts/ps-local.sh conf/local.yaml --worker-cmd (with this venv's python in
place of venv/bin/python)."""
import os
import re
import subprocess
import sys

from conftest import ROOT


def readme_python():
    text = open(os.path.join(ROOT, "README.md")).read()
    blocks = re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)
    assert blocks, "README.md has no python block"
    return blocks[0]


def test_readme_python_example(tmp_path):
    code = readme_python()
    first = code.splitlines()[0]
    m = re.match(r'# train\.py: (scripts/ps-local\.sh \S+) --worker-cmd "venv/bin/python train\.py"$',
                 first)
    assert m, f"README's python block no longer starts with its command line: {first}"
    (tmp_path / "train.py").write_text(code)
    launcher, cfg = m.group(1).split()
    p = subprocess.run([os.path.join(ROOT, launcher), os.path.join(ROOT, cfg), "--logs",
                        str(tmp_path / "logs"), "--worker-cmd", f"{sys.executable} train.py"],
                       cwd=str(tmp_path), capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    # rank 0 prints to the terminal: "0 <version> <version>", the pull after
    # 3 sync clocks at version 3
    assert re.search(r"^0 3 3$", p.stdout, re.M), p.stdout + p.stderr
    log1 = (tmp_path / "logs" / "worker-1.log").read_text()
    assert re.search(r"^1 3 3$", log1, re.M), log1
