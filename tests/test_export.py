"""tinydit export: ONNX and torch.export programs that compute what the model computes, a sampler with
numpy and onnxruntime alone that draws what ``tinydit sample`` draws, and a page that draws it in a
real browser."""

import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import CHROMIUM, NEEDS_CHROMIUM, built_once, chromium

from tinydit.checkpoints.checkpoint import Checkpoint, DataRecord, load_checkpoint, load_model
from tinydit.cli import main
from tinydit.data.text import Tokenizer
from tinydit.export import ORT_WEB_FILES, STAND_IN, export, find_ort_web, ort_sampler
from tinydit.export.ort_sampler import OnnxSampler, to_uint8
from tinydit.flow.generate import generate
from tinydit.flow.grids import DEFAULT_SHIFT, time_grid, uniform_grid
from tinydit.flow.guidance import Velocity
from tinydit.flow.samplers import SAMPLER_NAMES, ancestral, sample
from tinydit.flow.settings import SamplingSettings
from tinydit.images import to_uint8 as torch_to_uint8
from tinydit.models.dit import DiTConfig
from tinydit.models.mmdit import MMDiTConfig
from tinydit.models.registry import build_model

ort = pytest.importorskip("onnxruntime", reason="the export extra: pip install 'tinydit[export]'")
FIXTURES = Path(__file__).parent / "fixtures"
TOKENIZER = Tokenizer(tuple(f"w{i}" for i in range(9)), 6)  # 12 ids, L = 6
BASE = DiTConfig(dim=32, depth=2, n_heads=2)
VARIANTS = {
    "dit": BASE,
    "dit-switches": replace(BASE, norm="rmsnorm", qk_norm=True, mlp="swiglu", pos="rope"),
    "dit-x-pred-grey": DiTConfig(img_size=28, in_channels=1, dim=32, depth=1, n_heads=2, pred="x"),
    "dit-shortcut": replace(BASE, shortcut=True),
    "dit-text": DiTConfig(dim=32, depth=1, n_heads=2, cond="text", vocab_size=12, text_len=6, text_depth=1),
    "mmdit": MMDiTConfig(dim=32, depth=2, n_heads=2, single_blocks=1, vocab_size=12, text_len=6, text_depth=1),
}
TOLERANCE = 1e-4  # fp32: different kernels sum in different orders; the outputs are O(1)


def _state(config) -> Checkpoint:
    """A checkpoint of a randomly initialised (and then jittered) model of ``config``."""
    kind = "mmdit" if isinstance(config, MMDiTConfig) else "dit"
    torch.manual_seed(0)
    model = build_model(kind, config)
    for p in model.parameters():
        p.data.add_(0.05 * torch.randn_like(p))  # off the zero init, so every weight matters
    classes = [f"c{i}" for i in range(config.n_classes)]
    tokenizer = TOKENIZER.to_dict() if config.cond == "text" else None
    weights = model.state_dict()
    data = DataRecord("shapes", tuple(classes))
    return Checkpoint(kind, config, {}, data, step=0, model=weights, ema=weights, tokenizer=tokenizer)


def _inputs(config, n: int):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, config.in_channels, config.img_size, config.img_size, generator=g)
    t = torch.rand(n, generator=g)
    y = (
        torch.arange(n) % (config.n_classes + 1)
        if config.cond == "class"
        else torch.randint(3, config.vocab_size, (n, config.text_len), generator=g)
    )
    return (x, t, y) + ((torch.rand(n, generator=g),) if config.shortcut else ())


