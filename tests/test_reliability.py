"""Nothing lost, nothing wrong accepted: the CLI run as a user runs it, with faults injected.

* ``kill -9`` at random moments, then the same command again: the run ends bit-exactly where an
  uninterrupted one ends (fp32), having lost at most ``--ckpt-every`` steps;
* a full disk (a writer that fails with ENOSPC): one line naming the path and the errno, exit 2, the
  previous checkpoint byte-identical, no partial file, and the same command resumes once space is free;
* two trainers on one run directory: the second is refused at once, naming the first one's pid;
* a table of bad inputs over every command: exit 2, one ``error:`` line, no traceback, every file that
  was there byte-identical afterwards and nothing new created.
"""

import errno
import hashlib
import io
import os
import random
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import tinydit.files as files_module
from tinydit.checkpoints.checkpoint import load_checkpoint, load_model
from tinydit.cli import main
from tinydit.data import load_dataset
from tinydit.errors import TinyDiTError
from tinydit.files import RunDirLock

# The conftest fast config as CLI flags: 256 shapes, dit-0.2m, fp32, a checkpoint every 4 steps.
FLAGS = (
    "--data shapes --preset dit-0.2m --batch-size 16 --limit 256 --val-size 32 --log-every 2 "
    "--val-every 4 --sample-every 1000 --ckpt-every 4 --sample-steps 2 --warmup 2 --precision fp32 "
    "--no-report --no-progress"
).split()
# The token-linear kernel pinned: each process's timing probe could pick another on a loaded machine, and
# the reference and the killed run start in different processes (a continuation keeps its own anyway).
ENV = {**os.environ, "TINYDIT_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "TINYDIT_LINEAR_KERNEL": "blas"}


def _train(out: Path, steps: int, *extra) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tinydit", "train", *FLAGS, "--steps", str(steps), "--out", str(out), *map(str, extra)],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _weights(run: Path) -> dict:
    return load_checkpoint(run / "checkpoint.pt").model


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _step(run: Path) -> int:
    try:
        return load_checkpoint(run / "checkpoint.pt").step
    except (TinyDiTError, KeyError):
        return 0


def test_kill_9_at_random_moments_then_the_same_command_ends_bit_exactly(tmp_path):
    steps = 72
    ref = _train(tmp_path / "ref", steps)
    assert ref.wait(timeout=300) == 0, ref.stdout.read().decode()[-2000:]
    rng = random.Random(7)
    run, reached = tmp_path / "killed", []
    for _ in range(3):  # each kill lands mid-training: after a random checkpoint, a random moment later
        proc = _train(run, steps)
        target = min(_step(run) + 4 * rng.randint(2, 6), steps - 24)
        deadline = time.time() + 120
        while _step(run) < target and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 0.05))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        reached.append(_step(run))
        assert reached[-1] % 4 == 0  # only whole checkpoints: a kill mid-save kept the previous one
    assert all(0 < r < steps for r in reached), reached  # every kill interrupted training
    final = _train(run, steps)
    assert final.wait(timeout=300) == 0, final.stdout.read().decode()[-2000:]
    assert _step(run) == steps
    assert _same(_weights(run), _weights(tmp_path / "ref"))


