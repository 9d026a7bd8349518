# The two set-up commands of the README: `make serve` and `make test`. Both install everything
# they need (virtualenv, Python packages, Prometheus/promtool from Debian) on a fresh machine.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
# The native span core (native/, Rust) is built by pip install through setuptools-rust; cargo's
# target dir is kept in the project-owned, gitignored .cache/ so a rebuild is incremental.
export CARGO_TARGET_DIR ?= $(CURDIR)/.cache/cargo-target
NATIVE_SOURCES := native/Cargo.toml native/Cargo.lock $(wildcard native/src/*.rs)

.PHONY: setup system-deps rust serve test lint bench

$(BIN)/.installed: pyproject.toml $(NATIVE_SOURCES) | rust
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

# cargo/rustc: from Debian when the machine has none (the polyglot machines ship a newer rustup one).
rust:
	@command -v cargo >/dev/null 2>&1 || { \
		echo "installing cargo + rustc (Debian packages)"; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends cargo rustc; }

setup: $(BIN)/.installed

serve: setup
	$(BIN)/stepwatch serve

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: setup system-deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	MYPY=$(abspath $(BIN))/mypy .ci/typecheck
	$(BIN)/pytest -q

# Benchmarks are run on demand, never in CI; each prints medians and compares with its floor.
bench: setup
	$(BIN)/python bench/bench_step_accuracy.py
	$(BIN)/python bench/bench_e2e.py --runs 3 --duration 10
	$(BIN)/python bench/bench_wal.py
