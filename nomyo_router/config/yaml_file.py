"""Reading the config file: YAML's safe subset, and a key given twice in one mapping refused.

PyYAML keeps the last of two equal keys without a word, so a file holding `max_queue` twice
(an edit appended below an older value) runs with whichever comes last, and `--check`
passes it. The file is composed into nodes first (which keep their line numbers), every
mapping is searched for keys given twice, then the nodes are made into Python values as
`yaml.safe_load` would.
"""

from __future__ import annotations

from typing import Any

import yaml

from ..config_checks import ConfigError

_MERGE = "tag:yaml.org,2002:merge"  # `<<: *defaults`: a merge, not a key


def read(path: str) -> tuple[object, list[str]]:
    """The file's YAML value (each repeated key holding its last value, as YAML has it) and
    a problem for every key given twice; raises ConfigError for a missing file and YAML that
    does not parse."""
    try:
        with open(path, encoding="utf-8") as f:
            loader = yaml.SafeLoader(f)
            try:
                node = loader.get_single_node()
                return (None if node is None else loader.construct_document(node)), duplicates(node)
            finally:
                loader.dispose()
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found; pass --config PATH or set NOMYO_ROUTER_CONFIG") from None
    except yaml.YAMLError as e:  # (where, not the line's text: the line may hold a key)
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"{path}: not valid YAML{where}: {getattr(e, 'problem', None) or type(e).__name__}") from None


def duplicates(root: yaml.Node | None) -> list[str]:
    """`cache.ttl: given twice (lines 4 and 9); keep one` for each key repeated in a mapping
    of the document, its path as the config's messages name keys."""
    out: list[tuple[int, str]] = []  # (the second line, the problem)
    seen: set[int] = set()  # (an alias repeats a node, and may point back at its own parent)
    stack: list[tuple[yaml.Node, str]] = [(root, "")] if root is not None else []
    while stack:
        node, path = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict[tuple[str, Any], int] = {}
            for key, value in node.value:
                if key.tag == _MERGE:
                    continue
                name = key.value if isinstance(key, yaml.ScalarNode) else None
                line = key.start_mark.line + 1
                where = f"{path}.{name}" if path else str(name)
                if name is not None:
                    if (key.tag, name) in first:
                        out.append((line, f"{where}: given twice (lines {first[key.tag, name]} and {line}); keep one"))
                    else:
                        first[key.tag, name] = line
                stack.append((value, where))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, f"{path}[{i}]") for i, item in enumerate(node.value))
    return [problem for _, problem in sorted(out)]
