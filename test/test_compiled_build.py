"""The compiled build (setup.py's HOT_PATH, compiled by mypyc with `make compiled`) runs the
same source as the pure-Python one. Compiling takes a minute, too long for every test run,
so what is checked here is what makes a module compile to something that behaves otherwise:
the rules below are the ones the compiled build broke on."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOT_PATH = re.findall(r'"(nomyo_router/[\w/]+\.py)"', (ROOT / "setup.py").read_text())


def test_the_hot_path_list_names_modules_that_exist():
    assert len(HOT_PATH) >= 15
    missing = [p for p in HOT_PATH if not (ROOT / p).is_file()]
    assert not missing, missing


def mixed_except_names(path: Path) -> list[str]:
    """`except A as e` and `except B as e` in one function: a compiled function gives a local
    one type, so the second is a TypeError when B is caught."""
    found = []
    for fn in ast.walk(ast.parse(path.read_text())):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        types: dict[str, set[str]] = {}
        for node in ast.walk(fn):
            if isinstance(node, ast.ExceptHandler) and node.name:
                types.setdefault(node.name, set()).add(ast.unparse(node.type) if node.type else "")
        found += [f"{path.name}:{fn.lineno} {fn.name}: {n} {sorted(t)}" for n, t in types.items() if len(t) > 1]
    return found


def test_one_exception_type_per_except_name_in_a_function():
    found = [f for rel in HOT_PATH for f in mixed_except_names(ROOT / rel)]
    assert not found, found


def test_the_check_catches_what_it_should(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "def f():\n    try:\n        pass\n    except KeyError as e:\n        pass\n"
        "    try:\n        pass\n    except OSError as e:\n        pass\n"
    )
    assert mixed_except_names(bad) == ["bad.py:1 f: e ['KeyError', 'OSError']"]


def modules_imported_in_functions(path: Path, text: str | None = None) -> list[str]:
    """`from package import module` inside a function: the compiled function's local is None
    (names imported from the module work: `from package.module import name`). `text`: the
    source, when it is not the file's."""
    found = []
    package = path.parent
    for fn in ast.walk(ast.parse(path.read_text() if text is None else text)):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = package
            for _ in range(node.level - 1):
                base = base.parent
            if node.level == 0:
                base = ROOT
            for part in (node.module or "").split(".") if node.module else []:
                base = base / part
            for alias in node.names:
                if (base / f"{alias.name}.py").is_file() or (base / alias.name / "__init__.py").is_file():
                    found.append(
                        f"{path.name}:{node.lineno} from {'.' * node.level}{node.module or ''} import {alias.name}"
                    )
    return found


def test_functions_import_names_not_modules():
    found = [f for rel in HOT_PATH for f in modules_imported_in_functions(ROOT / rel)]
    assert not found, found


def test_the_import_check_catches_what_it_should():
    text = "def f():\n    from ..backends import translate\n    from ..backends.translate import OPENAI_PATH\n"
    found = modules_imported_in_functions(ROOT / "nomyo_router" / "forward" / "proxy.py", text)
    assert found == ["proxy.py:2 from ..backends import translate"]


def header_lookups_not_lower_case(path: Path, text: str | None = None) -> list[str]:
    """`x.headers.get("Content-Type")`: compiled, `Headers.get` is `dict.get`, which is not
    case-insensitive (the upstream client stores names lower-cased)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text() if text is None else text)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and isinstance(node.func.value, ast.Attribute)
            and node.func.value.attr == "headers"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and node.args[0].value != node.args[0].value.lower()
        ):
            found.append(f"{path.name}:{node.lineno} headers.get({node.args[0].value!r})")
    return found


def test_header_names_are_asked_lower_case():
    found = [f for rel in HOT_PATH for f in header_lookups_not_lower_case(ROOT / rel)]
    assert not found, found
    text = 'def f(resp):\n    return resp.headers.get("Content-Length"), resp.headers.get("content-type")\n'
    assert header_lookups_not_lower_case(Path("probe.py"), text) == ["probe.py:2 headers.get('Content-Length')"]
