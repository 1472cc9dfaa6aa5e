"""docs/configuration.md is generated from the keys' declaration and must not go stale."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import msgspec

from nomyo_router.config import INPUT_ONLY, ClientKey, EndpointConfig, RouterConfig
from nomyo_router.config_checks import accepted_keys, specs
from nomyo_router.config_doc import COMMAND, render

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "configuration.md"


def test_the_committed_reference_is_current():
    assert DOC.read_text(encoding="utf-8") == render(), (
        f"docs/configuration.md is stale: the config declaration changed. Regenerate it: `{COMMAND}`"
    )


def test_every_key_of_the_file_is_documented_and_nothing_else():
    text = render()
    rows = {line.split("|")[1].strip().strip("`") for line in text.splitlines() if line.startswith("| `")}
    keys = (
        set(accepted_keys(RouterConfig))
        | set(INPUT_ONLY)
        | set(accepted_keys(EndpointConfig))
        | set(accepted_keys(ClientKey))
    )
    for spec in specs(RouterConfig).values():  # the keys of a mapping such as cache: {...}
        if isinstance(spec.type, type) and issubclass(spec.type, msgspec.Struct):
            keys |= set(accepted_keys(spec.type))
    assert rows == keys
    assert "basic_auth" not in text  # derived from the url, not a key of the file
    for line in text.splitlines():
        if line.startswith("| `"):
            key, typ, default, meaning = [c.strip() for c in line.split("|")[1:5]]
            assert typ and default and meaning, line


def test_the_module_writes_the_reference():
    p = subprocess.run(
        [sys.executable, "-m", "nomyo_router.config_doc"], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert p.returncode == 0 and p.stdout == render()
