"""The package's imports point one way: read from the source with ``ast`` (every import, at module level
or inside a function), checked against the layer rules, and checked for cycles."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parent.parent / "src" / "tinydit"
# the vocabulary every layer shares
LEAVES = {
    "errors",
    "config",
    "runtime",
    "compiling",
    "machine",
    "files",
    "images",
    "tokens",
    "progress",
    "distributed",
    "version",
    "flags",
    "schema",
    "paths",
}
# The ground floor: the configuration and the runtime import only these of the package (never models, flow,
# data, train or eval, nor the other leaves). The runtime keeps its probes' answers in the machine record,
# which is written through files.
GROUND = {
    "tinydit.errors": set(),
    "tinydit.files": {"tinydit.errors"},
    "tinydit.machine": {"tinydit.errors", "tinydit.files"},
    "tinydit.compiling": {"tinydit.machine"},
    "tinydit.runtime": {"tinydit.errors", "tinydit.compiling", "tinydit.machine"},
    "tinydit.schema": {"tinydit.errors"},  # the typed reading of stored configs, which config's own uses
    "tinydit.config": {"tinydit.errors", "tinydit.runtime", "tinydit.tokens", "tinydit.schema"},
}
# What each layer may import (besides itself). The package root holds the version and get_device from the
# leaves, and tinydit.from_pretrained, which calls the api's on first use.
ALLOWED = {
    "leaf": {"leaf"},
    "models": {"leaf"},
    "data": {"leaf"},
    "flow": {"leaf", "models", "data"},  # the sampling records are keyed by data set; samplers take no files
    # the file formats: a checkpoint records its sampler settings, and builds the model its weights fit
    "checkpoints": {"leaf", "models", "data", "flow"},
    "train": {"leaf", "models", "data", "flow", "checkpoints", "eval"},  # it scores its samples, writes its report
    "eval": {"leaf", "models", "data", "flow", "checkpoints"},
    "export": {"leaf", "models", "data", "flow", "checkpoints"},  # it carries the sampler settings recorded
    "api": {"leaf", "models", "data", "flow", "checkpoints", "train", "eval", "export"},
    "cli": {"leaf", "api"},
    "main": {"cli"},
    "root": {"leaf", "api"},
}


# Old import paths kept for a release: each re-exports its new home (with a DeprecationWarning) and is
# exempt from its folder's rules, but may import nothing else.
SHIMS = {
    "tinydit.models.checkpoint": {"tinydit.checkpoints.checkpoint", "tinydit.compiling"},
    "tinydit.models.pretrained": {"tinydit.checkpoints.pretrained"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "root"
    if parts[1] in LEAVES:
        return "leaf"
    return {"__main__": "main"}.get(parts[1], parts[1])


def imports_of(source: str, modules: set[str]) -> set[str]:
    """The package modules a source file imports: ``from tinydit.a import b`` counts tinydit.a.b where
    that is a module, else tinydit.a."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tinydit":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "tinydit"}
    return found


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    modules = set(sources)
    return {m: imports_of(src, modules) - {m} for m, src in sources.items()}


def package_sources() -> dict[str, str]:
    return {module_name(p): p.read_text() for p in PACKAGE.rglob("*.py")}


def forbidden_edges(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for m, deps in graph.items():
        if m in SHIMS:
            bad += [f"{m} -> {dep} (a deprecated path only re-exports its new home)" for dep in deps - SHIMS[m]]
            continue
        for dep in deps:
            here, there = layer(m), layer(dep)
            if there != here and there != "root" and there not in ALLOWED[here]:
                bad.append(f"{m} -> {dep} ({here} may not import {there})")
            if m in GROUND and dep not in GROUND[m]:
                bad.append(f"{m} -> {dep} (the ground floor imports only {', '.join(sorted(GROUND[m])) or 'nothing'})")
    return sorted(bad)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle found by a depth-first search (each reported once, from where it was entered)."""
    found, state, stack = [], {}, []

    def visit(m: str) -> None:
        state[m], _ = "open", stack.append(m)
        for dep in sorted(graph.get(m, ())):
            if state.get(dep) == "open":
                found.append(stack[stack.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep)
        state[m], _ = "done", stack.pop()

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return found


def test_the_package_has_its_layers():
    names = {p.name for p in PACKAGE.iterdir() if not p.name.startswith("__")}
    assert {"models", "flow", "data", "checkpoints", "train", "eval", "api.py", "cli.py", "config.py"} <= names
    assert {layer(m) for m in package_sources()} <= set(ALLOWED)


def test_imports_follow_the_layer_rules():
    assert forbidden_edges(import_graph(package_sources())) == []


def test_the_imports_have_no_cycle():
    assert cycles(import_graph(package_sources())) == []


def test_nothing_but_the_entry_point_imports_the_cli():
    graph = import_graph(package_sources())
    assert sorted(m for m, deps in graph.items() if "tinydit.cli" in deps) == ["tinydit.__main__"]


@pytest.mark.parametrize(
    "module, line",
    [
        ("tinydit.models.dit", "from tinydit.flow.generate import generate"),  # models never import flow ...
        ("tinydit.models.layers", "from tinydit.data.text import Tokenizer"),  # ... or data
        ("tinydit.data.cache", "from tinydit.models.dit import DiT"),  # data never imports models
        ("tinydit.flow.samplers", "from tinydit.train.optim import adamw"),  # flow never imports train
        ("tinydit.flow.settings", "from tinydit.checkpoints.checkpoint import Checkpoint"),  # ... nor a file format
        ("tinydit.models.dit", "from tinydit.checkpoints.pretrained import CONFIG"),  # models neither
        ("tinydit.models.checkpoint", "from tinydit.flow.generate import generate"),  # a shim only re-exports
        ("tinydit.eval.metrics", "from tinydit.train import Trainer"),  # eval never imports train
        ("tinydit.config", "from tinydit.models.registry import MODEL_TYPES"),  # config is a leaf
        ("tinydit.config", "from tinydit.models.presets import MODEL_PRESETS"),  # the presets are the models'
        ("tinydit.config", "from tinydit.images import to_uint8"),  # config is on the ground floor
        ("tinydit.runtime", "from tinydit.models.linear import onednn_is_faster"),  # and so is runtime
        ("tinydit.runtime", "from tinydit.tokens import parse_phrases"),  # runtime imports errors only
        ("tinydit.train.trainer", "from tinydit.cli import main"),  # nothing imports the CLI
    ],
)
def test_a_forbidden_import_is_caught(module, line):
    """The negative control: the same check fails once a forbidden import is added, even inside a function."""
    sources = package_sources()
    sources[module] += f"\n\ndef _late():\n    {line}\n"
    assert forbidden_edges(import_graph(sources))


def test_the_torch_free_sampler_imports_neither_tinydit_nor_torch():
    tree = ast.parse((PACKAGE / "export" / "ort_sampler.py").read_text())
    roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    roots |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert roots <= {"__future__", "json", "re", "numpy", "onnxruntime"}, roots


def test_a_cycle_is_caught():
    sources = package_sources()
    sources["tinydit.files"] += "\nfrom tinydit.images import save_image\n"  # images imports files
    assert any("tinydit.files" in c for c in cycles(import_graph(sources)))
