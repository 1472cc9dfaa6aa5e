# The two commands: `make demo` (the main job) and `make test`. Both set up what is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
RAMP ?= 8,32,64,128

.PHONY: demo test setup setup-test redis wrk chromium bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

setup: $(BIN)/python
	$(BIN)/pip install -q -e .

setup-test: $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'

redis:
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "installing redis-server from the distribution"; \
	  (apt-get update -qq && apt-get install -y -qq redis-server) >/dev/null; }

chromium:
	@{ command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; } || { \
	  echo "installing chromium and chromium-driver from the distribution (browser tests)"; \
	  (apt-get update -qq && apt-get install -y -qq chromium chromium-driver) >/dev/null; }

wrk:
	@command -v wrk >/dev/null 2>&1 || { \
	  echo "installing wrk from the distribution"; \
	  (apt-get update -qq && apt-get install -y -qq wrk) >/dev/null; }

demo: setup
	$(BIN)/python loadtest.py --mock-backend --ramp $(RAMP)

test: setup-test redis chromium
	$(BIN)/python -m pytest -q

bench: setup wrk
	$(BIN)/python bench/overhead.py --floor

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
