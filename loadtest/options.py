"""The load tester's command line: every flag, its default and its help, in one parser.

`nomyo-loadtest --help` prints USAGE below as its epilog; docs/cli-reference.md is generated
from that output.
"""

from __future__ import annotations

import argparse

from mock.config import MockConfig, add_arguments
from mock.version import PrintVersion

from . import batch as batch_mod
from . import dataset as dataset_mod
from . import faults as faults_mod
from . import prefix as prefix_mod
from . import search as search_mod
from . import sessions as sessions_mod
from . import slo as slo_mod

USAGE = """nomyo-loadtest: drive a router or an LLM server, ramp to the knee, report and gate.

  nomyo-loadtest --mock-backend --ramp 8,32,64,128          # spawn mock + router, ramp
  nomyo-loadtest --url http://127.0.0.1:12434 --concurrency 32
  nomyo-loadtest --serve-mock --mock-port 11434              # only the mock
  nomyo-loadtest --mock-backend --ramp 8,64 --repeat 5 --json current.json  # repetitions: noise
  nomyo-loadtest --url http://gpu1:11434 --slo ttft=500ms,e2el=10s --find-max-rate 1,64
  nomyo-loadtest --url http://gpu1:11434 --sweep 1,2,4,8,16 --html sweep.html   # Pareto front
  nomyo-loadtest --mock-backend --mock-count 2 --rate 50 --duration 60 --fault 30s:kill:mock-1 \
      --fault 45s:restart:mock-1 --html faults.html        # faults on a schedule, recovery per fault
  nomyo-loadtest --url http://gpu1:11434 --dataset prompts.jsonl --turns 3 --html report.html
  nomyo-loadtest --url http://gpu1:11434 --turns 8 --think-ms 2000:poisson --tool-tokens 500  # agents
  nomyo-loadtest compare BASELINE.json CURRENT.json --max-regression throughput=10%,p50=15%,p99=30%,ttft=15%
"""

# The mock the load tester spawns is cheap and wide, so the router is what gets measured.
# Its prompt_eval_count leaves out what its KV cache held, as a real Ollama's does, so the
# per-session cache hit rates read the same from it as from Ollama.
LOADTEST_MOCK = MockConfig(
    ttft_ms=20.0, tokens=32, tok_ms=1.0, parallel=4096, max_queue=100_000, eval_count_uncached=True
)


