"""A bad config file is reported whole: every problem in one run of `nomyo-router --check`,
a key given twice in one mapping refused with both lines, a port out of range said as a
range, and a section whose optional dependencies are not installed reported before start."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from nomyo_router.config import ConfigError, load_config, parse_config

BAD = """\
endpoints:
  - url: http://127.0.0.1:99999
    name: a
  - url: http://127.0.0.1:11434
    max_concurrent: -3
  - http://h:abc
max_queue: 10
max_queu: 5
cache:
  ttl: -1
  enabled: true
max_queue: 20
retry_after: "x"
admin_key: short
client_keys:
  - name: admin
    key: "0123456789abcdef"
  - {name: b, key: "x"}
"""
EXPECTED = [
    "max_queue: given twice (lines 7 and 12); keep one",
    "max_queu: unknown key; did you mean max_queue?",
    "endpoints[0].url: the port in 'http://127.0.0.1:99999' is not in 1..65535",
    "endpoints[1].max_concurrent: expected an integer >= 1, got -3",
    "endpoints[2].url: the port in 'http://h:abc' is not a number",
    "cache.ttl: expected a number > 0 (seconds), got -1",
    "retry_after: expected an integer >= 0, got 'x'",
    "admin_key: a key of 5 characters is too easy to guess",
    "client_keys[1].key: a key of 1 characters is too easy to guess",
    "client_keys: the names 'default', 'admin' and 'metrics' are reserved",
]


def check(path: str, *prelude: str) -> subprocess.CompletedProcess[str]:
    """`nomyo-router --config path --check`, after `prelude` (Python lines run first)."""
    code = "\n".join([*prelude, "import sys", "from nomyo_router.cli import main", "sys.exit(main(sys.argv[1:]))"])
    return subprocess.run(
        [sys.executable, "-P", "-c", code, "--config", path, "--check"], capture_output=True, text=True, timeout=60
    )


def test_every_problem_of_a_file_is_reported_in_one_run(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(BAD)
    r = check(str(path))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == len(EXPECTED), r.stderr
    for expected in EXPECTED:  # each on a line of its own, naming the file
        assert any(line.startswith(f"nomyo-router: bad config: {path}: {expected}") for line in lines), expected
    assert "0123456789abcdef" not in r.stderr and "short" not in r.stderr  # never a key


def test_a_key_given_twice_is_refused_wherever_it_is(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text(
        textwrap.dedent("""\
        defaults: &d {max_concurrent: 3}
        endpoints:
          - <<: *d
            url: http://127.0.0.1:11434
            name: a
            name: b
        cache:
          enabled: true
          ttl: 60
          ttl: 120
        """)
    )
    with pytest.raises(ConfigError) as e:
        load_config(str(path))
    assert e.value.problems == [  # a merge (<<) is no key; the anchor's holder is unknown, also said
        "endpoints[0].name: given twice (lines 5 and 6); keep one",
        "cache.ttl: given twice (lines 9 and 10); keep one",
        "defaults: unknown key; remove it (the valid keys are in docs/configuration.md)",
    ]
    path.write_text("endpoints:\n  - url: http://127.0.0.1:65535\n    name: a\nmax_queue: 5\n")
    assert load_config(str(path)).max_queue == 5  # the highest port, each key once: fine


def test_check_reports_tracing_without_its_extra(tmp_path):
    path = tmp_path / "tracing.yaml"
    path.write_text("endpoints: [http://127.0.0.1:11434]\ntracing: {}\nusage_db: null\n")
    hide = textwrap.dedent("""\
        import sys
        class Hide:  # an install without the tracing extra
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("opentelemetry", "google"):
                    raise ModuleNotFoundError(name)
        sys.meta_path.insert(0, Hide())
        """)
    r = check(str(path), hide)
    assert r.returncode == 2
    assert "nomyo-router: tracing: needs the opentelemetry-proto package, which is not installed" in r.stderr
    assert "pip install 'nomyo-router[tracing]'" in r.stderr
    assert "opentelemetry" not in sys.modules or check(str(path)).returncode == 0  # with it installed: ok


def test_entries_of_a_list_are_named_by_their_place_in_the_file():
    """An entry left out (not a mapping, no usable url or key) does not shift the names of
    the others' problems; an entry with an unknown key is still checked whole."""
    with pytest.raises(ConfigError) as e:
        parse_config(
            {
                "endpoints": [5, {"url": "http://x:1", "max_concurrent": "a", "modls": 5}, "http://y:2"],
                "client_keys": [
                    {"name": 5, "key": "0123456789"},
                    {"nme": "ok", "key": "abcdefghijk", "rpm": "x"},
                    {"name": "z", "key": "short"},
                    {"name": "w", "key": "wwwwwwwwwwww", "rpm": 0},
                ],
            }
        )
    assert e.value.problems == [
        "endpoints[0]: expected a URL or a mapping with 'url', got an int",
        "endpoints[1].modls: unknown key; did you mean models?",
        "client_keys[1].nme: unknown key; did you mean name?",
        "client_keys[2].key: a key of 5 characters is too easy to guess; use at least 8 (16 or more recommended)",
        "endpoints[1].max_concurrent: expected an integer >= 1, got 'a'",
        "client_keys[0].name: expected a non-empty string, got 5",
        "client_keys[1].rpm: expected an integer >= 1, got 'x'",
        "client_keys[1]: 'name' is required",
        "client_keys[3].rpm: expected an integer >= 1, got 0",
    ]
