import argparse
import os
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from tinydit import flags
from tinydit.cli import build_parser, main

FAST_TRAIN = (
    "--preset dit-0.2m --batch-size 16 --limit 64 --log-every 2 --val-every 3 --sample-every 3 "
    "--sample-steps 2 --warmup 2 --no-progress"
).split()


def run(args, capsys):
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.err


@pytest.mark.parametrize(
    "sampler, steps, n, columns", [("euler", 3, 10, 3), ("euler", 20, 2, 16), ("dopri5", 2, 2, None)]
)
def test_sample_trajectory_draws_each_image_from_noise_to_the_sample(sampler, steps, n, columns, tmp_path, capsys):
    """--trajectory: a row per image (at most 8), a column per step (at most 16, the last always), beside --out;
    its last column is the samples themselves."""
    from pathlib import Path

    from tinydit import api

    ckpt = Path(__file__).parent / "fixtures" / "dit-0.2m.pt"
    args = ["sample", "--checkpoint", ckpt, "--n", n, "--sampler", sampler, "--steps", steps, "--device", "cpu"]
    tol = {"rtol": 1e-2, "atol": 1e-2} if sampler == "dopri5" else {}
    args += [a for k, v in tol.items() for a in (f"--{k}", v)]
    code, err = run([*args, "--trajectory", "--out", tmp_path / "samples.png"], capsys)
    assert code == 0, err
    res = api.sample(ckpt, n, sampler=sampler, steps=steps, device="cpu", trajectory=True, **tol)
    columns = columns or len(res.trajectory)  # dopri5: its accepted steps
    assert res.trajectory.shape == (len(res.trajectory), min(n, 8), 3, 32, 32) and columns <= 16
    assert torch.equal(res.trajectory[-1], res.x[:8])
    assert f"trajectory to {tmp_path / 'samples_trajectory.png'}" in err
    rows = min(n, 8)
    assert Image.open(tmp_path / "samples_trajectory.png").size == (columns * 34 + 2, rows * 34 + 2)
    run([*args, "--out", tmp_path / "plain.png"], capsys)
    assert not (tmp_path / "plain_trajectory.png").exists()  # only when asked


def test_train_then_sample_every_output_kind(tmp_path, capsys):
    out = tmp_path / "run"
    code, err = run(["train", "--data", "shapes", "--steps", 3, "--out", out, *FAST_TRAIN], capsys)
    assert code == 0, err
    assert (out / "checkpoint.pt").exists() and (out / "samples.png").exists()
    ckpt = out / "checkpoint.pt"

    code, err = run(["sample", "--checkpoint", ckpt, "--n", 6, "--steps", 2, "--out", tmp_path / "g.png"], capsys)
    assert code == 0, err
    assert "4 model evaluations per image" in err  # 2 steps x (conditional + unconditional)
    assert re.search(r" s on (cpu|cuda|mps)", err)  # the device `--device auto` chose
    assert Image.open(tmp_path / "g.png").size == (4 * 34 + 2, 2 * 34 + 2)  # one column per class

    code, err = run(
        ["sample", "--checkpoint", ckpt, "--n", 5, "--steps", 2, "--cfg", 1, "--out", tmp_path / "s.npz"], capsys
    )
    assert code == 0 and "2 model evaluations" in err
    data = np.load(tmp_path / "s.npz")
    assert data["images"].dtype == np.uint8 and data["images"].shape == (5, 3, 32, 32)
    assert data["labels"].dtype == np.int64 and data["labels"].tolist() == [0, 1, 2, 3, 0]

    code, err = run(
        ["sample", "--checkpoint", ckpt, "--n", 3, "--steps", 1, "--class", "square", "--out", tmp_path / "dir"], capsys
    )
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "dir").iterdir()) == [f"0000{i}_square.png" for i in range(3)]

    # the same seed gives the same images, another seed others
    run(["sample", "--checkpoint", ckpt, "--n", 5, "--steps", 2, "--cfg", 1, "--out", tmp_path / "t.npz"], capsys)
    run(
        ["sample", "--checkpoint", ckpt, "--n", 5, "--steps", 2, "--cfg", 1, "--seed", 1, "--out", tmp_path / "u.npz"],
        capsys,
    )
    assert np.array_equal(np.load(tmp_path / "t.npz")["images"], data["images"])
    assert not np.array_equal(np.load(tmp_path / "u.npz")["images"], data["images"])


