"""The package's architecture as a test: every import of every module of mutor2d (function-level ones
too) goes to the same or a lower layer, no module-level imports make a circle, a package's torch-free
``config`` imports nothing that imports it back (its implementation imports it; the registry names the
builders as "module:function" strings, each checked here like an import), and the engine imports no
run kind.

Layers, lowest first (a top-level module or package of mutor2d each):"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import mutor2d

PACKAGE = Path(__file__).resolve().parent.parent / "mutor2d"
LAYERS = [
    {"checks", "cli", "io", "plugins", "preempt", "provenance"},  # what every part shares
    {"config", "config_files", "registry", "run_configs"},  # the registries, config files and building
    {"checkpoint"},                                # files: written atomically, read without running code
    {"model", "tokenizer"},                        # the networks: the GPT (attention, conditioning), VQ
    {"objectives", "data"},                        # the method (register rules, layout, losses, its picture); training data
    {"sampling"},                                  # decoding, and images / npz files out of a model
    {"engine"},                                    # the one training loop
    {"evaluation"},                                # metrics, records, studies (they train and sample)
    {"image", "lm", "vq"},                         # the run kinds, peers
    {"demo", "hub"},                               # optional integrations
]
RUN_KINDS = LAYERS[-2]


def unit_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "mutor2d"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def module_level(tree: ast.AST):
    """The nodes that run when the module is imported: not inside a function, nor ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        yield node
        yield from module_level(node)


def imports(path: Path, lazy: bool = True) -> set[str]:
    """Every mutor2d module ``path`` imports, anywhere in the file (``lazy``) or at module level
    (``from X import name`` imports the module X.name when there is one, else X)."""
    name = module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree) if lazy else module_level(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("mutor2d")}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            if target.startswith("mutor2d"):
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    found.add(sub if is_module(sub) else target)
    return found


def import_graph(lazy: bool) -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {m: {d for d in imports(p, lazy) if d in modules and d != m} for m, p in modules.items()}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(lazy=True)


def test_every_unit_has_a_layer(graph):
    layered = set().union(*LAYERS) | {"mutor2d"}
    assert {unit_of(m) for m in graph} <= layered, "a new top-level module or package needs a row in LAYERS"


def test_no_import_goes_to_a_higher_layer(graph):
    rank = {u: i for i, layer in enumerate(LAYERS) for u in layer}
    up = sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps
                if unit_of(m) != "mutor2d" and rank[unit_of(d)] > rank[unit_of(m)])
    assert up == []


def test_run_kinds_are_peers_and_the_engine_imports_none(graph):
    across = sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps
                    if unit_of(m) != unit_of(d) and unit_of(d) in RUN_KINDS and unit_of(m) not in LAYERS[-1])
    assert across == []


@pytest.mark.parametrize("lazy", [False, True], ids=["module-level", "function-level-too"])
def test_no_import_circle(lazy):
    """Tarjan's strongly connected components over the import graph (module-level imports; then with
    function-level ones too, as farm-studio counts circles): each must be one module."""
    graph = import_graph(lazy=lazy)
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):
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
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert circles == []


def test_the_walker_sees_a_function_level_import(tmp_path):
    """The rule is checked on lazy imports too: a function-level import is an edge."""
    path = PACKAGE / "engine" / "entry.py"
    assert "mutor2d.preempt" in imports(path, lazy=False)    # module level
    assert "mutor2d.checkpoint" in imports(path)             # inside exit_code()
    assert "mutor2d.checkpoint" not in imports(path, lazy=False)


def reach(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for d in graph[todo.pop()] - seen:
            seen.add(d)
            todo.append(d)
    return seen


def test_a_config_imports_nothing_that_imports_it_back(graph):
    """A package's ``config`` module, function-level imports included: whatever it imports never leads
    back to it (its implementation imports it, not the other way)."""
    configs = sorted(m for m in graph if m.endswith(".config") and m.count(".") == 2)
    assert len(configs) >= 8
    back = sorted(f"{c} -> {d}" for c in configs for d in graph[c] if c in reach(graph, d))
    assert back == []


def defines(module: str, name: str) -> bool:
    """Whether mutor2d module ``module`` defines ``name`` at its top level (a function or a class)."""
    tree = ast.parse((PACKAGE.parent / module.replace(".", "/")).with_suffix(".py").read_text())
    return any(isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name for n in tree.body)


def test_builders_are_named_in_their_section_s_package_or_above_and_no_config_imports_them(graph):
    """Each registered "module:function" builder: defined in an existing module of the package that
    holds its section's config (SECTION_HOMES; a run config's parts, "task.TASK": its kind's package), or
    of a higher layer, and imported by no config module;
    the registry imports only config modules by name (SECTION_HOMES)."""
    from mutor2d import config
    from mutor2d.registry import REGISTRY
    config.import_parts()
    import mutor2d.lm.config  # noqa: F401  (the language-model kind's own builders)
    rank = {u: i for i, layer in enumerate(LAYERS) for u in layer}
    configs = {m for m in graph if m.endswith(".config")}
    assert {f"mutor2d.{home}.config" for home in config.SECTION_HOMES.values()} <= configs
    builders = {name: e.build for name, e in REGISTRY.items() if e.build is not None}
    assert len(builders) >= 10
    for name, target in builders.items():
        module, function = target.split(":")
        if name.startswith("task."):                     # a run config's parts: in its kind's package
            home = f"mutor2d.{name.split('.', 1)[1]}"
        else:
            section = max((s for s in config.SECTION_HOMES if name == s or name.startswith(f"{s}.")), key=len)
            home = f"mutor2d.{config.SECTION_HOMES[section]}"
        assert module in graph and defines(module, function), target
        assert rank[unit_of(module)] >= rank[unit_of(home)], f"{name}: {target} is below {home}"
        assert not [c for c in configs if module in graph[c]], f"a config imports {module}"


def test_modules_are_read_in_one_sitting():
    """No module of mutor2d/ over 400 lines; the config system's core (mutor2d/config.py) at most 300."""
    package = Path(mutor2d.__file__).parent
    sizes = {p.relative_to(package.parent).as_posix(): len(p.read_text().splitlines()) for p in package.rglob("*.py")}
    assert {m: n for m, n in sizes.items() if n > 400} == {} and sizes["mutor2d/config.py"] <= 300
