# The two set-up commands of the README: `make serve` and `make test`. Both install everything
# they need (virtualenv, Python packages, Prometheus/promtool from Debian) on a fresh machine.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: setup system-deps serve test lint bench otelcol

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

system-deps:
	@command -v promtool >/dev/null 2>&1 || { \
		echo "installing prometheus + promtool (Debian package)"; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus; }
	@command -v amtool >/dev/null 2>&1 || { \
		echo "installing amtool (Debian package prometheus-alertmanager)"; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus-alertmanager; }

setup: $(BIN)/.installed

serve: setup
	$(BIN)/stepwatch serve

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: setup system-deps otelcol
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	MYPY=$(abspath $(BIN))/mypy .ci/typecheck
	$(BIN)/pytest -q

# The real OpenTelemetry Collector the tests run (tests/collector), built with its builder (ocb)
# from deploy/otelcol/builder.yaml into .cache/otelcol/<manifest hash>/; a no-op once cached.
otelcol:
	bash deploy/otelcol/build.sh >/dev/null

# Benchmarks are run on demand, never in CI; each prints medians and compares with its floor.
bench: setup
	$(BIN)/python bench/bench_step_accuracy.py
	$(BIN)/python bench/bench_e2e.py --runs 3 --duration 10
	$(BIN)/python bench/bench_wal.py
