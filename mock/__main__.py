"""nomyo-mock --port 11434 --ttft-ms 300 --tokens 200 --tok-ms 25 --models llama3,qwen2.5:7b"""

from __future__ import annotations

import argparse
import sys

from .config import add_arguments, from_namespace
from .runner import serve_forever
from .version import PrintVersion


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="nomyo-mock", description="A fake Ollama/OpenAI backend with slots, a KV cache and faults."
    )
    parser.add_argument("--version", action=PrintVersion)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument("--port", type=int, default=11434, help="port to listen on (default: %(default)s)")
    add_arguments(parser)
    ns = parser.parse_args(argv)
    try:
        config = from_namespace(ns)
    except ValueError as e:
        parser.error(str(e))
    serve_forever(config, ns.host, ns.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
