# waygate: build the filter (.wasm) and the host, run the gateway, test, lint.
# Everything native builds with --release: one wasmtime build serves tests, run and bench.

CARGO  ?= cargo
WASM   := target/wasm32-wasip1/wasm/waygate.wasm
HOST   := target/release/waygate-host
LISTEN ?= 127.0.0.1:8080
FAKES  ?= 127.0.0.1:8081

.PHONY: all toolchain build wasm host run test lint check-configs bench clean fuzz soak

all: build

# RUSTUP_AUTO_INSTALL=0 on our machines: install the pinned toolchain and target explicitly.
toolchain:
	@rustup toolchain install >/dev/null 2>&1 || rustup toolchain install

# After cargo, binaryen's wasm-opt -O3 (when installed; .ci/run installs it): with
# opt-level "s" it halves the filter's CPU per request against "z" and stays under
# 600 KB (measured by make bench). It runs when cargo built a new module; its output is
# kept beside it and copied to $(WASM) every time, because cargo puts its own unoptimised
# file back there (a hard link to deps/) on every run, rebuilt or not. The copy is also
# newer than every source, which the tests' staleness check looks for.
WASM_OPT_FLAGS := -O3 --enable-bulk-memory --enable-nontrapping-float-to-int --enable-sign-ext \
	--enable-mutable-globals --enable-multivalue --enable-reference-types
WASM_BUILT := target/wasm32-wasip1/wasm/deps/waygate.wasm
WASM_OPTIMIZED := target/wasm32-wasip1/wasm/waygate.optimized.wasm
wasm: toolchain
	$(CARGO) rustc --target wasm32-wasip1 --profile wasm -p waygate --lib --crate-type cdylib
	@if [ ! -e $(WASM_OPTIMIZED) ] || [ $(WASM_BUILT) -nt $(WASM_OPTIMIZED) ]; then \
	  if command -v wasm-opt >/dev/null 2>&1; then \
	    wasm-opt $(WASM_OPT_FLAGS) $(WASM_BUILT) -o $(WASM_OPTIMIZED).tmp && \
	    mv $(WASM_OPTIMIZED).tmp $(WASM_OPTIMIZED) && \
	    echo "wasm-opt -O3: $$(wc -c < $(WASM_OPTIMIZED)) bytes"; \
	  else echo "warning: wasm-opt (Debian package binaryen) not found; $(WASM) is not optimised"; \
	    cp $(WASM_BUILT) $(WASM_OPTIMIZED); fi; \
	fi
	@cp --remove-destination $(WASM_OPTIMIZED) $(WASM)

host: toolchain
	$(CARGO) build --release -p waygate-host

build: wasm host
	@echo "built $(WASM) ($$(wc -c < $(WASM)) bytes) and $(HOST)"

# The gateway on $(LISTEN) with the fake providers on $(FAKES); no API keys needed. Access
# log lines show within 1 s (Envoy flushes every 10 s by default; Istio uses 1 s).
run: build
	@echo ""
	@echo "waygate on http://$(LISTEN)/api/v1 (dev key: wg-dev-key). Try:"
	@echo "  curl -s http://$(LISTEN)/api/v1/chat/completions -H 'authorization: Bearer wg-dev-key' \\"
	@echo "       -H 'content-type: application/json' -d '{\"model\":\"fake/ok\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'"
	@echo ""
	@$(HOST) fake-providers --listen $(FAKES) & fakes=$$!; \
	  trap 'kill $$fakes 2>/dev/null' EXIT INT TERM; \
	  $(HOST) -c envoy/local.yaml --file-flush-interval-msec 1000

# The official OpenAI Python client, pinned, for the client-level tests.
PYENV := target/pyenv
$(PYENV)/.installed: tests/clients/requirements.txt
	python3 -m venv $(PYENV)
	$(PYENV)/bin/pip install -q -r tests/clients/requirements.txt
	touch $@

test: build $(PYENV)/.installed
	$(CARGO) test --release --workspace

# Every shipped Envoy/Istio/compose config parsed into Envoy's own API types (xds-protos),
# then the check's own tests (each misspelling must fail it). No Envoy or Docker needed.
CONFIGS_PYENV := target/pyenv-configs
$(CONFIGS_PYENV)/.installed: scripts/requirements-configs.txt
	python3 -m venv $(CONFIGS_PYENV)
	$(CONFIGS_PYENV)/bin/pip install -q --no-deps -r scripts/requirements-configs.txt
	touch $@

check-configs: $(CONFIGS_PYENV)/.installed
	$(CONFIGS_PYENV)/bin/python scripts/check_configs.py
	$(CONFIGS_PYENV)/bin/python scripts/test_check_configs.py

lint: toolchain check-configs
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --release --workspace --all-targets -- -D warnings
	$(CARGO) clippy --target wasm32-wasip1 -p waygate --lib -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --release --no-deps --workspace
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --target wasm32-wasip1 --no-deps -p waygate

# Benchmarks, never run in CI (README "Performance"): the core natively (criterion), the
# .wasm in the VM (µs and fuel per request, MB/s, memory, size), end-to-end load via the host.
bench: build
	@command -v wasm-opt >/dev/null || { apt-get install -y -qq binaryen || { apt-get update -qq && \
	  apt-get install -y -qq binaryen; }; } >/dev/null 2>&1 || echo "binaryen not installed: no wasm-opt size"
	$(CARGO) bench -p waygate --bench core --no-run
	@mkdir -p target/bench
	$(CARGO) bench -q -p waygate --bench core -- --quiet --noplot 2>target/bench/core.log || \
	  { cat target/bench/core.log; exit 1; }
	$(CARGO) bench -q -p waygate-host --bench wasm
	$(CARGO) bench -q -p waygate-host --bench e2e

# cargo-fuzz targets on nightly (fuzz/, its own workspace), FUZZ_SECONDS each (default
# 30); prints executions, coverage and crashes per target (README "Robustness").
fuzz:
	@rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
	@command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz --locked
	FUZZ_SECONDS=$${FUZZ_SECONDS:-30} fuzz/run.sh

# SOAK_REQUESTS (default 100,000) mixed requests at concurrency 32 through the host
# (tests/soak.rs, ignored by `make test`); the summary is target/soak.txt.
# SOAK_BUSY_POLL_US=N: the host's workers poll for N µs (host/src/busy_poll.rs).
soak: build
	$(CARGO) test --release --test soak -- --ignored --nocapture >target/soak.log 2>&1 || \
	  { tail -30 target/soak.log; exit 1; }
	@cat target/soak.txt

clean:
	$(CARGO) clean