def test_sampler_options_reach_the_sampler_and_count_evaluations(tmp_path, capsys, tiny_run):
    ckpt = tiny_run[0] / "checkpoint.pt"
    base = ["sample", "--checkpoint", ckpt, "--n", 4, "--steps", 2, "--cfg", 2]
    # Heun on the grid 1, 1/2, 0 evaluates at t = 1, 1/2, 1/2 (its last step is Euler's); guided only at t = 1.
    code, err = run([*base, "--sampler", "heun", "--cfg-interval", 0.6, 1, "--out", tmp_path / "h.npz"], capsys)
    assert code == 0 and "(heun, 4 model evaluations per image" in err, err
    code, err = run(
        [*base, "--sampler", "midpoint", "--grid", "shifted", "--shift", 2, "--out", tmp_path / "m.npz"], capsys
    )
    assert code == 0 and "(midpoint, 8 model evaluations per image" in err, err
    code, err = run([*base, "--sampler", "dopri5", "--rtol", 0.05, "--atol", 0.05, "--out", tmp_path / "d.npz"], capsys)
    assert code == 0 and "(dopri5, " in err, err
    # The ancestral sampler: one evaluation per step, two while guided (here both steps); eta 0 is Euler.
    code, err = run([*base, "--sampler", "ancestral", "--eta", 0.5, "--out", tmp_path / "a.npz"], capsys)
    assert code == 0 and "(ancestral, 4 model evaluations per image" in err, err
    code, err = run([*base, "--sampler", "ancestral", "--eta", 0, "--out", tmp_path / "z.npz"], capsys)
    assert code == 0, err
    code, err = run([*base, "--sampler", "euler", "--out", tmp_path / "e.npz"], capsys)
    assert code == 0, err
    images = [np.load(tmp_path / f"{k}.npz")["images"] for k in "hmdaze"]
    assert all(x.shape == (4, 3, 32, 32) for x in images) and not np.array_equal(images[0], images[1])
    assert np.array_equal(images[4], images[5]) and not np.array_equal(images[3], images[5])


def test_sample_in_bf16_stays_close_to_fp32(tmp_path, capsys, tiny_run):
    base = ["sample", "--checkpoint", tiny_run[0] / "checkpoint.pt", "--n", 4, "--steps", 2, "--device", "cpu"]
    for precision in ("fp32", "bf16"):
        code, err = run([*base, "--precision", precision, "--out", tmp_path / f"{precision}.npz"], capsys)
        assert code == 0, err
    a, b = (np.load(tmp_path / f"{p}.npz")["images"].astype(int) for p in ("fp32", "bf16"))
    assert np.abs(a - b).mean() < 3  # uint8 levels: bf16 rounding, not a different image
    assert not np.array_equal(a, b)  # and bf16 really ran


def test_rerunning_the_same_command_continues(tmp_path, capsys):
    args = ["train", "--data", "shapes", "--out", tmp_path, *FAST_TRAIN]
    assert run([*args, "--steps", 2], capsys)[0] == 0
    code, err = run([*args, "--steps", 4], capsys)
    assert code == 0 and "continuing" in err and "from step 2" in err
    code, err = run([*args, "--steps", 4], capsys)
    assert code == 0 and "already trained to step 4; raise --steps to continue" in err
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["step"] == 4


def _empty_folder(tmp_path):
    (tmp_path / "empty").mkdir()  # beside the run directory: a run inside its data folder is refused first
    return tmp_path / "empty"


