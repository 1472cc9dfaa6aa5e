# nomyo-router in a container: a non-root user, the config mounted at
# /etc/nomyo-router/config.yaml, port 12434. See docs/deployment.md.
#   docker build -t nomyo-router .
#   docker run -p 127.0.0.1:12434:12434 -v "$PWD/examples/ollama-hosts.yaml:/etc/nomyo-router/config.yaml:ro" nomyo-router

# Build the wheels, the optional compiled relay included (it needs a C compiler), with the
# request path compiled by mypyc (setup.py's HOT_PATH: about a quarter less CPU per request).
FROM python:3.11-slim AS build
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY nomyo_router ./nomyo_router
COPY loadtest ./loadtest
COPY mock ./mock
# mypyc comes with mypy and type-checks the whole package: the lint extra (mypy, the stubs,
# pinned) and the optional extras' modules must be there. The wheels: the router's and every
# dependency of it and of the extras the image serves with (tracing: `tracing:` in the config;
# kv-events: vLLM's KV-cache events)
# hadolint ignore=DL3013
RUN pip install --no-cache-dir setuptools wheel ".[lint,kv-events,tracing]" \
 && NOMYO_ROUTER_COMPILE=1 pip wheel --no-cache-dir --no-build-isolation --wheel-dir /wheels ".[kv-events,tracing]"

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /wheels /wheels
# (the version is the one wheel built above)
# hadolint ignore=DL3013
RUN pip install --no-cache-dir --no-index --find-links /wheels "nomyo-router[kv-events,tracing]" \
 && rm -rf /wheels \
 && useradd --system --uid 10001 --home-dir /var/lib/nomyo-router --create-home --shell /usr/sbin/nologin nomyo \
 && mkdir -p /etc/nomyo-router
# the usage database (usage_db: ./nomyo-usage.db) is written here; mount a volume to keep it
WORKDIR /var/lib/nomyo-router
USER 10001
EXPOSE 12434
# /readyz: 200 while at least one backend is healthy, else 503 (no key needed). Asked by bash
# itself (/dev/tcp), not by a Python started every 10 s
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/12434 && printf 'GET /readyz HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n' >&3 && read -r -t 2 status <&3 && [[ $status == 'HTTP/1.1 200 '* ]]"]
ENTRYPOINT ["nomyo-router"]
CMD ["--config", "/etc/nomyo-router/config.yaml", "--host", "0.0.0.0"]
