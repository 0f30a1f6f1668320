"""Every example script runs and does what it says (each exits non-zero when its own check fails), and the
quick-start notebook runs from the checkout with a budget of a few steps."""

import ast
import base64
import re
from pathlib import Path

import nbclient
import nbformat
import pytest
from conftest import run_script
from PIL import Image

from tinydit.runtime import get_device

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
ARGS = {
    "01_images_and_broadcasting.py": ["--out", "{out}"],
    "02_autograd_line_fit.py": ["--steps", "300"],
    "03_loaders_and_batch_grid.py": ["--out", "{out}"],
    "04_training_loop_checkpoint.py": ["--steps", "60", "--out", "{out}"],
    "05_flow_matching_2d.py": ["--steps", "1500"],
}
# The quick-start notebook's parameters cell, replaced: a few steps and samples, the run in the test's folder.
QUICK = {"MINUTES": "None", "STEPS": "4", "SAMPLES": "8", "RUN_DIR": "Path({run!r})"}


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


def test_quickstart_is_committed_clean_and_clones_the_projects_repository():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    nb = _notebook()
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in nb.cells if c.cell_type == "code")
    with open(EXAMPLES.parent / "pyproject.toml", "rb") as f:
        repository = tomllib.load(f)["project"]["urls"]["Repository"]
    first = next(c for c in nb.cells if c.cell_type == "code")
    assert re.search(r'^REPO_URL = "(.*)"', first.source, re.M).group(1) == repository
    params = _parameters_cell(nb)  # the test replaces every parameter, and only those
    assert {t.id for node in ast.parse(params.source).body for t in node.targets} == set(QUICK)


def test_quickstart_notebook_runs(tmp_path):
    nb = _notebook()
    run = tmp_path / "run"
    _parameters_cell(nb).source = "\n".join(f"{k} = {v.format(run=str(run))}" for k, v in QUICK.items())
    # From examples/, as a notebook opened in the checkout runs: its first cell finds the checkout and clones nothing.
    resources = {"metadata": {"path": str(EXAMPLES)}}
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources=resources).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert f"TinyDiT from {EXAMPLES.parent}" in text and f"device: {get_device()}" in text
    assert "4 steps in" in text and (run / "checkpoint.pt").is_file()
    pngs = [base64.b64decode(o.data["image/png"]) for o in outputs if "image/png" in o.get("data", {})]
    assert pngs == [(run / "grid.png").read_bytes()] and _grid_of(run / "grid.png", 8, cols=4)  # a column per class
    pages = [o.data["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    last_grid = base64.b64encode((run / "samples" / "step_000004.png").read_bytes()).decode("ascii")
    assert any(last_grid in p for p in pages)  # the run's sample grids
    report = base64.b64encode((run / "report.html").read_bytes()).decode("ascii")  # whole, in the notebook's frame
    assert any(report in p for p in pages)


def _notebook():
    return nbformat.read(EXAMPLES / "quickstart.ipynb", as_version=4)


def _parameters_cell(nb):
    (cell,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    return cell


def _grid_of(path: Path, n: int, size: int = 32, pad: int = 2, cols: int = 8) -> bool:
    """Whether ``path`` is a readable grid image of n tiles of ``size`` px, ``cols`` per row (``make_grid``'s
    layout)."""
    cols = min(cols, n)
    rows = -(-n // cols)
    with Image.open(path) as img:
        return img.size == (cols * (size + pad) + pad, rows * (size + pad) + pad)
