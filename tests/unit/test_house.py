"""The house keeps its shape: no import circle, no import from a lower layer up to a higher
one, and no source file too long to read (docs/architecture.md draws it).

Every import statement counts, those inside functions and under TYPE_CHECKING included:
a lazy import is still a dependency, only a later one.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("calque", "functions", "host_agent", "infra")
MAX_LINES = 600

# Lowest first: a module may import its own layer and the layers below it, nothing above.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "foundation",
        (
            "calque.errors",
            "calque.identity",
            "calque.events",
            "calque.resources",
            "calque.aws",
            "calque.settings",
            "calque.catalog",
            "calque.contracts",
            "calque.dynamo",
        ),
    ),
    ("fleet", ("calque.fleet",)),
    ("members", ("calque.members",)),
    ("pools", ("calque.pools",)),
    ("tenancy", ("calque.tenancy",)),
    ("accounting", ("calque.accounting",)),
    ("simulate", ("calque.simulate",)),
    # Each room's wiring.py is its composition root: it plugs the room's domain into its
    # adapters and into the rooms it needs (the pools into the fleet, the fleet into tenancy's
    # hosts), so it sits above every room, below what calls it.
    ("wiring", ()),
    ("local plane", ("calque.local",)),
    ("sdk and cli", ("calque.cli", "calque.console", "calque.sdk", "calque.__main__", "calque")),
    ("entry points", ("functions", "infra")),
)
# The host agent runs on the instance with the foundation only.
HOST_AGENT_MAY_IMPORT = ("host_agent", *LAYERS[0][1])


@cache
def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _owner(name: str, candidates: tuple[str, ...]) -> str | None:
    """The longest of ``candidates`` that ``name`` is or lies under."""
    best = None
    for c in candidates:
        if (name == c or name.startswith(c + ".")) and (best is None or len(c) > len(best)):
            best = c
    return best


def layer_of(module: str) -> int:
    if module.startswith("calque.") and module.rsplit(".", 1)[-1] == "wiring":
        return next(i for i, (name, _) in enumerate(LAYERS) if name == "wiring")
    prefixes = tuple(p for _, ps in LAYERS for p in ps)
    owner = _owner(module, prefixes)
    assert owner is not None, f"{module} belongs to no layer of tests/unit/test_house.py: add it"
    return next(i for i, (_, ps) in enumerate(LAYERS) if owner in ps)


@cache
def imports() -> dict[str, frozenset[str]]:
    """module -> the project's modules it imports."""
    mods = modules()
    graph = {}
    for name, path in mods.items():
        is_package = path.name == "__init__.py"
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name in mods)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    target = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    target = node.module or ""
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    if sub in mods:
                        found.add(sub)
                    elif target in mods:
                        found.add(target)
        found.discard(name)
        graph[name] = frozenset(found)
    return graph


def _circles(graph: dict[str, frozenset[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
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
                    out.append(sorted(component))
    return out


def test_circles_are_found_where_they_are() -> None:
    # Given a graph with one circle of three and a tail, Then exactly that circle is found
    graph = {
        "a": frozenset({"b"}),
        "b": frozenset({"c"}),
        "c": frozenset({"a", "d"}),
        "d": frozenset(),
        "e": frozenset({"d"}),
    }
    assert _circles(graph) == [["a", "b", "c"]]
    assert _circles({"a": frozenset({"b"}), "b": frozenset()}) == []


def test_the_house_has_no_import_circle() -> None:
    circles = _circles(dict(imports()))
    assert not circles, (
        "import circles (what two modules share moves down into one both import):\n"
        + "\n".join(" <-> ".join(c) for c in circles)
    )


def test_no_module_imports_a_higher_layer() -> None:
    upward = []
    for module, deps in sorted(imports().items()):
        if module.startswith("host_agent"):
            upward += [
                f"{module} -> {d} (the host agent imports only the foundation)"
                for d in sorted(deps)
                if _owner(d, HOST_AGENT_MAY_IMPORT) is None
            ]
            continue
        mine = layer_of(module)
        for dep in sorted(deps):
            if dep.startswith("host_agent"):
                continue  # the agent is shipped, read and tested from above; it depends on nothing here
            theirs = layer_of(dep)
            if theirs > mine:
                upward.append(f"{module} ({LAYERS[mine][0]}) -> {dep} ({LAYERS[theirs][0]})")
    assert not upward, "imports from a lower layer up to a higher one:\n" + "\n".join(upward)


def test_no_source_file_is_too_long_to_read() -> None:
    long_files = sorted(
        (n, str(p.relative_to(REPO)))
        for p in modules().values()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    )
    assert not long_files, f"files over {MAX_LINES} lines (split them by what the parts do): {long_files}"
