"""A command never writes over what it reads, nor into what it does not own (``tinydit.paths``): every output
is checked before any work, a refusal is one line and exit 2, and the files it names are left byte for byte."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from PIL import Image
from safetensors.torch import load_file

from tinydit import api
from tinydit.checkpoints.checkpoint import load_checkpoint
from tinydit.checkpoints.pretrained import CARD, CONFIG, WEIGHTS, reference_folder
from tinydit.cli import main
from tinydit.errors import TinyDiTError
from tinydit.eval.report import write_report
from tinydit.files import RunDirLock
from tinydit.paths import KINDS, RUN, SHIPPED, WRITES, check_out, kind_of, read_paths

FIXTURES = Path(__file__).parent / "fixtures"


def digest(folder: Path) -> dict[str, str]:
    """Every file under ``folder``, hidden ones too, by its relative path: its bytes' hash."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def run_dir(tiny_run, tmp_path) -> Path:
    """A copy of the shared tiny run (tests may not touch the original)."""
    return Path(shutil.copytree(tiny_run[0], tmp_path / "run"))


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    return api.export(FIXTURES / "dit-0.2m.pt", "safetensors", tmp_path_factory.mktemp("export") / "folder")


@pytest.fixture
def folder(exported, tmp_path) -> Path:
    return Path(shutil.copytree(exported, tmp_path / "folder"))


def refused(args: list, capsys, *watched: Path) -> str:
    """Run the CLI, assert exit 2 with one line and every watched folder unchanged; the line."""
    before = [digest(w) for w in watched]
    capsys.readouterr()  # what came before
    code = main([str(a) for a in args])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and ": error: " in err, err
    assert [digest(w) for w in watched] == before, err
    return err


def test_export_into_a_run_directory_is_refused_and_the_run_is_kept(run_dir, capsys):
    # it replaced the run's config.json, and Checkpoint.load(RUN) then read the export, not checkpoint.pt
    err = refused(["export", "--checkpoint", run_dir / "checkpoint.pt", "--format", "safetensors", "--out", run_dir],
                  capsys, run_dir)  # fmt: skip
    assert f"--out {run_dir} is a run directory, which this command does not write" in err
    assert f"(a subfolder such as {run_dir / 'export'} is yours)" in err
    assert main(["export", "--checkpoint", run_dir, "--format", "safetensors", "--out", run_dir / "export"]) == 0
    assert load_checkpoint(run_dir).source == str(run_dir / "checkpoint.pt")


def test_a_run_directory_stands_for_its_own_checkpoint_whatever_else_was_put_there(run_dir, exported):
    for name in (WEIGHTS, CONFIG):  # what an export into it used to leave
        shutil.copyfile(exported / name, run_dir / name)
    assert load_checkpoint(run_dir).source == str(run_dir / "checkpoint.pt")


def test_an_export_replaces_only_an_earlier_export_and_only_with_overwrite(folder, tmp_path, capsys):
    ckpt = FIXTURES / "dit-0.2m.pt"
    err = refused(["export", "--checkpoint", ckpt, "--format", "safetensors", "--out", folder], capsys, folder)
    assert "holds an earlier pretrained folder; pass --overwrite to replace it" in err
    args = ["export", "--checkpoint", ckpt, "--format", "safetensors", "--out", folder, "--overwrite"]
    assert main([*map(str, args), "--dtype", "bfloat16"]) == 0
    assert all(t.dtype.is_floating_point and t.itemsize == 2 for t in load_file(folder / WEIGHTS).values())
    # never onto what it reads, even with --overwrite
    for source in (folder, folder / WEIGHTS):
        args = ["export", "--checkpoint", source, "--format", "safetensors", "--out", folder, "--overwrite"]
        assert f"--out {folder} is {folder}, which this command reads" in refused(args, capsys, folder)
    # nor over a user's own files
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "README.md").write_text("my notes")
    err = refused(["export", "--checkpoint", ckpt, "--format", "safetensors", "--out", mine, "--overwrite"],
                  capsys, mine)  # fmt: skip
    assert "holds files that are not a pretrained folder's (README.md)" in err
    (tmp_path / "m.onnx").write_bytes(b"an earlier export")
    err = refused(["export", "--checkpoint", ckpt, "--format", "onnx", "--out", tmp_path / "m.onnx"], capsys, tmp_path)
    assert "m.onnx exists; pass --overwrite to replace it" in err


