"""The package imports in one direction: no module of nemo_azr imports itself back through others
(imports inside functions count too: a lazy import is still a dependency)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "nemo_azr"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The nemo_azr modules ``path`` imports (``from a.b import c`` is ``a.b.c`` when that is a
    module, else ``a.b``)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: _imports(path, set(files)) for name, path in files.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_finder_sees_a_cycle_when_there_is_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_is_the_package():
    graph = _graph()
    assert len(graph) > 100
    assert "nemo_azr.config.schema" in graph["nemo_azr.preflight"]


def test_no_import_cycles():
    assert _cycles(_graph()) == []


# The layers of docs/architecture.md, lowest first. A package may import its own modules and any package
# of a lower layer, never one of its own layer or above (so the package graph is a DAG by construction).
LAYERS: list[set[str]] = [
    {"errors", "utils"},
    {"registry"},
    {"config"},
    {"contracts"},
    {"algorithms", "distributed", "envs"},
    {"kernels"},
    {"models"},
    {"rollout"},
    {"rewards"},
    {"tasks"},
    {"rlcr", "selfplay"},
    {"trainer"},
    {"evaluation"},
    {"plugins", "user_plugins"},
    {"preflight"},
    {"cli"},
    {"__main__"},
]


def _package(module: str) -> str:
    return module.split(".")[1] if module.count(".") else module


def _layer_of() -> dict[str, int]:
    return {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}


def _upward_imports(graph: dict[str, set[str]]) -> list[str]:
    layer = _layer_of()
    bad = []
    for module, targets in graph.items():
        src = _package(module)
        for target in targets:
            dst = _package(target)
            if src != dst and layer[src] <= layer[dst]:
                bad.append(f"{module} -> {target}")
    return sorted(bad)


def test_every_package_has_a_layer():
    packages = {_package(m) for m in _graph() if m != "nemo_azr"}
    assert packages == set(_layer_of()), (
        "a package was added or removed: place it in LAYERS and docs/architecture.md"
    )


def test_the_layer_check_sees_an_upward_import():
    graph = {"nemo_azr.config.schema": {"nemo_azr.trainer.trainer"}, "nemo_azr.trainer.trainer": set()}
    assert _upward_imports(graph) == ["nemo_azr.config.schema -> nemo_azr.trainer.trainer"]
    sideways = {"nemo_azr.rlcr.a": {"nemo_azr.selfplay.b"}, "nemo_azr.selfplay.b": set()}
    assert _upward_imports(sideways) == ["nemo_azr.rlcr.a -> nemo_azr.selfplay.b"]


def test_packages_import_only_lower_layers():
    assert _upward_imports(_graph()) == []


def test_the_documented_layers_are_the_tested_ones():
    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    rows = [line for line in doc.splitlines() if line.startswith("| ") and line[2:3].isdigit()]
    documented = [{name.strip(" `") for name in row.split("|")[2].split(",")} for row in rows]
    assert documented == LAYERS
