"""The package's layout targets: no import cycle between its modules, every module under 800
lines, and every module named in the developer guide's layout (``docs/guide/architecture.rst``).

Imports are read from the source (``ast``), not executed: an edge ``a -> b`` is any import of
``b`` anywhere in ``a``, a deferred import inside a function included (a cycle hidden in a
function is still a cycle). ``from pkg import name`` is an edge to ``pkg.name`` when that is a
module, else to ``pkg``; the implicit import of a module's parent package is not an edge.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "sklearn_fedmf"
MAX_LINES = 800


def _modules():
    """``{dotted name: (path, is_package)}`` of every module of the package."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


MODULES = _modules()


def imported_modules(name, modules=MODULES):
    """The package's modules that module ``name`` imports (see the module docstring)."""
    path, is_package = modules[name]
    package = name if is_package else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in modules else target)
    return {m for m in found if m in modules and m != name}


def import_cycles(graph):
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, cycles = {}, {}, set(), [], []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_the_cycle_finder_finds_a_cycle_and_only_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_reader_resolves_relative_imports():
    edges = imported_modules("sklearn_fedmf.completion._fedmavg._fedmavg")
    assert {"sklearn_fedmf.engine._federation", "sklearn_fedmf.completion._base"} <= edges


def test_no_import_cycle():
    graph = {name: imported_modules(name) for name in MODULES}
    assert import_cycles(graph) == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_is_under_800_lines(name):
    n_lines = len(MODULES[name][0].read_text(encoding="utf-8").splitlines())
    assert n_lines < MAX_LINES, f"{name} has {n_lines} lines: split it by role"


def test_the_developer_guide_names_every_module():
    layout = (ROOT / "docs" / "guide" / "architecture.rst").read_text(encoding="utf-8")
    missing = [str(path.relative_to(PACKAGE)) for path, _ in MODULES.values()
               if path.name != "__init__.py" and path.name not in layout]
    assert not missing, f"add to the layout of docs/guide/architecture.rst: {missing}"


# The composition targets: what keeps the seams seams (secure imports: tests/test_exchange.py).
SHARED_NAMES = {"__init__.py", "__main__.py", "_base.py"}
MAX_PARAMETERS = 20


def test_no_two_modules_share_a_file_name():
    seen = {}
    for path, _ in MODULES.values():
        if path.name not in SHARED_NAMES:
            seen.setdefault(path.name, []).append(str(path.relative_to(PACKAGE)))
    assert {n: p for n, p in seen.items() if len(p) > 1} == {}


def _functions():
    for name, (path, _) in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield name, node


def test_no_function_takes_more_than_twenty_parameters():
    """An estimator's ``__init__`` aside (its parameters are its public surface)."""
    long = []
    for name, node in _functions():
        a = node.args
        n = (len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg)
             + bool(a.kwarg))
        if n > MAX_PARAMETERS and node.name != "__init__":
            long.append(f"{name}.{node.name} ({n})")
    assert long == []


def test_no_method_reads_a_per_loss_flag():
    """Each algorithm declares its protocol per loss; no ``self._implicit`` branches."""
    reads = [name for name, (path, _) in MODULES.items()
             for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
             if isinstance(node, ast.Attribute) and node.attr == "_implicit"
             and isinstance(node.value, ast.Name) and node.value.id == "self"]
    assert reads == []