@pytest.fixture(scope="session")
def exported(tmp_path_factory) -> dict[str, Path]:
    """The fixture checkpoints exported to ONNX once, for the tests of the samplers that read them (exporting
    itself is tested above and below, on every variant and through the CLI)."""

    def build(root: Path) -> None:
        for name in ("dit", "mmdit"):
            export(FIXTURES / f"{name}-0.2m.pt", "onnx", root / f"{name}.onnx")

    root = built_once(tmp_path_factory, "onnx-exports", build)
    return {name: root / f"{name}.onnx" for name in ("dit", "mmdit")}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_onnx_and_pt2_compute_what_the_model_computes(name, tmp_path):
    config = VARIANTS[name]
    state = _state(config)
    model, _ = load_model(state)
    onnx_path = export(state, "onnx", tmp_path / "m.onnx")
    program = torch.export.load(export(state, "pt2", tmp_path / "m.pt2")).module()
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    for n in (1, 3, 8):  # one dynamic batch: guidance's doubled batch runs in the same program
        args = _inputs(config, n)
        with torch.no_grad():
            ref = model(*args)
            pt2 = program(*args)
        feed = dict(zip(["x", "t", "y", "d"], (a.numpy() for a in args), strict=False))
        out = session.run(None, feed)[0]
        assert out.shape == tuple(ref.shape)
        assert np.abs(out - ref.numpy()).max() < TOLERANCE
        assert (pt2 - ref).abs().max().item() < TOLERANCE
    meta = json.loads(session.get_modelmeta().custom_metadata_map["tinydit"])
    assert meta["image"] == {"channels": config.in_channels, "size": config.img_size} and meta["cond"] == config.cond
    assert (meta["tokenizer"] is not None) == (config.cond == "text") and "t = 1 is Gaussian noise" in meta["time"]


@pytest.mark.parametrize(
    "name, sampler, steps, options",
    [
        ("dit", "euler", 6, {}),
        ("dit", "heun", 6, {"cfg_interval": (0.1, 0.8)}),
        ("mmdit", "heun", 6, {}),
        ("dit", "midpoint", 6, {"cfg_interval": (0.1, 0.8)}),
        ("mmdit", "midpoint", 6, {"grid": "shifted"}),
        ("dit", "heun-first", 6, {"grid": "shifted", "shift": 2.0}),
        ("dit", "euler", 40, {}),  # the fixtures predict x: the last steps are below its clip of t
        ("dit", "heun-first", 24, {"cfg_interval": (0.1, 0.8)}),
    ],
)
def test_the_torch_free_sampler_draws_what_tinydit_sample_draws(name, sampler, steps, options, exported):
    model, state = load_model(FIXTURES / f"{name}-0.2m.pt")
    onnx = OnnxSampler(str(exported[name]))
    c = model.config
    y = (
        torch.arange(8) % c.n_classes
        if c.cond == "class"
        else torch.from_numpy(onnx.encode(["a red circle on a blue background"] * 8))
    )
    ref = generate(model, y, SamplingSettings(sampler, steps, 2.5, **options), seed=3).x
    noise = torch.randn(8, c.in_channels, c.img_size, c.img_size, generator=torch.Generator().manual_seed(3))
    options = {"grid": "uniform", **options}  # the settings' default, where the sampler's is the record's
    x = onnx.sample(noise.numpy(), y.numpy(), steps=steps, cfg_scale=2.5, sampler=sampler, **options)
    diff = np.abs(to_uint8(x).astype(int) - torch_to_uint8(ref).numpy().astype(int))
    assert diff.max() <= 1  # within one uint8 level
    assert np.array_equal(to_uint8(ref.numpy()), torch_to_uint8(ref).numpy())  # the same rounding


def test_the_torch_free_ancestral_sampler_draws_what_tinydit_draws_from_the_same_noise(exported):
    model, _ = load_model(FIXTURES / "dit-0.2m.pt")
    onnx = OnnxSampler(str(exported["dit"]))
    y = torch.arange(8) % model.config.n_classes
    noise = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    field = Velocity(model, y, cfg_scale=2.5, cfg_interval=(0.1, 0.8))
    with torch.no_grad():
        ref = ancestral(field, noise, uniform_grid(6), eta=1.0, generator=torch.Generator().manual_seed(4))
    steps_noise = torch.Generator().manual_seed(4)  # the same stream, drawn in the same order
    x = onnx.sample(
        noise.numpy(),
        y.numpy(),
        steps=6,
        cfg_scale=2.5,
        sampler="ancestral",
        cfg_interval=(0.1, 0.8),
        eta=1.0,
        fresh=lambda i: torch.randn(noise.shape, generator=steps_noise).numpy(),
    )
    assert np.abs(to_uint8(x).astype(int) - torch_to_uint8(ref).numpy().astype(int)).max() <= 1
    euler = onnx.sample(noise.numpy(), y.numpy(), steps=6, cfg_scale=2.5, sampler="euler", cfg_interval=(0.1, 0.8))
    no_fresh = onnx.sample(
        noise.numpy(), y.numpy(), steps=6, cfg_scale=2.5, sampler="ancestral", cfg_interval=(0.1, 0.8), eta=0.0
    )
    assert np.abs(no_fresh - euler).max() < 1e-4  # eta 0 is Euler's step
    assert np.abs(to_uint8(x).astype(int) - to_uint8(euler).astype(int)).max() > 10  # eta 1 is not


