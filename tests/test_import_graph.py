"""The package's import graph: no cycles, and every import points down the layers of
docs/architecture.md section 1 (kernels/ knows nothing of models/, the engine or anything above).

The graph is read from the sources (the AST of every module under src/sparsellm, imports inside
functions included: a lazy import is still a dependency), so nothing is imported to check it.
Imports under `if TYPE_CHECKING:` never run: they count for the layers, not for cycles.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

# The source tree (not the installed copy: an editable install's package folder holds only the
# compiled extension).
PACKAGE = Path(__file__).resolve().parents[1] / "src" / "sparsellm"
EXTENSION = "sparsellm._native"  # compiled from csrc/; imports nothing from the package

# docs/architecture.md section 1, bottom to top: top-level module or package -> layer. A module
# may import from its own layer and the layers below it; layers on one level (kernels, models)
# do not import each other. "" is the package's own __init__ (it re-exports the API).
LAYERS: list[dict[str, list[str]]] = [
    {"ground": ["tokenizer", "datasets", "atomic", "dtypes", "progress", "functional",
                "cache_dir", "weight_format", "_native"]},
    {"kernels": ["kernels"], "models": ["models"]},
    {"compression": ["compression"]},
    {"engine": ["engine"]},
    {"generation": ["generation"]},
    {"applications": ["pipeline", "benchmark", "speculation_benchmark", "export", "evaluation"]},
    {"entry points": ["cli", "commands", "server", "cluster", ""]},
]


@dataclass(frozen=True)
class Import:
    source: str  # importing module, dotted
    target: str  # imported module (a submodule if `from package import submodule`)
    line: int
    type_checking: bool  # inside `if TYPE_CHECKING:`


def module_name(root: Path, path: Path) -> str:
    parts = (root.name, *path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST, type_checking: bool = False
                  ) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, type_checking
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                yield from _import_nodes(ast.Module(body=[child], type_ignores=[]), True)
            for child in node.orelse:
                yield from _import_nodes(ast.Module(body=[child], type_ignores=[]),
                                         type_checking)
        else:
            yield from _import_nodes(node, type_checking)


def import_graph(root: Path) -> tuple[set[str], list[Import]]:
    """(every module of the package at `root`, every import of one package module by another)."""
    paths = {module_name(root, p): p for p in sorted(root.rglob("*.py"))}
    modules = set(paths) | ({EXTENSION} if root.name == "sparsellm" else set())
    imports = []
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node, type_checking in _import_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    origin = ".".join(base + ([node.module] if node.module else []))
                else:
                    origin = node.module or ""
                targets = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in modules else origin
                           for a in node.names]
            imports += [Import(name, t, node.lineno, type_checking) for t in dict.fromkeys(targets)
                        if t.split(".")[0] == root.name]
    return modules, imports


def cycles(modules: set[str], imports: list[Import]) -> list[list[str]]:
    """Strongly connected components of more than one module (or a module importing itself),
    over the imports that run."""
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for i in imports:
        if not i.type_checking:
            edges.setdefault(i.source, set()).add(i.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:  # Tarjan; the package is small enough for recursion
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges.get(v, ()):
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def layer_of(module: str) -> tuple[int, str]:
    """(level, layer name) of a dotted module name, from LAYERS."""
    top = module.split(".")[1] if "." in module else ""
    for level, layers in enumerate(LAYERS):
        for layer, tops in layers.items():
            if top in tops:
                return level, layer
    raise LookupError(f"{module}: its top-level name {top!r} has no layer in LAYERS "
                      "(tests/test_import_graph.py; docs/architecture.md section 1)")


def upward_imports(imports: list[Import]) -> list[str]:
    """Imports of a higher layer, or of the other layer on the same level."""
    bad = []
    for i in imports:
        (src_level, src), (dst_level, dst) = layer_of(i.source), layer_of(i.target)
        if dst_level > src_level or (dst_level == src_level and dst != src):
            bad.append(f"{i.source} (line {i.line}, {src}) imports {i.target} ({dst})")
    return bad


@pytest.fixture(scope="module")
def graph() -> tuple[set[str], list[Import]]:
    modules, imports = import_graph(PACKAGE)
    # the walker sees the package: e.g. the engine's native model on the kernels
    assert {"sparsellm.kernels.ops", "sparsellm.engine.native_model",
            "sparsellm.models.checkpoint"} <= modules
    assert ("sparsellm.engine.native_model", "sparsellm.kernels.formats") in {
        (i.source, i.target) for i in imports}
    return modules, imports


def test_no_import_cycle(graph):
    modules, imports = graph
    assert cycles(modules, imports) == []


def test_no_circle_below_the_engine_even_for_type_checkers(graph):
    """The formats' floors (the ground's vocabulary, kernels/, models/) are one-way even in what
    only type checkers read: kernels/layouts.py declares `FormatSpec` and the decoders' `Packed`,
    kernels/formats.py builds the names on them (issue 54: the formats/layouts circle)."""
    modules, imports = graph
    low = {m for m in modules if layer_of(m)[0] <= 1}
    every = [Import(i.source, i.target, i.line, False) for i in imports
             if i.source in low and i.target in low]
    assert cycles(low, every) == []


def test_every_module_has_a_layer(graph):
    modules, _ = graph
    # layer_of raises for a new top-level module nobody placed; every layer has modules
    assert {layer_of(m)[1] for m in modules} == {name for level in LAYERS for name in level}


def test_imports_point_down_the_layers(graph):
    _, imports = graph
    assert upward_imports(imports) == []


def test_kernels_import_nothing_above_them(graph):
    _, imports = graph
    above = ("models", "engine", "generation", "server", "compression", "pipeline", "commands",
             "evaluation", "benchmark", "export", "cli")
    kernel_imports = [i for i in imports if i.source.startswith("sparsellm.kernels")]
    assert kernel_imports  # the kernels import their own modules and the ground
    # (the package's __init__, "sparsellm", imports every layer)
    assert [f"{i.source} imports {i.target}" for i in kernel_imports
            if i.target == "sparsellm" or i.target.split(".")[1] in above] == []


def test_cluster_and_server_do_not_import_the_commands(graph):
    """The Ray app and the server share `sparsellm serve`'s options through
    `server/options.py`; commands/ is the CLI's, imported by nothing but cli.py."""
    _, imports = graph
    assert [f"{i.source} imports {i.target}" for i in imports
            if i.target.startswith("sparsellm.commands")
            and not i.source.startswith(("sparsellm.commands", "sparsellm.cli"))] == []