def test_scripts_make_reference_reexports_over_its_own_staged_folder(exported, tmp_path):
    staged = Path(shutil.copytree(exported, tmp_path / "staged"))
    again = api.export(FIXTURES / "dit-0.2m.pt", "safetensors", staged, about="a test", overwrite=True)
    assert again == staged and "a test" in (staged / CARD).read_text()


@pytest.mark.parametrize("name", ["shapes", "shapes-text"])
def test_no_command_writes_a_shipped_model(name, tmp_path, capsys, tiny_run):
    shipped = reference_folder(name)
    ckpt = tiny_run[0] / "checkpoint.pt"
    commands = [
        ["export", "--checkpoint", ckpt, "--format", "safetensors", "--out", shipped, "--overwrite"],
        ["export", "--checkpoint", ckpt, "--format", "onnx", "--out", shipped / "m.onnx"],
        ["sample", "--checkpoint", ckpt, "--out", shipped / "x.png"],
        ["eval", "--checkpoint", ckpt, "--out", shipped / "eval"],
        ["sweep", "--checkpoint", ckpt, "--out", shipped / "sweep"],
        ["train", "--out", shipped / "run"],
        ["sweep", "--checkpoint", shipped / WEIGHTS, "--out", tmp_path / "s", "--apply", "--n", 10],
    ]
    for args in commands:
        err = refused(args, capsys, SHIPPED)
        assert "is a model shipped with tinydit, which no command writes" in err, err
    assert not (tmp_path / "s").exists()


def test_sample_refuses_another_kind_of_file_and_a_runs_own_before_sampling(run_dir, folder, capsys, monkeypatch):
    monkeypatch.setattr(api, "generate", lambda *a, **k: pytest.fail("sampled before the output was checked"))
    for out, message in (
        (folder / WEIGHTS, f"is inside {folder}, which this command reads"),
        (run_dir / "samples.png", f"is a file of the run directory {run_dir}"),
        (run_dir, f"--out {run_dir} is a run directory"),
        (run_dir / "checkpoint.pt", "which this command reads"),
        (folder / "x.png", f"is inside the pretrained folder {folder}, which holds the export alone"),
    ):
        source = folder if out == folder / WEIGHTS else run_dir / "checkpoint.pt"
        args = ["sample", "--checkpoint", source, "--n", 2, "--out", out]
        assert message in refused(args, capsys, run_dir, folder)


def test_eval_writes_into_a_subfolder_of_a_run_but_not_onto_it(run_dir, folder, tmp_path, capsys, monkeypatch):
    for args, message in (
        (["--checkpoint", run_dir / "checkpoint.pt", "--out", run_dir], "is a run directory"),
        (["--checkpoint", folder, "--out", folder / "eval"], f"is inside {folder}, which this command reads"),
        (["--checkpoint", run_dir / "checkpoint.pt", "--out", folder], "is a pretrained folder"),
        (["--samples", folder, "--data", "shapes", "--out", folder], "which this command reads"),
    ):
        assert message in refused(["eval", *args, "--n", 20], capsys, run_dir, folder)
    # the README's and the docs' commands: RUN/eval, and eval/NAME beside it
    reads = read_paths(run_dir / "checkpoint.pt")
    assert check_out(run_dir / "eval", "evaluation", reads) == run_dir / "eval"
    assert check_out(run_dir / "sweep", "sweep", read_paths(run_dir)) == run_dir / "sweep"


def test_train_refuses_a_folder_that_is_not_a_runs(folder, tmp_path, capsys):
    mine = tmp_path / "project"
    mine.mkdir()
    (mine / "config.json").write_text('{"my": "settings"}')
    images = tmp_path / "images"
    (images / "cat").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(images / "cat" / "a.png")
    for out, message in (
        (folder, "is a pretrained folder, which this command does not write"),
        (mine, "holds files that are not a run directory's (config.json)"),
    ):
        assert message in refused(["train", "--steps", 1, "--out", out], capsys, folder, mine)
    err = refused(["train", "--data", images, "--steps", 1, "--out", images / "run"], capsys, images)
    assert f"is inside {images.resolve()}, which this command reads" in err


