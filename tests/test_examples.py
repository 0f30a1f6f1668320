"""Every example script runs and does what it says (each exits non-zero when its own check fails)."""

import re
from pathlib import Path

import pytest
from conftest import run_script
from PIL import Image

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
def test_example_runs(name, tmp_path, monkeypatch, capsys):
    args = [a.format(out=tmp_path) for a in ARGS[name]]
    monkeypatch.chdir(tmp_path)
    code, out, err = run_script(EXAMPLES / name, args, capsys)
    assert code == 0, out + err
    if name.startswith("01"):  # permute is reversible, reshape is not; a batch of 3 RGB images in [-1, 1]
        assert "permute back == original: True | reshape == original: False" in out
        assert "batch (3, 3, 32, 32) torch.float32" in out and "broadcasting trap" in out
        lo, hi = map(float, re.search(r"normalised range: ([-\d.]+) to ([-\d.]+)", out).groups())
        assert -1.0 <= lo < hi <= 1.0
        assert _grid_of(tmp_path / "photo_batch.png", 3)
    if name.startswith("02"):  # the fit recovers the line the data was drawn from, y = 3 x - 0.5
        w, b = map(float, re.search(r"fitted y = ([\d.]+) x ([+-][\d.]+)", out).groups())
        assert abs(w - 3.0) < 0.05 and abs(b + 0.5) < 0.05
    if name.startswith("03"):  # a loader's batch, and a user's own folder read back with one class per folder
        assert "batch: (64, 3, 32, 32) torch.float32" in out and "labels (64,) torch.int64" in out
        lo, hi = map(float, re.search(r"range \[([-\d.]+), ([-\d.]+)\]", out).groups())
        assert -1.0 <= lo < hi <= 1.0
        assert re.search(
            r"40 images in .* classes: \{'circle': 0, 'cross': 1, 'square': 2, 'triangle': 3\} "
            r"\| batch \(8, 3, 32, 32\)",
            out,
        )
        assert len(list((tmp_path / "my_images").rglob("*.png"))) == 40
        assert _grid_of(tmp_path / "shapes_batch.png", 64)
    if name.startswith("04"):  # the checkpoint round trip resumes bit-exactly
        assert "resumed == uninterrupted: True" in out
    if name.startswith("05"):  # Euler samples land on the unit ring the model was trained on
        radius = float(re.search(r"sample radius ([\d.]+)", out).group(1))
        assert abs(radius - 1.0) < 0.15 and "50 model evaluations" in out


def _grid_of(path: Path, n: int, size: int = 32, pad: int = 2) -> bool:
    """Whether ``path`` is a readable grid image of n tiles of ``size`` px (8 per row, ``make_grid``'s layout)."""
    cols = min(8, n)
    rows = -(-n // cols)
    with Image.open(path) as img:
        return img.size == (cols * (size + pad) + pad, rows * (size + pad) + pad)
