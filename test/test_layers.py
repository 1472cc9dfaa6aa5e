"""The house's rules, checked from the code's own imports.

Packages of `nomyo_router` depend one way, from the entry points down to the domain types
(type-only imports included): a package may import only what stands on a lower layer. And
no module of `nomyo_router`, `mock`, `loadtest` or `bench` imports itself back through others
at run time (imports under `if TYPE_CHECKING:` are left out of that second rule: they run
never). A new import that breaks either rule fails here, naming the files.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Top to bottom. Entry points and wiring (runtime); the request's path (forward) and what operators
# read (ops, fed by events), the response cache and batches; the relay (how an answer travels to
# the client); the HTTP shapes of the APIs; what the router knows of backends; routing policies
# and the scheduler; the HTTP client to backends; shared state; the server's HTTP plumbing; the
# domain types everything uses.
LAYERS: list[set[str]] = [
    {"__main__", "cli", "app", "generation", "config_doc", "runtime"},
    {"forward", "ops", "cache", "batch"},
    {"relay"},
    {"api"},
    {"backends"},
    {"routing"},
    {"h1"},
    {"state"},
    {"server"},
    {"config", "config_checks", "domain", "events", "task_stop", "__init__"},
]
LAYER_OF = {name: i for i, names in enumerate(LAYERS) for name in names}


def _modules(tree: str) -> dict[str, Path]:
    out = {}
    for path in (ROOT / tree).rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(module: str, path: Path, runtime_only: bool) -> set[str]:
    """Modules `module` imports (absolute names; names imported from a package count as
    that package's modules when they are)."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    if runtime_only:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skip.update(id(n) for n in ast.walk(node))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)
    return found


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_nomyo_router_packages_depend_one_way():
    """Down the layers or within one, never up; and no loop between packages, even one made
    of imports for type checking only."""
    mods = _modules("nomyo_router")
    wrong, graph = [], {}
    for mod, path in mods.items():
        here = _top(mod)
        assert here in LAYER_OF, f"{here} (of {mod}) has no layer in test_layers.LAYERS: place it"
        for target in _imports(mod, path, runtime_only=False):
            if target not in mods:
                continue
            there = _top(target)
            if there == here:
                continue
            graph.setdefault(here, set()).add(there)
            if LAYER_OF[there] < LAYER_OF[here]:
                wrong.append(f"{path.relative_to(ROOT)} imports {target} ({here} may not depend on {there})")
    assert not wrong, "\n".join(sorted(set(wrong)))
    found = _cycle(graph)
    assert found is None, "packages import each other: " + " -> ".join(found or [])


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_module_imports_itself_back_at_run_time():
    for tree in ("nomyo_router", "mock", "loadtest", "bench"):
        mods = _modules(tree)
        if tree == "bench":  # scripts importing each other by their plain names
            mods = {name.removeprefix("bench."): path for name, path in mods.items()}
        graph = {
            m: {
                t
                for t in _imports(m, p, runtime_only=True)
                if t in mods and t != m and not (p.name == "__init__.py" and t.startswith(m + "."))
            }
            for m, p in mods.items()
        }
        found = _cycle(graph)
        assert found is None, f"{tree}: import cycle " + " -> ".join(found or [])


ARCHITECTURE = ROOT / "docs" / "architecture.md"
LAYERS_MARK = "<!-- layers: kept equal to LAYERS in test/test_layers.py -->"


def _page_layers(page: str) -> list[set[str]]:
    """The layer list docs/architecture.md shows: the indented block after the mark, a layer a
    line, its names before the first run of two spaces."""
    assert LAYERS_MARK in page, f"docs/architecture.md lost its layer list's mark {LAYERS_MARK!r}"
    lines = page.split(LAYERS_MARK, 1)[1].lstrip("\n").splitlines()
    block = []
    for line in lines:
        if not line.startswith("    "):
            break
        names = line.strip().split("  ", 1)[0]
        block.append({n.strip() for n in names.split(",")})
    return block


def test_architecture_page_shows_these_layers_and_every_package():
    """The page a newcomer reads first says what the code does: its layer list is this file's
    LAYERS, and its table of packages names every package and top-level module of
    nomyo_router (and none that is gone)."""
    page = ARCHITECTURE.read_text()
    wanted = [names - {"__init__"} for names in LAYERS]
    shown = _page_layers(page)
    assert shown == wanted, f"docs/architecture.md's layers {shown} differ from test_layers.LAYERS {wanted}"
    package = ROOT / "nomyo_router"
    present = {
        f"nomyo_router/{p.name}/" if p.is_dir() else f"nomyo_router/{p.name}"
        for p in package.iterdir()
        if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name != "__init__.py")
    }
    rows = {line.split("`", 2)[1] for line in page.splitlines() if line.startswith("| `nomyo_router/")}
    assert not present - rows, f"docs/architecture.md's table of packages lacks {sorted(present - rows)}"
    assert not rows - present, f"docs/architecture.md's table of packages names what is gone: {sorted(rows - present)}"