def test_sweep_apply_records_into_a_pretrained_folder_in_its_own_format(folder, tmp_path, capsys, eval_cache):
    # It wrote a pickled checkpoint over model.safetensors, which then could not be read.
    weights = (folder / WEIGHTS).read_bytes()
    args = ["sweep", "--checkpoint", folder / WEIGHTS, "--samplers", "euler", "--steps", "1,2", "--cfg", 1,
            "--n", 10, "--out", tmp_path / "s", "--cache-dir", eval_cache, "--no-progress", "--apply"]  # fmt: skip
    assert main([str(a) for a in args]) == 0, capsys.readouterr().err
    assert f"recorded in {folder}: sampling with euler" in capsys.readouterr().err
    assert (folder / WEIGHTS).read_bytes() == weights  # byte for byte
    config = json.loads((folder / CONFIG).read_text())
    assert config["sampling"]["sampler"] == "euler" and "tinydit sweep --apply" in config["sampling"]["source"]
    assert config["sampling"]["source"] in (folder / CARD).read_text()
    assert api.sample(folder, 2).settings.note.startswith(f"sampling with euler, {config['sampling']['steps']} steps")


def test_sweep_apply_checks_where_it_records_before_it_samples(folder, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(api, "run_sweep", lambda *a, **k: pytest.fail("swept before the record was checked"))
    base = ["sweep", "--samplers", "euler", "--steps", 1, "--n", 10, "--apply"]
    err = refused([*base, "--n", 5, "--checkpoint", folder, "--out", tmp_path / "s"], capsys, folder)
    assert "--n 5 is too few samples" in err and not (folder / ".lock").exists()  # no lock taken for it
    err = refused([*base, "--checkpoint", "nobody/nothing", "--out", tmp_path / "s"], capsys)
    assert "a Hub model is read from a download cache, which is not to be edited" in err
    lock = RunDirLock(folder).acquire()  # as a trainer holds a run directory's
    try:
        err = refused([*base, "--checkpoint", folder, "--out", tmp_path / "s"], capsys, folder)
        assert f"{folder} is being trained by process" in err
    finally:
        lock.release()
    assert not (tmp_path / "s").exists()


def test_the_kinds_are_told_by_the_files_their_writers_write(run_dir, folder, tmp_path):
    assert kind_of(run_dir) == RUN and kind_of(folder) == "pretrained folder" and kind_of(tmp_path / "none") is None
    assert {p.name for p in run_dir.iterdir() if not p.name.startswith(".")} <= set(WRITES[RUN])
    assert {p.name for p in folder.iterdir()} == set(WRITES["pretrained folder"]) == {WEIGHTS, CONFIG, CARD}
    write_report(tmp_path / "eval", {"data": "shapes", "split": "test"}, "tinydit eval")
    assert kind_of(tmp_path / "eval") == "evaluation"
    assert {p.name for p in (tmp_path / "eval").iterdir()} <= set(WRITES["evaluation"])
    for kind, marks in KINDS.items():
        assert set(marks) <= set(WRITES[kind]), kind
    # a run stopped before its first checkpoint or log line is told by the config.json it wrote
    early = tmp_path / "early"
    early.mkdir()
    shutil.copyfile(run_dir / "config.json", early / "config.json")
    assert kind_of(early) == RUN


def test_a_checkpoint_object_from_python_is_no_path_to_check(tmp_path):
    state = load_checkpoint(FIXTURES / "dit-0.2m.pt")
    assert read_paths(state, None, FIXTURES / "dit-0.2m.pt") == [FIXTURES / "dit-0.2m.pt"]
    with pytest.raises(TinyDiTError, match="`out` .* is a model shipped with tinydit"):
        api.export(state, "onnx", SHIPPED / "m.onnx")