def _floats(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError("every ramp value must be > 0")
    return values


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected K:V, got {text!r}")
    return name.strip(), value.strip()


def _setting(text: str) -> tuple[str, object]:
    import yaml

    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), yaml.safe_load(value)


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as the epilog, and every option's default in its help line."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        return text if "default" in text else super()._get_help_string(action)  # type: ignore[misc]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nomyo-loadtest", description=USAGE.split("\n\n")[0], formatter_class=_Formatter, epilog=USAGE
    )
    p.add_argument("--version", action=PrintVersion)
    mode = p.add_argument_group("mode")
    mode.add_argument("--url", default="http://127.0.0.1:12434", help="server to drive (default mode)")
    mode.add_argument("--mock-backend", action="store_true", help="spawn mock(s) and a router, drive the router")
    mode.add_argument("--serve-mock", action="store_true", help="only run the mock until Ctrl-C")
    mode.add_argument(
        "--direct", action="store_true", help="with --mock-backend: also measure straight to the mock, stage by stage"
    )
    fleet = p.add_argument_group("mock backend and router (with --mock-backend)")
    fleet.add_argument("--mock-count", type=int, default=1, help="mock backends to spawn")
    fleet.add_argument("--mock-port", type=int, default=None, help="first mock's port (default: free)")
    fleet.add_argument("--mock-host", default="127.0.0.1", help="address the mocks listen on")
    add_arguments(fleet, prefix="mock-", defaults=LOADTEST_MOCK)
    fleet.add_argument("--router-workers", type=int, default=1, help="router worker processes")
    fleet.add_argument(
        "--router-max-conc",
        type=int,
        default=None,
        help="slots per endpoint (default: the peak concurrency, so the router only queues when asked)",
    )
    fleet.add_argument("--router-port", type=int, default=None, help="router port (default: free)")
    fleet.add_argument(
        "--router-set",
        type=_setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra router config, e.g. conversation_affinity=false",
    )
    fleet.add_argument("--keep-config", action="store_true", help="keep the generated router config file")
    req = p.add_argument_group("requests")
    req.add_argument("--api", choices=["ollama", "openai"], default="ollama", help="API to speak")
    req.add_argument("--endpoint", choices=["chat", "generate", "embed"], default="chat", help="route kind")
    req.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True, help="stream answers")
    req.add_argument("--model", default=None, help="default: the mock's first model, or llama3")
    req.add_argument("--prompt", default="Why is the sky blue?", help="the user message or prompt")
    req.add_argument("--prompt-tokens", type=int, default=None, help="send a prompt of about N tokens")
    req.add_argument("--max-tokens", type=int, default=None, help="num_predict / max_tokens (default: the server's)")
    req.add_argument(
        "--request-option",
        type=_setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help='sampling option sent with every request: in Ollama\'s "options", at the top level '
        "for OpenAI, e.g. temperature=0 or seed=1 (default: none)",
    )
    req.add_argument("--header", type=_header, action="append", default=[], metavar="K:V")
    load = p.add_argument_group("load shape")
    load.add_argument("--concurrency", type=int, default=32, help="closed loop: virtual users")
    load.add_argument(
        "--rate",
        type=float,
        nargs="?",
        const=-1.0,
        default=None,
        help="open loop at R req/s; with --ramp and no value, the ramp values are rates",
    )
    load.add_argument(
        "--arrival",
        choices=["constant", "poisson", "gamma"],
        default="constant",
        help="open-loop arrivals: evenly spaced, Poisson, or gamma (see --burstiness)",
    )
    load.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="with --arrival gamma: the shape B of the gamma inter-arrival times (mean 1/rate, "
        "as vllm bench): 1 is Poisson, below 1 burstier, above 1 more even",
    )
    load.add_argument(
        "--timeslice",
        type=float,
        default=None,
        metavar="S",
        help="also report each stage's metrics per S-second slice (JSON `timeslices`, and a "
        "timeline in the HTML report) (default: off)",
    )
    load.add_argument("--ramp", type=_floats, default=None, help="e.g. 8,32,64 (concurrencies or rates)")
    load.add_argument(
        "--sweep",
        type=_floats,
        default=None,
        metavar="RATES",
        help="open-loop stages at these rates (req/s), e.g. 5,10,20,40; the report plots throughput "
        "against p50/p99 latency and TTFT with the Pareto front joined (JSON `sweep`) (default: off)",
    )
    load.add_argument("--duration", type=float, default=10.0, help="seconds per stage")
    load.add_argument("--requests", type=int, default=None, help="requests per stage instead of --duration")
    load.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each stage")
    load.add_argument(
        "--timeout", type=float, default=120.0, help="per request (a request cut by it is an error of kind timeout)"
    )
    load.add_argument(
        "--max-error-rate",
        type=float,
        default=0.01,
        help="exit 1 when a stage's error rate is above this (default 0.01 = 1%%)",
    )
    load.add_argument("--seed", type=int, default=0, help="seed of arrivals and workloads")
    load.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run each stage N times back to back; the JSON keeps each repetition's metrics and "
        "their spread, which `compare` uses to tell a change from noise",
    )
    gate = p.add_argument_group("SLO and goodput")
    gate.add_argument(
        "--slo",
        type=slo_mod.parse_slo,
        default=None,
        metavar="ttft=500ms,e2el=10s,...",
        help="per-request bounds (ttft, e2el, tpot, itl); goodput per stage; exit 1 when a stage "
        "misses it (default: none)",
    )
    gate.add_argument(
        "--slo-share",
        type=float,
        default=0.95,
        help="a stage meets the SLO when goodput >= this share of its throughput",
    )
    search_mod.add_arguments(gate)
    conv = p.add_argument_group("conversations")
    conv.add_argument("--turns", type=int, default=1, help="turns per conversation (closed loop)")
    conv.add_argument("--context-tokens", type=int, default=0, help="history size of a conversation's first turn")
    conv.add_argument("--session-header", default=None, help="send the conversation id in this header")
    prefix_mod.add_arguments(p)
    dataset_mod.add_arguments(p)
    faults_mod.add_arguments(p)
    sessions_mod.add_arguments(p)
    batch_mod.add_arguments(p)
    out = p.add_argument_group("output")
    out.add_argument("--json", default=None, metavar="PATH", help="write the nomyo-loadtest/1 JSON here")
    out.add_argument("--html", default=None, metavar="PATH", help="write the self-contained HTML report here")
    out.add_argument("--quiet", action="store_true", help="no live progress")
    return p