def test_the_checks_catch_a_cycle_and_an_upward_import(tmp_path):
    """A fake sparsellm tree with the faults this file guards against: found, with the lines."""
    root = tmp_path / "sparsellm"
    for folder in ("kernels", "models", "engine"):
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "models" / "checkpoint.py").write_text("def load():\n    from .gguf import read\n")
    (root / "models" / "gguf.py").write_text("from .checkpoint import load\n\ndef read(): ...\n")
    (root / "kernels" / "ops.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..engine import x\n"
        "import sparsellm.models.checkpoint\n")
    (root / "engine" / "run.py").write_text("from ..kernels import ops\nfrom . import run\n")
    modules, imports = import_graph(root)
    assert cycles(modules, imports) == [["sparsellm.models.checkpoint", "sparsellm.models.gguf"],
                                        ["sparsellm.engine.run"]]
    assert upward_imports(imports) == [
        "sparsellm.kernels.ops (line 3, kernels) imports sparsellm.engine (engine)",
        "sparsellm.kernels.ops (line 4, kernels) imports sparsellm.models.checkpoint (models)",
    ]
    # an import that only type checkers run is no cycle
    (root / "engine" / "run.py").write_text(
        "import typing\nif typing.TYPE_CHECKING:\n    from . import run\n")
    assert cycles(*import_graph(root)) == [["sparsellm.models.checkpoint",
                                            "sparsellm.models.gguf"]]
