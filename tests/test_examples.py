"""Every example script runs and does what it says (each exits non-zero when its own check fails)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
ARGS = {
    "01_images_and_broadcasting.py": ["--out", "{out}"],
    "02_autograd_line_fit.py": ["--steps", "300"],
    "03_loaders_and_batch_grid.py": ["--out", "{out}"],
    "04_training_loop_checkpoint.py": ["--steps", "60", "--out", "{out}"],
    "05_flow_matching_2d.py": ["--steps", "1500"],
}


def test_every_example_is_covered():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(ARGS)


@pytest.mark.parametrize("name", sorted(ARGS))
def test_example_runs(name, tmp_path):
    args = [a.format(out=tmp_path) for a in ARGS[name]]
    res = subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip()
    if name.startswith("01"):
        assert (tmp_path / "photo_batch.png").exists() and "reshape == original: False" in res.stdout
    if name.startswith("02"):
        w, b = map(float, re.search(r"fitted y = ([\d.]+) x ([+-][\d.]+)", res.stdout).groups())
        assert abs(w - 3.0) < 0.05 and abs(b + 0.5) < 0.05
    if name.startswith("03"):
        assert "(64, 3, 32, 32)" in res.stdout and (tmp_path / "shapes_batch.png").exists()
    if name.startswith("04"):
        assert "resumed == uninterrupted: True" in res.stdout
