"""The split of scripts/ (tools a user or a maintainer runs) from experiments/ (runs that asked one question):
each directory's README lists exactly its files, every script and experiment still runs, and the package
never imports an experiment."""

import ast
import json
import re
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import run_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS, EXPERIMENTS = ROOT / "scripts", ROOT / "experiments"


def _listed(readme: Path) -> set[str]:
    """The file names in the first column of a README's table."""
    return set(re.findall(r"^\| `([\w.]+)` \|", readme.read_text(), re.M))


@pytest.mark.parametrize("folder", [SCRIPTS, EXPERIMENTS], ids=["scripts", "experiments"])
def test_each_readme_lists_exactly_the_files_beside_it(folder):
    files = {p.name for p in folder.iterdir() if p.is_file() and p.name != "README.md"}
    assert files, folder
    assert _listed(folder / "README.md") == files


def test_the_package_never_imports_an_experiment():
    offenders = []
    for path in (ROOT / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] == "experiments"]
    assert not offenders


@pytest.mark.parametrize(
    "script",
    sorted([*SCRIPTS.glob("*.py"), *EXPERIMENTS.glob("*.py")]),
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_every_script_and_experiment_imports_and_prints_its_help(script, capsys):
    code, out, _ = run_script(script, ["--help"], capsys)
    assert code == 0 and out.startswith("usage:"), out[-2000:]


def test_the_gpu_check_is_valid_bash_and_names_files_that_exist():
    script = SCRIPTS / "gpu_check.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    named = set(re.findall(r"\b((?:benchmarks|tests|scripts)/[\w/]+\.(?:py|sh))", script.read_text()))
    assert named, "the check names no benchmark or test"
    assert not [n for n in named if not (ROOT / n).exists()], named


def test_compare_runs_prints_the_runs_validation_losses_at_a_shared_step(tiny_run, tmp_path, capsys):
    run, _ = tiny_run
    again = tmp_path / "again"  # the same run under a second name: two runs that share every step
    again.symlink_to(run)
    code, out, _ = run_script(SCRIPTS / "compare_runs.py", [str(run), str(again), "--every", "4"], capsys)
    assert code == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in records if "val_loss_ema_even_t" in r][-1]
    numbers = [f"{last['val_loss_ema_even_t']:.4f}", *(f"{v:.3f}" for v in last["val_loss_ema_by_t"])]
    rows = [line.split() for line in out.splitlines()[1:]]
    assert [r for r in rows if r[0] == str(last["step"])] == [
        [str(last["step"]), str(name), *numbers] for name in (run, again)
    ]


def test_gradient_by_t_measures_a_checkpoint(tiny_run, capsys):
    run, _ = tiny_run
    args = ("--t", "0.2", "0.9", "--batch", "4", "--repeats", "1", "--precision", "fp32")
    code, out, err = run_script(EXPERIMENTS / "gradient_by_t.py", [str(run / "checkpoint.pt"), *args], capsys)
    assert code == 0, out + err
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [r["t"] for r in rows] == [0.2, 0.9]
    assert all(r["grad_norm"] > 0 and r["loss"] > 0 for r in rows), rows


def test_mirror_share_tells_images_that_face_the_means_way_from_mirrored_ones():
    import importlib.util

    spec = importlib.util.spec_from_file_location("mirror_share", SCRIPTS / "mirror_share.py")
    mirror_share = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mirror_share)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(40, 1, 8, 8, generator=g) * 2 - 1
    x[..., :4] = -1  # every image dark on its left, as its class's mean
    labels = torch.arange(40) % 2
    means = torch.stack([x[labels == k].mean(0) for k in range(2)] + [torch.zeros(1, 8, 8)])
    assert mirror_share.facing_share(x, labels, means) == [1.0, 1.0, None]
    mirrored = torch.where((torch.arange(40) < 30).view(-1, 1, 1, 1), x.flip(-1), x)  # 15 of each class's 20
    assert mirror_share.facing_share(mirrored, labels, means)[:2] == [0.25, 0.25]


def test_judge_similarity_prints_the_cka_of_each_pair_and_its_controls(capsys):
    code, out, _ = run_script(SCRIPTS / "judge_similarity.py", ["--n", "64"], capsys)
    assert code == 0
    shapes = out.split("fashion-mnist")[0]
    assert "shapes_cnn vs shapes_repa, 64 test images" in shapes
    values = [float(line.split()[-1]) for line in shapes.splitlines()[1:] if line.strip()]
    assert len(values) == 7 and all(0 <= v <= 1 + 1e-9 for v in values)
    assert "shapes_judge vs align, pooled" in shapes  # the independent judge measured against the encoder
