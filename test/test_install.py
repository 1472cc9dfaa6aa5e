"""`pip install .` puts the three programs on PATH: a wheel built from this tree declares
`nomyo-router`, `nomyo-loadtest` and `nomyo-mock`, carries the router, the load tester and
the mock, and installed into a fresh venv (without downloading dependencies: the project's
venv lends them) each program's `--version` prints the version and its help names it as installed."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = {
    "nomyo-router": "nomyo_router.cli:main",
    "nomyo-loadtest": "loadtest.cli:main",
    "nomyo-mock": "mock.__main__:main",
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel of this tree, built from a copy (the build leaves nothing in the work tree)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(
            ".git",
            ".venv",
            ".venv-*",  # (the compiled build's and the pip build's: make compiled, make pip-build)
            ".hypothesis",
            ".pytest_cache",
            "__pycache__",
            "build",
            "site",
            "*.egg-info",
            "*.so",
            "nomyo-usage.db*",
            "out*",
        ),
    )
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "-q", "-w", str(tmp / "dist")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (built,) = (tmp / "dist").glob("nomyo_router-*.whl")
    return built


def test_the_wheel_declares_the_three_programs_and_carries_their_packages(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        parser = configparser.ConfigParser()
        parser.read_string(z.read(entry_points).decode())
    scripts = dict(parser["console_scripts"])
    for name, target in SCRIPTS.items():
        assert scripts.get(name) == target, (name, scripts)
    for module in (
        "nomyo_router/cli.py",
        "nomyo_router/ops/dashboard.html",
        "loadtest/cli.py",
        "loadtest/report_html.py",
        "mock/__main__.py",
        "mock/server.py",
    ):
        assert module in names, module
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert SCRIPTS.items() <= declared.items()


def test_nomyo_router_version_from_a_fresh_venv(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    fresh_python = env_dir / "bin" / "python"
    fresh_site = subprocess.run(
        [str(fresh_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # the dependencies come from this venv (appended after the fresh site-packages, so the
    # wheel's own copy of nomyo_router is the one imported)
    (Path(fresh_site) / "lent-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    out = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(fresh_python), "install", "--no-deps", "-q", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    for name in SCRIPTS:
        assert (env_dir / "bin" / name).exists(), name
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    for name in SCRIPTS:  # each names itself as installed, in --version and in its usage line
        out = subprocess.run([str(env_dir / "bin" / name), "--version"], capture_output=True, text=True, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == f"{name} {version}"
        usage = subprocess.run([str(env_dir / "bin" / name), "--help"], capture_output=True, text=True, cwd=tmp_path)
        assert usage.returncode == 0 and usage.stdout.startswith(f"usage: {name} "), usage.stdout[:200]
        assert "python -m mock" not in usage.stdout and "python loadtest.py" not in usage.stdout
    where = subprocess.run(
        [
            str(fresh_python),
            "-c",
            "import nomyo_router, loadtest, mock; print(nomyo_router.__file__, loadtest.__file__, mock.__file__)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert where.returncode == 0 and all(p.startswith(fresh_site) for p in where.stdout.split()), where.stdout
    for name in ("nomyo-loadtest", "nomyo-mock"):
        out = subprocess.run(
            [str(env_dir / "bin" / name), "--help"], capture_output=True, text=True, timeout=60, cwd=tmp_path
        )
        assert out.returncode == 0 and "usage:" in out.stdout, (name, out.stderr)