def _folder_with_only_corrupt_files(tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.png").write_bytes(b"nope")
    return tmp_path / "bad"


def _not_a_checkpoint(tmp_path):
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    return tmp_path / "other.pt"


@pytest.mark.parametrize(
    "make_args, message",
    [
        (lambda p: ["train", "--data", "cifar10", "--data-root", p / "empty", "--out", p / "r"], "CIFAR-10 is not in"),
        (lambda p: ["train", "--data", _empty_folder(p), "--out", p / "r"], "no images found"),
        (lambda p: ["train", "--data", _folder_with_only_corrupt_files(p), "--out", p / "r"], "1 unreadable images"),
        (lambda p: ["train", "--data", "mnist-ish", "--out", p / "r"], "unknown data set 'mnist-ish'"),
        (lambda p: ["train", "--preset", "huge", "--out", p / "r"], "unknown preset"),
        (lambda p: ["train", "--steps", 0, "--out", p / "r"], "--steps must be >= 1"),
        (lambda p: ["sample", "--checkpoint", p / "missing.pt"], "does not exist"),
        (lambda p: ["sample", "--checkpoint", _not_a_checkpoint(p)], "not a TinyDiT checkpoint"),
        (lambda p: ["sample", "--checkpoint", "CKPT", "--class", "hexagon"], "unknown class 'hexagon'"),
        (lambda p: ["sample", "--checkpoint", "CKPT", "--steps", 0], "--steps must be >= 1"),
        (lambda p: ["sample", "--checkpoint", "CKPT", "--cfg", -1], "--cfg-scale (the guidance scale) must be >= 0"),
        (lambda p: ["sample", "--checkpoint", "CKPT", "--out", p / "f.txt"], "use an image file"),
        (lambda p: ["sample", "--checkpoint", "CKPT", "--n", 0, "--out", p / "x.png"], "--n must be >= 1"),
        (lambda p: ["sample", "--checkpoint", "CKPT", "--sampler", "rk4"], "unknown sampler 'rk4': use one of euler"),
        (lambda p: ["sample", "--checkpoint", "CKPT", "--grid", "karras"], "unknown time grid 'karras'"),
        (lambda p: ["sample", "--checkpoint", "CKPT", "--shift", 2], "--shift applies to the shifted grid only"),
        (lambda p: ["sample", "--checkpoint", "CKPT", "--cfg-interval", 0.9, 0.1], "needs 0 <= LO <= HI <= 1"),
        (lambda p: ["sample", "--checkpoint", "CKPT", "--rtol", 1e-3], "--rtol applies to the adaptive sampler"),
        (lambda p: ["sample", "--checkpoint", "CKPT", "--eta", 0.5], "--eta applies to the stochastic sampler"),
        (lambda p: ["eval", "--checkpoint", "CKPT", "--sampler", "rk4", "--out", p / "e"], "unknown sampler 'rk4'"),
        (
            lambda p: [
                "sample",
                "--checkpoint",
                "CKPT",
                "--precision",
                "fp16",
                "--device",
                "cpu",
                "--out",
                p / "x.png",
            ],
            "--precision fp16 needs a CUDA device",
        ),
        (lambda p: ["train", "--precision", "fp16", "--device", "cpu", "--out", p / "r"], "fp16 needs a CUDA device"),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_2(tmp_path, capsys, tiny_run, make_args, message):
    ckpt = tiny_run[0] / "checkpoint.pt"
    args = [ckpt if a == "CKPT" else a for a in make_args(tmp_path)]
    code, err = run(args, capsys)
    assert code == 2
    lines = [line for line in err.splitlines() if ": error: " in line]
    assert len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_output_directory(tmp_path, capsys, tiny_run):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    code, err = run(["sample", "--checkpoint", tiny_run[0] / "checkpoint.pt", "--out", locked / "x.png"], capsys)
    assert code == 2 and "not writable" in err


def test_unwritable_output_even_for_root(capsys, tiny_run):
    code, err = run(["train", "--out", "/proc/tinydit-run"], capsys)  # /proc refuses new entries to root too
    assert code == 2 and "cannot write to output directory /proc/tinydit-run" in err
    code, err = run(["sample", "--checkpoint", tiny_run[0] / "checkpoint.pt", "--out", "/proc/tinydit/x.png"], capsys)
    assert code == 2 and "cannot create output directory /proc/tinydit" in err


def test_output_under_a_file_is_a_clear_error(tmp_path, capsys, tiny_run):
    (tmp_path / "file").write_text("")
    code, err = run(["train", "--out", tmp_path / "file" / "run"], capsys)
    assert code == 2 and "cannot write to output directory" in err
    code, err = run(
        ["sample", "--checkpoint", tiny_run[0] / "checkpoint.pt", "--out", tmp_path / "file" / "x.png"], capsys
    )
    assert code == 2 and "not a directory" in err


def test_only_tinydits_own_warnings_are_shown_as_tinydits(capsys):
    # torch 2.11 deprecates APIs that torch itself still calls: once every filter was "default", those
    # came out as "tinydit: warning: `torch.jit.script_method` is deprecated" (seen on CUDA)
    ours = flags.__file__
    with warnings.catch_warnings():  # Python's own filters and handler, in place of pytest's
        warnings.resetwarnings()
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.showwarning = lambda message, *_, **__: print(f"python: {message}", file=sys.stderr)
        with flags.user_warnings({"cfg_scale": "--cfg"}):
            warnings.warn_explicit("`cfg_scale` is high", UserWarning, ours, 1, module="tinydit.flags")
            warnings.warn_explicit("a torch notice", UserWarning, "/site/torch/nn/x.py", 1, module="torch.nn.x")
            warnings.warn_explicit("old api", DeprecationWarning, "/site/torch/jit/x.py", 1, module="torch.jit.x")
    err = capsys.readouterr().err
    assert "tinydit: warning: --cfg is high" in err, err
    assert "python: a torch notice" in err and "tinydit: warning: a torch notice" not in err, err
    assert "old api" not in err, err  # hidden, as Python hides a library's deprecations


def test_console_script_and_module_entry_point():
    # -X importtime lists every module the command imported: the plotting, logging and export libraries
    # cost seconds at every start (each rank of a torchrun job pays them), so they load where they are used
    for cmd in (["tinydit", "presets"], [sys.executable, "-X", "importtime", "-m", "tinydit", "presets"]):
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        assert "dit-1.9m" in res.stdout and "(default)" in res.stdout
    imported = {line.split("|")[-1].strip().split(".")[0] for line in res.stderr.splitlines() if "|" in line}
    assert "torch" in imported and "tinydit" in imported  # the listing is there to read
    assert not imported & {"matplotlib", "tensorboard", "onnx", "onnxruntime", "onnxscript", "torchvision"}, imported
    res = subprocess.run(["tinydit", "sample", "--checkpoint", "nope.pt"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "does not exist" in res.stderr


TRAIN_GROUPS = ["data", "model", "objective", "optimisation", "budget", "device", "output", "evaluation"]
# Words of experiment history, which a flag's help must not carry: it says what the flag does and its default.
HISTORY = re.compile(
    r"raised|measured|session|aimed|fast hour|slow hour|experiment|\d\s*%|percent"
    r"|\b(19\d\d|20[1-9]\d)\b"  # a year
    r"|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b",  # a commit hash
    re.IGNORECASE,
)


def _train_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["train"]


def test_train_help_puts_every_flag_in_one_of_its_groups_in_order():
    train = _train_parser()
    groups = [g for g in train._action_groups if g not in (train._positionals, train._optionals)]
    assert [g.title for g in groups] == TRAIN_GROUPS
    grouped = [a.dest for g in groups for a in g._group_actions]
    options = [a.dest for a in train._actions if a.option_strings and a.dest != "help"]
    assert sorted(grouped) == sorted(options)  # every flag in a group, and in one only
    assert [a.dest for a in train._optionals._group_actions] == ["help"]


def test_train_help_says_each_default_and_no_experiment_history():
    train = _train_parser()
    formatter = train._get_formatter()
    for action in train._actions:
        if action.dest == "help":
            continue
        help_ = formatter._get_help_string(action) % vars(action)
        assert "(default: " in help_ and "(default: None)" not in help_, (action.option_strings, help_)
        assert not HISTORY.search(help_), (action.option_strings, help_)
    text = train.format_help()
    assert not HISTORY.search(text), HISTORY.search(text)
    # the words of the pattern do catch what the help once said
    assert HISTORY.search("logit-normal for text runs (it raised MMDiT's all-attribute accuracy on shapes)")
    assert HISTORY.search("a 2026-12-03 run") and HISTORY.search("fixed in 62bc02f")


@pytest.mark.parametrize(
    "args, message",
    [
        # an empty --pretrained was taken for "not given", and None went on to a traceback
        (["sample", "--pretrained", ""], "--pretrained is empty: give the name of a model shipped with tinydit"),
        (["sample", "--checkpoint", " "], "--checkpoint is ' ': give a checkpoint.pt, a run directory or"),
        (["sample", "--checkpoint", "CKPT", "--out", ""], "--out is empty: give the file or folder to write"),
        (["sample", "--checkpoint", "CKPT", "--class", ""], "--class '' holds a blank name"),
        (["sample", "--pretrained", "shapes-text", "--prompt", " "], "an empty prompt would sample with no caption"),
        (["eval", "--checkpoint", "CKPT", "--data", "", "--out", "OUT/e"], "--data is empty"),
        (["eval", "--samples", "\t", "--data", "shapes", "--out", "OUT/e"], "--samples is '\\t'"),
        (["sweep", "--checkpoint", "", "--out", "OUT/s"], "--checkpoint is empty"),
        (["export", "--checkpoint", "CKPT", "--format", "safetensors", "--out", "  "], "--out is '  '"),
        (["train", "--out", ""], "--out is empty: give the run directory"),
        (["train", "--data", " ", "--out", "OUT/r"], "--data is ' '"),
        (["train", "--objective", "distill", "--teacher", "", "--out", "OUT/r"], "--teacher is empty"),
        (["report", ""], "run_dir is empty: give a run directory"),
    ],
)
def test_a_blank_name_or_path_is_refused_by_name_in_every_command(
    args, message, tmp_path, capsys, tiny_run, monkeypatch
):
    args = [str(tiny_run[0] / "checkpoint.pt") if a == "CKPT" else a.replace("OUT", str(tmp_path)) for a in args]
    monkeypatch.chdir(tmp_path)  # where a blank path would have written
    code, err = run(args, capsys)
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert list(tmp_path.iterdir()) == []  # nothing written, not even into the current folder


def test_a_path_with_spaces_stays_a_path(tmp_path, capsys, tiny_run):
    out = tmp_path / "my samples" / "a b.png"
    code, err = run(["sample", "--checkpoint", tiny_run[0], "--n", 2, "--steps", 1, "--out", out], capsys)
    assert code == 0 and out.is_file(), err


# What each command hands its API function: every flag it defines (a list flag of sweep, parsed), by name.
CALLED = {"sample": "sample", "eval": "evaluate", "sweep": "sweep", "export": "export"}
NOT_PASSED = {"func", "command", "argv", "pretrained", "nproc"}  # the CLI's own, or read before the call


@pytest.mark.parametrize("command", sorted(CALLED))
def test_every_flag_of_a_command_reaches_its_api_call(command, monkeypatch):
    """The CLI calls the API explicitly: each flag's value, whatever it is, arrives in the call (a flag left
    out of a ``cmd_*`` call fails here), and no argument arrives that no flag gave."""
    from tinydit import api, cli

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    dests = {a.dest for a in sub._actions if a.dest != "help"} - NOT_PASSED
    args = argparse.Namespace(command=command, argv=[command], pretrained=None, nproc=None, func=None)
    marks = {dest: object() for dest in dests}  # a value no default could equal
    lists = {"samplers": "euler", "steps": "4", "cfg_scales": "1", "tols": "1e-3"} if command == "sweep" else {}
    vars(args).update({**marks, **lists})
    seen = {}

    def record(*given, **kw):
        seen.update(kw, positional=given)
        raise SystemExit  # the call is all this test needs

    monkeypatch.setattr(api, CALLED[command], record)
    with pytest.raises(SystemExit):
        getattr(cli, f"cmd_{command}")(args)
    arrived = [*seen.pop("positional"), *seen.values()]
    missing = sorted(d for d, mark in marks.items() if d not in lists and not any(v is mark for v in arrived))
    assert missing == []
    for name in lists:  # parsed into lists of their kind
        assert seen[name] and all(not isinstance(v, str) or name == "samplers" for v in seen[name])
    extra = set(seen) - dests - {"command", "progress", "data_root", *lists}
    assert extra == set(), extra


def test_the_flag_check_fails_when_a_flag_is_dropped(monkeypatch):
    """The negative control: a cmd_export that forgets --about is caught."""
    from tinydit import cli

    real = cli.cmd_export

    def forgetful(args):
        args.about = None
        return real(args)

    monkeypatch.setattr(cli, "cmd_export", forgetful)
    with pytest.raises(AssertionError):
        test_every_flag_of_a_command_reaches_its_api_call("export", monkeypatch)