def test_the_torch_free_sampler_undoes_the_x_prediction_clip_as_tinydit_does(exported):
    """Below t = 0.05 an x-prediction model's exported velocity is clipped; the sampler scales it back, and
    without the record of the clip (an export of an older tinydit) it would draw other images."""
    onnx = OnnxSampler(str(exported["dit"]))
    noise = np.random.default_rng(1).standard_normal((4, 3, 32, 32)).astype(np.float32)
    y = np.arange(4)
    seen = []
    x = onnx.sample(noise, y, steps=40, cfg_scale=1.0, grid="uniform", on_step=lambda *a: seen.append(a))
    assert [s[0] for s in seen] == list(range(40)) and seen[-1][1] == 0.0 and np.array_equal(seen[-1][2], x)
    i, t, x_last, x0 = seen[-1]
    assert np.abs(x_last - x0).max() < 1e-5  # the last step, from t = 1/40 to 0, lands on the predicted image
    onnx.meta["x_pred_t_min"] = None
    clipped = onnx.sample(noise, y, steps=40, cfg_scale=1.0, grid="uniform")
    assert np.abs(to_uint8(clipped).astype(int) - to_uint8(x).astype(int)).max() > 1


def test_the_exported_samplers_follow_the_recorded_grid_and_name_their_stand_in(tmp_path):
    state = load_checkpoint(FIXTURES / "dit-0.2m.pt")
    model, _ = load_model(state)
    shifted = SamplingSettings("heun", 6, 2.5, grid="shifted", shift=2.0, cfg_interval=(0.1, 0.8))
    onnx = OnnxSampler(str(export(replace(state, sampling=shifted.to_json()), "onnx", tmp_path / "m.onnx")))
    y = torch.arange(8) % model.config.n_classes
    ref = torch_to_uint8(generate(model, y, shifted, seed=3).x).numpy().astype(int)
    noise = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(3)).numpy()
    recorded = onnx.sample(noise, y.numpy(), **onnx.recorded())
    grid_recorded = onnx.sample(noise, y.numpy(), steps=6, cfg_scale=2.5, sampler="heun", cfg_interval=(0.1, 0.8))
    uniform = onnx.sample(noise, y.numpy(), **{**onnx.recorded(), "grid": "uniform", "shift": None})
    assert np.abs(to_uint8(recorded).astype(int) - ref).max() <= 1 and np.array_equal(recorded, grid_recorded)
    assert np.abs(to_uint8(uniform).astype(int) - ref).max() > 1  # the negative control: the grid matters
    dopri5 = SamplingSettings("dopri5", 8, 2.0, cfg_interval=(0.1, 0.8))
    with pytest.warns(UserWarning, match="records the dopri5 sampler, whose adaptive steps .* run heun"):
        path = export(replace(state, sampling=dopri5.to_json()), "onnx", tmp_path / "d.onnx")
    assert OnnxSampler(str(path)).recorded() == {
        "steps": 8,
        "cfg_scale": 2.0,
        "sampler": "heun",
        "cfg_interval": [0.1, 0.8],
        "grid": "uniform",
        "shift": None,
    }
    with pytest.raises(ValueError, match="for dopri5 use heun"):
        OnnxSampler(str(path)).sample(noise, y.numpy(), sampler="dopri5")


