"""The front door: a README that stays short and points at the docs, prose without issue
numbers or commit hashes (the git history has those), example configs that the router
accepts, a documentation site whose pages exist, and a CLI reference that matches the
programs' --help."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PROSE = [README, ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]

ISSUE = re.compile(r"(?<![\w&])#\d+\b|\bissues? \d+", re.IGNORECASE)
# a commit hash: 7 to 40 hex digits standing alone, with both digits and letters in it
HEX = re.compile(r"(?<![\w:/.-])[0-9a-f]{7,40}(?![\w-])")


def looks_like_a_hash(word: str) -> bool:
    return bool(re.search(r"\d", word)) and bool(re.search(r"[a-f]", word))


def test_readme_is_short_and_opens_with_what_and_for_whom():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move detail into docs/"
    assert lines[0].startswith("# ")
    first = " ".join(lines[1:6])
    assert "for " in first and ("Ollama" in first or "LLM" in first), first
    head = "\n".join(lines[:15])
    assert "make demo" in head and "make test" in head  # the two commands, near the top


def test_readme_has_the_picture_the_quick_starts_the_clients_and_the_docs():
    text = README.read_text()
    assert "```text" in text and "nomyo-router :12434" in text  # the architecture picture
    for must in (
        "examples/ollama-hosts.yaml",
        "examples/openai-compatible.yaml",
        "OLLAMA_HOST=",
        "from openai import OpenAI",
        "import anthropic",
        "docs/",
    ):
        assert must in text, must


@pytest.mark.parametrize("path", PROSE, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_issue_numbers_or_commit_hashes_in_prose(path):
    text = path.read_text()
    issues = [m.group(0) for m in ISSUE.finditer(text)]
    assert not issues, f"{path.name}: {issues[:5]} (explain the why in words; the history has the numbers)"
    hashes = [m.group(0) for m in HEX.finditer(text) if looks_like_a_hash(m.group(0))]
    assert not hashes, f"{path.name}: {hashes[:5]} look like commit hashes"


def test_the_checks_catch_what_they_should():
    assert ISSUE.search("fixed in #15") and ISSUE.search("Issue 16, item 3") and ISSUE.search("issues 15")
    assert not ISSUE.search("see routing.md#failures-and-failover or c=32 (item 6)")
    assert [m.group(0) for m in HEX.finditer("main at `7b55038`, af4e8d4 reverted")] == ["7b55038", "af4e8d4"]
    assert not [m.group(0) for m in HEX.finditer("sha256:" + "ab12" * 16) if looks_like_a_hash(m.group(0))]
    assert not looks_like_a_hash("1234567") and not looks_like_a_hash("deadbeef")


def links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return [m.group(1) for m in re.finditer(r"\]\(([^)\s]+)\)", text)]


def test_readme_links_lead_somewhere():
    for target in links(README):
        if not re.match(r"[a-z]+:", target):
            assert (ROOT / target.split("#")[0]).exists(), target


def router() -> list[str]:
    script = Path(sys.executable).parent / "nomyo-router"
    return [str(script)] if script.exists() else [sys.executable, "-m", "nomyo_router"]


EXAMPLES = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "examples").glob("*.y*ml"))]


def test_every_example_is_checked_and_linked():
    assert len(EXAMPLES) >= 4 and "examples/keys-and-limits.yaml" in EXAMPLES
    docs = (ROOT / "docs" / "getting-started.md").read_text() + (ROOT / "docs" / "deployment.md").read_text()
    for example in EXAMPLES:
        assert example in docs, f"{example} is not mentioned in docs/getting-started.md or docs/deployment.md"


def check(config: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*router(), "--config", config, "--check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("config", [*EXAMPLES, "config.yaml"])
def test_example_configs_pass_check(config):
    """As shipped, with none of the variables they name set (${VAR:-default} falls back)..."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOMYO_", "VLLM_"))}
    out = check(config, env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("endpoint(s)")
    # ...and with every one of them set, as in production (each key its own value)
    names = sorted(set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", (ROOT / config).read_text())))
    out = check(config, {**env, **{name: f"{name.lower()}-0123456789abcdef" for name in names}})
    assert out.returncode == 0, out.stderr


def test_the_docs_site_lists_pages_that_exist():
    class Loader(yaml.SafeLoader):  # mkdocs.yml may use !!python tags; none are needed here
        pass

    site = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)
    assert site["strict"] is True and site["theme"]["name"] == "material"
    pages = [next(iter(entry.values())) for entry in site["nav"]]
    for page in pages:
        assert (ROOT / "docs" / page).exists(), page
    for page in (
        "configuration.md",
        "security.md",
        "getting-started.md",
        "apis.md",
        "routing.md",
        "deployment.md",
        "operations.md",
        "loadtest.md",
        "mock.md",
        "benchmarks.md",
        "architecture.md",
        "cli-reference.md",
    ):
        assert page in pages, page


def test_the_cli_reference_is_current():
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import cli_reference
    finally:
        sys.path.remove(str(ROOT / "docs"))
    assert (ROOT / "docs" / "cli-reference.md").read_text() == cli_reference.render(), (
        "docs/cli-reference.md is stale: run `python docs/cli_reference.py` (make docs does)"
    )


def test_make_docs_builds_the_site_strictly(tmp_path):
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        pytest.skip("mkdocs is absent (pip install '.[docs]')")
    out = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").exists() and (tmp_path / "site" / "deployment.html").exists()


def test_no_issue_numbers_in_code_comments():
    """Comments and docstrings explain the why in words, like the docs."""
    found = []
    for tree in ("nomyo_router", "mock", "loadtest", "bench", "test"):
        for path in sorted((ROOT / tree).rglob("*.py")):
            if path.name == "test_readme.py":
                continue  # (its own examples of what is caught)
            for n, line in enumerate(path.read_text().splitlines(), 1):
                m = re.search(r"\bissues? \d+", line, re.IGNORECASE)
                if m:
                    found.append(f"{path.relative_to(ROOT)}:{n}: {m.group(0)}")
    assert not found, found[:10]


def test_readme_and_getting_started_agree_on_make_test():
    """One figure for how long `make test` takes, and one list of what it installs."""
    readme = (ROOT / "README.md").read_text()
    started = re.sub(r"\s+", " ", (ROOT / "docs" / "getting-started.md").read_text())
    line = next(x for x in readme.splitlines() if x.startswith("make test"))
    minutes = re.search(r"~(\d+) min", line)
    assert minutes and f"about {minutes.group(1)} minutes" in started, (line, minutes)
    assert re.findall(r"install '([^']+)'", line) == re.findall(r"make test +# venv \+ install '([^']+)'", started)
