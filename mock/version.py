"""`--version` of nomyo-mock and nomyo-loadtest: the installed distribution's version, looked
up only when asked for (reading the metadata imports importlib.metadata and its modules)."""

from __future__ import annotations

import argparse


def installed() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nomyo-router")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


class PrintVersion(argparse.Action):
    """argparse's `version` action with the version read at the moment it is asked for."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kw: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="show the version and exit")

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        print(f"{parser.prog} {installed()}")
        parser.exit()