def test_the_standalone_samplers_keep_tinydits_names_and_constants():
    """ort_sampler.py and sampler.js import nothing of tinydit: their copies of its names agree with it."""
    js = (Path(__file__).parents[1] / "src" / "tinydit" / "export" / "web" / "sampler.js").read_text()
    assert set(ort_sampler.SAMPLERS) | set(STAND_IN) == set(SAMPLER_NAMES) and ort_sampler.STAND_IN == STAND_IN
    assert ort_sampler.DEFAULT_SHIFT == DEFAULT_SHIFT and f"const DEFAULT_SHIFT = {DEFAULT_SHIFT:g};" in js
    assert 'const STAND_IN = { dopri5: "heun" };' in js and STAND_IN == {"dopri5": "heun"}
    assert f"const PAGE_SAMPLERS = {json.dumps(list(ort_sampler.SAMPLERS))};" in js
    for steps, grid, shift in ((5, "uniform", None), (7, "shifted", None), (3, "shifted", 0.5)):
        want = time_grid(steps, grid, shift).numpy()
        np.testing.assert_allclose(
            ort_sampler.time_grid(steps, grid, shift), want, rtol=0, atol=1e-15
        )  # linspace's ulp


def test_the_sampler_runs_where_torch_cannot_be_imported(exported, tmp_path):
    path = exported["dit"]
    script = tmp_path / "run.py"
    source = Path(__file__).parents[1] / "src" / "tinydit" / "export" / "ort_sampler.py"
    shutil.copyfile(source, tmp_path / "ort_sampler.py")
    script.write_text(
        "import sys; sys.modules['torch'] = None; sys.modules['tinydit'] = None\n"  # either import would fail
        "import numpy as np; from ort_sampler import OnnxSampler, to_uint8\n"
        f"s = OnnxSampler({str(path)!r}); x = s.sample(np.random.default_rng(0).standard_normal((2, 3, 32, 32)), "
        "np.array([0, 1]), steps=2)\nprint(to_uint8(x).shape, s.meta['classes'])\n"
    )
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert res.returncode == 0 and "(2, 3, 32, 32) ['circle', 'square', 'triangle', 'cross']" in res.stdout, res.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--checkpoint", "OTHER", "--format", "onnx", "--out", "OUT/m.onnx"], "not a TinyDiT checkpoint"),
        (["--checkpoint", "CKPT", "--format", "tflite", "--out", "OUT/m.tflite"], "unknown --format 'tflite'"),
        (["--checkpoint", "CKPT", "--format", "onnx", "--out", "OUT/m.pt2"], "a file ending in .onnx"),
        (
            ["--checkpoint", "CKPT", "--format", "onnx", "--out", "/proc/tinydit/m.onnx"],
            "cannot write to output directory",
        ),
        (
            ["--checkpoint", "CKPT", "--format", "web", "--out", "OUT/web", "--ort-web", "OUT/none"],
            "npm install onnxruntime-web",
        ),
    ],
)
def test_bad_exports_are_one_line_and_exit_2(args, message, tmp_path, capsys):
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    subst = {"CKPT": str(FIXTURES / "dit-0.2m.pt"), "OTHER": str(tmp_path / "other.pt"), "OUT": str(tmp_path)}
    args = [subst.get(a, a.replace("OUT", str(tmp_path))) for a in args]
    assert main(["export", *args]) == 2
    err = capsys.readouterr().err
    assert err.count(": error: ") == 1 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "web").exists() and not (tmp_path / "m.onnx").exists()


def test_a_missing_exporter_names_the_extra(tmp_path, monkeypatch):
    from tinydit.errors import TinyDiTError

    monkeypatch.setitem(sys.modules, "onnxscript", None)
    with pytest.raises(TinyDiTError, match=r"pip install 'tinydit\[export\]'"):
        export(FIXTURES / "dit-0.2m.pt", "onnx", tmp_path / "m.onnx")