class _FullDisk(io.RawIOBase):
    def writable(self):
        return True

    def write(self, b):
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_is_one_line_keeps_the_last_checkpoint_and_the_command_resumes(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    assert main(["train", *FLAGS, "--steps", "4", "--out", run]) == 0
    before = (run / "checkpoint.pt").read_bytes()
    real_open = open

    def full_disk_open(path, mode="r", *args, **kwargs):  # every atomic write fails as on a full disk
        if "w" in mode and Path(path).name.startswith("."):
            real_open(path, mode).close()  # the temporary file is created, then cannot be written to
            return io.BufferedWriter(_FullDisk()) if "b" in mode else io.TextIOWrapper(io.BufferedWriter(_FullDisk()))
        return real_open(path, mode, *args, **kwargs)

    capsys.readouterr()
    with monkeypatch.context() as m:
        m.setattr(files_module, "open", full_disk_open, raising=False)
        assert main(["train", *FLAGS, "--steps", "8", "--out", run]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if ": error: " in line]
    assert len(lines) == 1 and "ENOSPC" in lines[0] and "free some space" in lines[0] and "Traceback" not in err
    assert str(run) in lines[0]
    assert (run / "checkpoint.pt").read_bytes() == before  # the last good checkpoint, untouched
    assert not [p for p in run.rglob(".*.tmp")]  # no partial file left behind
    assert main(["train", *FLAGS, "--steps", "8", "--out", run]) == 0  # space is back: the same command resumes
    straight = tmp_path / "straight"
    assert main(["train", *FLAGS, "--steps", "8", "--out", straight]) == 0
    assert _same(_weights(run), _weights(straight))


def test_a_second_trainer_on_a_run_directory_is_refused_naming_the_first(tmp_path, capsys):
    run = tmp_path / "run"
    first = _train(run, 100_000)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            if (run / ".lock.pid").is_file() and (run / ".lock.pid").read_text().strip() == str(first.pid):
                break
            time.sleep(0.2)
        else:
            pytest.fail("the first trainer never took the lock: " + first.stdout.read1().decode()[-1000:])
        assert main(["train", *FLAGS, "--steps", "100000", "--out", run]) == 2
        err = capsys.readouterr().err
        assert f"is being trained by process {first.pid}" in err and err.count(": error: ") == 1
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    RunDirLock(run).acquire().release()  # killed: the OS let go of its lock, no stale lock is left


# Two holders of one run directory's lock in a Python without fcntl (as on Windows), where the lock was once
# skipped: the second is refused, naming the first.
WITHOUT_FCNTL = """
import os
import sys
sys.modules["fcntl"] = None  # import fcntl now fails, as on Windows
from pathlib import Path
from tinydit.errors import TinyDiTError
from tinydit.files import RunDirLock
run = Path(sys.argv[1])
first = RunDirLock(run).acquire()
try:
    RunDirLock(run).acquire()
except TinyDiTError as err:
    print(os.getpid())
    print(err)
"""


def test_two_holders_never_hold_one_run_directory_with_or_without_fcntl(tmp_path):
    first = RunDirLock(tmp_path).acquire()
    with pytest.raises(TinyDiTError, match=f"is being trained by process {os.getpid()}"):
        RunDirLock(tmp_path).acquire()
    assert first.acquire() is first  # taken again: still one hold, which one release lets go of
    first.release()
    RunDirLock(tmp_path).acquire().release()
    # A folder of its own: without fcntl on Linux, filelock falls back to a lock file whose presence is the lock
    # (Windows has its own OS lock), and the one above stays in place after its release.
    run = tmp_path / "without-fcntl"
    run.mkdir()
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", WITHOUT_FCNTL, str(run)], env=ENV, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    pid, message = done.stdout.splitlines()
    expected = f"{run} is being trained by process {pid}; wait for it to finish (or stop it), or choose another `out`"
    assert message == expected


def test_sixteen_bit_alpha_and_palette_images_train_as_their_pixels(tmp_path):
    folder = tmp_path / "imgs" / "grey"
    folder.mkdir(parents=True)
    grey16 = np.full((32, 32), 32768, dtype=np.uint16)  # mid grey in 16 bits
    for i in range(2):
        Image.fromarray(grey16).save(folder / f"g{i}.png")
    Image.new("RGBA", (32, 32), (255, 0, 0, 0)).save(folder / "transparent.png")  # fully transparent: white
    Image.new("RGB", (32, 32), (0, 0, 255)).convert("P").save(folder / "palette.png")
    ds = load_dataset(str(tmp_path / "imgs"), train=False)
    means = {p.name: ds.images[i].float().mean(dim=(1, 2)).tolist() for i, p in enumerate(sorted(folder.iterdir()))}
    assert means["g0.png"] == pytest.approx([128.0] * 3, abs=1)  # PIL's own conversion made it almost white
    assert means["transparent.png"] == pytest.approx([255.0] * 3)
    assert means["palette.png"] == pytest.approx([0.0, 0.0, 255.0])


# ------------------------------------------------------------------------------------------- bad input


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    (d / "empty.npz").write_bytes(b"")
    np.savez(d / "good.npz", images=np.zeros((20, 3, 32, 32), np.uint8), labels=np.zeros(20, np.int64))
    (d / "truncated.npz").write_bytes((d / "good.npz").read_bytes()[:100])
    np.savez(d / "nan.npz", images=np.full((20, 3, 32, 32), np.nan, np.float32))
    np.savez(d / "inf.npz", images=np.full((20, 3, 32, 32), np.inf, np.float32))
    np.savez(d / "labels_out.npz", images=np.zeros((20, 3, 32, 32), np.uint8), labels=np.full(20, 7, np.int64))
    np.savez(d / "labels_neg.npz", images=np.zeros((20, 3, 32, 32), np.uint8), labels=np.full(20, -1, np.int64))
    np.savez(d / "labels_float.npz", images=np.zeros((20, 3, 32, 32), np.uint8), labels=np.zeros(20, np.float32))
    np.savez(d / "object.npz", images=np.array([object()] * 20, dtype=object))
    np.savez(d / "int32.npz", images=np.zeros((20, 3, 32, 32), np.int32))
    np.savez(d / "shape.npz", images=np.zeros((20, 3, 16, 16), np.uint8))
    np.savez(d / "noimages.npz", pictures=np.zeros((20, 3, 32, 32), np.uint8))
    np.savez(d / "few.npz", images=np.zeros((3, 3, 32, 32), np.uint8))
    torch.save({"format": "tinydit-checkpoint", "format_version": 1}, d / "fields_only.pt")
    torch.save({"weights": torch.zeros(2)}, d / "other.pt")
    (d / "garbage.pt").write_bytes(b"not a checkpoint at all")
    with zipfile.ZipFile(d / "zip.pt", "w") as z:
        z.writestr("x", "y")
    (d / "file").write_text("a file, not a folder")
    (d / "noimgs").mkdir()
    (d / "noimgs" / "readme.txt").write_text("no images here")
    (d / "corrupt").mkdir()
    (d / "corrupt" / "x.png").write_bytes(b"\x89PNG broken")
    return d


def _cases():
    o = ["--out", "OUT/x"]  # an output path that must not be created
    t = ["train", *FLAGS]
    return [
        # train: values
        (t + ["--steps", "0", *o], "--steps must be >= 1"),
        (t + ["--steps", "-3", *o], "--steps must be >= 1"),
        (t + ["--minutes", "0", *o], "--minutes must be > 0"),
        (t + ["--minutes", "nan", *o], "--minutes must be a finite number"),
        (t + ["--minutes", "inf", *o], "--minutes must be a finite number"),
        (t + ["--lr", "nan", *o], "--lr must be a finite number"),
        (t + ["--lr", "-1e-3", *o], "--lr must be > 0, got -0.001"),
        (t + ["--lr", "0", *o], "--lr must be > 0"),
        (t + ["--t-shift", "nan", *o], "--t-shift must be a finite number"),
        (t + ["--t-shift", "0", *o], "--t-shift must be > 0"),
        (t + ["--batch-size", "0", *o], "--batch-size must be >= 1"),
        (t + ["--ema-decay", "1", *o], "--ema-decay must be in [0, 1)"),
        (t + ["--ema-decay", "nan", *o], "--ema-decay must be a finite number"),
        (t + ["--class-dropout", "-0.1", *o], "--class-dropout must be in [0, 1)"),
        (t + ["--warmup", "-1", *o], "--warmup, --weight-decay and --grad-clip must be >= 0"),
        (t + ["--grad-clip", "inf", *o], "--grad-clip must be a finite number"),
        (t + ["--weight-decay", "nan", *o], "--weight-decay must be a finite number"),
        (t + ["--cooldown", "-1", *o], "--cooldown must be >= 0"),
        (t + ["--cooldown", "5000", *o], "--cooldown 5000 is a fall over the last 5000"),
        (t + ["--sample-cfg", "nan", *o], "--sample-cfg must be a finite number"),
        (t + ["--sample-cfg", "-1", *o], "--sample-cfg (guidance scale) must be >= 0"),
        (t + ["--log-every", "0", *o], "--log-every must be >= 1"),
        (t + ["--limit", "0", *o], "--limit must be >= 1"),
        (t + ["--seed", "99999999999999999999", *o], "--seed must be an integer between"),
        (t + ["--eval-n", "3", *o], "--eval-n >= 10"),
        (t + ["--eval-every", "-1", *o], "--eval-every must be >= 0"),
        (t + ["--teacher-cfg-interval", "0.1", "nan", *o], "--teacher-cfg-interval must be a finite number"),
        # train: choices and combinations
        (t + ["--preset", "huge", *o], "unknown preset 'huge'"),
        (t + ["--model", "mmdit", "--cond", "class", "--preset", "mmdit-0.2m", *o], "use --model dit for class"),
        (t + ["--holdout", "red triangle", *o], "add --cond text"),
        (t + ["--teacher", "BAD/other.pt", *o], "--teacher is only used with --objective distill"),
        (t + ["--objective", "distill", *o], "pass its checkpoint.pt with --teacher"),
        (t + ["--objective", "distill", "--teacher", "BAD/garbage.pt", *o], "not a readable TinyDiT checkpoint"),
        (t + ["--precision", "fp16", "--device", "cpu", *o], "fp16 needs a CUDA device"),
        (t + ["--device", "tpu", *o], "unknown device 'tpu'"),
        (t + ["--device", "cuda:3", *o], "CUDA is not available here"),
        (t + ["--eval-every", "10", "--data", "BAD/file", *o], "is not a folder"),
        # train: data
        (t + ["--data", "cifar10", "--data-root", "BAD/noimgs", *o], "CIFAR-10 is not in"),
        (t + ["--data", "BAD/noimgs", *o], "no images found"),
        (t + ["--data", "BAD/corrupt", *o], "1 unreadable images"),
        (t + ["--data", "mnist-ish", *o], "unknown data set"),
        (t + ["--resume", *o], "--resume given, but"),
        (t + ["--out", "BAD/file/run"], "cannot write to output directory"),
        # sample
        (["sample", "--checkpoint", "BAD/missing.pt", *o], "does not exist"),
        (["sample", "--checkpoint", "BAD/other.pt", *o], "not a TinyDiT checkpoint"),
        (["sample", "--checkpoint", "BAD/garbage.pt", *o], "not a readable TinyDiT checkpoint"),
        (["sample", "--checkpoint", "BAD/zip.pt", *o], "not a readable TinyDiT checkpoint"),
        (["sample", "--checkpoint", "BAD/fields_only.pt", *o], "lacks model_config, train_config, data, step"),
        (["sample", "--checkpoint", "CKPT", "--cfg", "inf", "--out", "OUT/x.png"], "--cfg-scale (the guidance scale"),
        (["sample", "--checkpoint", "CKPT", "--cfg", "nan", "--out", "OUT/x.png"], "--cfg-scale (the guidance scale"),
        (["sample", "--checkpoint", "CKPT", "--steps", "0", "--out", "OUT/x.png"], "--steps must be >= 1"),
        (["sample", "--checkpoint", "CKPT", "--n", "0", "--out", "OUT/x.png"], "--n must be >= 1"),
        (["sample", "--checkpoint", "CKPT", "--nrow", "0", "--out", "OUT/x.png"], "--nrow must be >= 1"),
        (["sample", "--checkpoint", "CKPT", "--seed", "99999999999999999999", "--out", "OUT/x.png"], "--seed must be"),
        (
            ["sample", "--checkpoint", "CKPT", "--shift", "nan", "--grid", "shifted", "--out", "OUT/x.png"],
            "--shift must be a positive number",
        ),
        (["sample", "--checkpoint", "CKPT", "--cfg-interval", "nan", "1", "--out", "OUT/x.png"], "LO HI needs"),
        (
            ["sample", "--checkpoint", "CKPT", "--eta", "nan", "--sampler", "ancestral", "--out", "OUT/x.png"],
            "--eta must be in [0, 1]",
        ),
        (
            ["sample", "--checkpoint", "CKPT", "--rtol", "-1e-3", "--sampler", "dopri5", "--out", "OUT/x.png"],
            "--rtol must be a positive number",
        ),
        (["sample", "--checkpoint", "CKPT", "--out", "OUT/x.txt"], "use an image file"),
        (["sample", "--checkpoint", "CKPT", "--out", "BAD/file/x.png"], "not a directory"),
        (["sample", "--checkpoint", "CKPT", "--class", "hexagon", "--out", "OUT/x.png"], "unknown class 'hexagon'"),
        (["sample", "--checkpoint", "CKPT", "--class", "9", "--out", "OUT/x.png"], "unknown class '9'"),
        (["sample", "--checkpoint", "CKPT", "--prompt", "a red circle", "--out", "OUT/x.png"], "is class-conditional"),
        (
            ["sample", "--checkpoint", "CKPT", "--unconditional", "--class", "circle", "--out", "OUT/x.png"],
            "drop --class and --prompt",
        ),
        # eval
        (["eval", "--samples", "BAD/empty.npz", "--data", "shapes", *o], "not a readable .npz"),
        (["eval", "--samples", "BAD/truncated.npz", "--data", "shapes", *o], "not a readable .npz"),
        (["eval", "--samples", "BAD/object.npz", "--data", "shapes", *o], "not a readable .npz"),
        (["eval", "--samples", "BAD/nan.npz", "--data", "shapes", *o], "hold NaN or infinite values"),
        (["eval", "--samples", "BAD/inf.npz", "--data", "shapes", *o], "hold NaN or infinite values"),
        (["eval", "--samples", "BAD/labels_out.npz", "--data", "shapes", *o], "labels range over 7..7"),
        (["eval", "--samples", "BAD/labels_neg.npz", "--data", "shapes", *o], "labels range over -1..-1"),
        (["eval", "--samples", "BAD/labels_float.npz", "--data", "shapes", *o], "give integer class ids"),
        (["eval", "--samples", "BAD/int32.npz", "--data", "shapes", *o], "dtype torch.int32"),
        (["eval", "--samples", "BAD/shape.npz", "--data", "shapes", *o], "accepted sizes are 3x32x32"),
        (["eval", "--samples", "BAD/noimages.npz", "--data", "shapes", *o], "has no 'images' array"),
        (["eval", "--samples", "BAD/few.npz", "--data", "shapes", *o], "too few to evaluate"),
        (["eval", "--samples", "BAD/missing.npz", "--data", "shapes", *o], "does not exist"),
        (["eval", "--samples", "BAD/good.npz", *o], "needs --data"),
        (["eval", "--samples", "BAD/noimgs", "--data", "shapes", *o], "no images in"),
        (["eval", "--checkpoint", "BAD/fields_only.pt", *o], "lacks model_config"),
        (["eval", "--checkpoint", "CKPT", "--n", "0", *o], "--n must be >= 1"),
        (["eval", "--checkpoint", "CKPT", "--seed", "99999999999999999999", *o], "--seed must be"),
        (["eval", "--checkpoint", "CKPT", "--cfg", "inf", *o], "--cfg-scale (the guidance scale"),
        (["eval", "--checkpoint", "CKPT", "--data", "fashion-mnist", *o], "not fashion-mnist; drop --data"),
        # sweep
        (["sweep", "--checkpoint", "CKPT", "--steps", "0", *o], "--steps must be >= 1"),
        (["sweep", "--checkpoint", "CKPT", "--seed", "-99999999999999999999", *o], "--seed must be"),
        (["sweep", "--checkpoint", "CKPT", "--batch-size", "0", *o], "--batch-size must be >= 1"),
        (["sweep", "--checkpoint", "CKPT", "--n", "3", *o], "too few samples to score"),
        (["sweep", "--checkpoint", "CKPT", "--cfg", "1,inf", *o], "--cfg-scale (the guidance scale"),
        (["sweep", "--checkpoint", "CKPT", "--tols", "nan", "--samplers", "dopri5", *o], "--tols must be positive"),
        (["sweep", "--checkpoint", "CKPT", "--samplers", "rk4", *o], "unknown sampler 'rk4'"),
        (["sweep", "--checkpoint", "CKPT", "--steps", "4,x", *o], "comma-separated list"),
        (["sweep", "--checkpoint", "BAD/missing.pt", *o], "does not exist"),
        # export
        (["export", "--checkpoint", "CKPT", "--format", "zip", "--out", "OUT/x"], "unknown --format 'zip'"),
        (["export", "--checkpoint", "BAD/missing.pt", "--format", "onnx", "--out", "OUT/x.onnx"], "does not exist"),
        (["export", "--pretrained", "nope", "--format", "safetensors", "--out", "OUT/x"], "unknown --pretrained model"),
        # report
        (["report", "BAD/noimgs"], "holds no training run"),
        (["report", "BAD/missing"], "holds no training run"),
    ]


CASES = _cases()


def test_the_bad_input_table_covers_every_command_that_takes_input():
    """A command added to the CLI without bad-input cases fails here (``presets`` takes none)."""
    import argparse

    from tinydit.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    covered = {args[0] for args, _ in CASES}
    assert covered == set(sub.choices) - {"presets"}, set(sub.choices) - {"presets"} - covered
    assert min(sum(args[0] == name for args, _ in CASES) for name in covered) >= 2


@pytest.mark.parametrize("args, message", CASES, ids=[f"{i:02d}-{a[0]}" for i, (a, _) in enumerate(CASES)])
def test_bad_input_is_one_line_exit_2_and_touches_nothing(args, message, tmp_path, tiny_run, bad_files, capsys):
    ckpt = tiny_run[0] / "checkpoint.pt"
    args = [
        str(a).replace("CKPT", str(ckpt)).replace("BAD", str(bad_files)).replace("OUT", str(tmp_path)) for a in args
    ]
    watched = {root: _digest(root) for root in (tmp_path, bad_files, tiny_run[0])}
    code = main(args)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if ": error: " in line]
    assert code == 2 and len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err
    for root, before in watched.items():
        assert _digest(root) == before, f"{root} changed"  # nothing written, nothing created


def test_a_checkpoint_of_format_fields_only_is_refused_from_python(bad_files):
    with pytest.raises(TinyDiTError, match="lacks model_config, train_config, data, step, data.name, data.classes"):
        load_model(bad_files / "fields_only.pt")
