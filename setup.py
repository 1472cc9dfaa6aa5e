"""The optional compiled parts; everything else is in pyproject.toml.

- The compiled relay (nomyo_router/relay/_pump.c), built whenever a C compiler and Python's
  headers are there; without them the install goes on and the relay stays in Python
  (nomyo_router/relay/pump.py).
- With `NOMYO_ROUTER_COMPILE=1`, the modules every request runs through (`HOT_PATH`) are
  compiled to C with mypyc, the compiler that comes with mypy: the code is `mypy --strict`
  clean, so it compiles as it is, and the same source stays the pure-Python build. What it
  saves today is in docs/benchmarks.md ("Current figures"): most on streams; on whole
  answers the gain is eaten by attribute lookups on the uncompiled objects it reads (uvicorn,
  asyncio, msgspec, the endpoints). It needs mypy in the build environment, with what it
  type-checks: `make compiled` (a separate virtualenv, `.venv-compiled`), or
  `pip install '.[lint,kv-events,tracing]'` and then
  `NOMYO_ROUTER_COMPILE=1 pip install --no-build-isolation .`, as the Dockerfile does.
"""

import os

from setuptools import Extension, setup

HOT_PATH = [
    "nomyo_router/app.py",
    "nomyo_router/generation.py",
    "nomyo_router/server/body_writer.py",
    "nomyo_router/api/access.py",
    "nomyo_router/server/asgi.py",
    "nomyo_router/api/body_keys.py",
    "nomyo_router/api/requests.py",
    "nomyo_router/relay/exchange.py",
    "nomyo_router/relay/base.py",  # (the answer a way out is handed: made once per request)
    "nomyo_router/forward/proxy.py",
    "nomyo_router/relay/whole.py",
    "nomyo_router/ops/metrics.py",
    "nomyo_router/ops/tracing.py",  # (its TracedUpstream is an Upstream: a subclass of a compiled class is compiled)
    "nomyo_router/routing/affinity.py",
    "nomyo_router/routing/context_windows.py",
    "nomyo_router/routing/prefix_index.py",
    "nomyo_router/routing/scheduler.py",
    "nomyo_router/server/idle_spin.py",  # (armed twice per request by the protocol)
    "nomyo_router/state/coordinator.py",  # (its TableStore is a MemoryStore)
    "nomyo_router/state/redis_local.py",  # (its ProcessTable is a MemoryStore: Redis state's fallback)
    "nomyo_router/state/memory.py",
    "nomyo_router/relay/deadline.py",
    "nomyo_router/h1/pool.py",
    "nomyo_router/h1/connection.py",
    "nomyo_router/h1/response.py",
    "nomyo_router/relay/token_counts.py",
    "nomyo_router/events.py",  # (a RequestRecord per request, its fields set all along the path)
    "nomyo_router/backends/health.py",
    "nomyo_router/backends/unload.py",
    "nomyo_router/backends/stream_lines.py",  # (per record of a stream the router looks into)
    "nomyo_router/api/key_admission.py",
    "nomyo_router/api/client_caps.py",
    "nomyo_router/server/body_budget.py",
    "nomyo_router/forward/sent_body.py",
    "nomyo_router/routing/policies/cache_aware.py",
    "nomyo_router/state/queue_order.py",  # (per queued request)
    "nomyo_router/relay/retry.py",
    "nomyo_router/relay/whole_from_stream.py",
    "nomyo_router/relay/resumable.py",
    "nomyo_router/relay/continuation.py",  # (per read of a stream)
    "nomyo_router/relay/sinks.py",  # (per read of a stream; pump.py stays Python: the tests count its relay)
]

ext_modules = [
    Extension(
        "nomyo_router.relay._pump",
        ["nomyo_router/relay/_pump.c"],
        extra_compile_args=["-O2", "-Wall"],
        optional=True,
    )
]
if os.environ.get("NOMYO_ROUTER_COMPILE") == "1":
    from mypyc.build import mypycify

    ext_modules += mypycify(HOT_PATH, opt_level="3")

setup(ext_modules=ext_modules)