def _ort_web() -> Path | None:
    try:
        return find_ort_web(
            os.environ.get("TINYDIT_ORT_WEB") or Path(__file__).parents[1] / "node_modules" / "onnxruntime-web" / "dist"
        )
    except Exception:
        return None


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason=NEEDS_CHROMIUM)
@pytest.mark.skipif(
    _ort_web() is None, reason="needs onnxruntime-web from npm (npm install onnxruntime-web; .ci/run does)"
)
@pytest.mark.parametrize(
    "name, settings",
    [
        ("dit", SamplingSettings("ancestral", 5, 2.0, cfg_interval=(0.1, 0.9), eta=1.0)),
        ("mmdit", SamplingSettings("heun", 5, 2.0, cfg_interval=(0.1, 0.9))),
        ("dit", SamplingSettings("midpoint", 4, 2.0, grid="shifted", shift=2.0)),
        ("dit", SamplingSettings("heun-first", 24, 1.5)),  # x-prediction: its last steps are below the clip of t
    ],
    ids=lambda v: v if isinstance(v, str) else v.sampler,
)
def test_the_web_page_draws_what_tinydit_sample_draws(name, settings, tmp_path):
    """The page, given the initial noise (and the ancestral steps' fresh noise, drawn from torch's stream as
    tinydit draws it), draws what ``tinydit.flow.samplers.sample`` draws, within one uint8 level."""
    ckpt = FIXTURES / f"{name}-0.2m.pt"
    folder = export(ckpt, "web", tmp_path / "web", ort_web=_ort_web())
    files = {"index.html", "model.onnx", "model.json", "sampler.js", *ORT_WEB_FILES}
    assert {p.name for p in folder.iterdir()} >= files
    model, _ = load_model(ckpt)
    noise = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    prompt = "a yellow cross on a black background"
    tokenizer = OnnxSampler(str(folder / "model.onnx"))
    y = torch.tensor([2]) if model.config.cond == "class" else torch.from_numpy(tokenizer.encode([prompt]))
    with torch.no_grad():
        want = torch_to_uint8(sample(settings, model, noise, y, generator=torch.Generator().manual_seed(6)).x).numpy()
    steps_noise = torch.Generator().manual_seed(6)  # the same stream, drawn in the same order
    fresh = [torch.randn(noise.shape, generator=steps_noise) for _ in range(settings.steps - 1)]
    case = {
        "noise": noise.ravel().tolist(),
        "label": 2,
        "prompt": prompt,
        "steps": settings.steps,
        "cfg": settings.cfg_scale,
        "sampler": settings.sampler,
        "interval": list(settings.cfg_interval or (0.0, 1.0)),
        "eta": 1.0,
        "grid": settings.grid,
        "shift": settings.shift,
        "fresh": [f.ravel().tolist() for f in fresh],
    }
    (folder / "case.json").write_text(json.dumps(case))
    # The page's controls start from the recorded settings, heun standing in for dopri5's adaptive steps.
    meta_file = folder / "model.json"
    record = {"sampler": "dopri5", "steps": 7, "cfg_scale": 50.0, "cfg_interval": [0.8, 1.0], "grid": "shifted"}
    meta_file.write_text(json.dumps({**json.loads(meta_file.read_text()), "sampler": {**record, "shift": 2.5}}))

    posted, done = [], threading.Event()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **k):
            super().__init__(*a, directory=str(folder), **k)

        def do_POST(self):
            posted.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()
            done.set()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/index.html?test=case.json"
    browser = subprocess.Popen(
        chromium(tmp_path / "profile", url), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        assert done.wait(timeout=120), "the page never posted its image"
    finally:
        browser.kill()
        browser.wait(timeout=30)
        server.shutdown()
    result = posted[0]
    assert result["errors"] == []
    got = np.array(result["pixels"], dtype=int).reshape(want.shape)
    assert np.abs(got - want.astype(int)).max() <= 1  # within one uint8 level of tinydit's sampler
    defaults = {"sampler": "heun", "steps": 7, "cfg": 50, "interval": [0.8, 1.0], "eta": 1, "grid": "shifted"}
    assert result["defaults"] == {**defaults, "shift": 2.5}
