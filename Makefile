# waygate: build the filter (.wasm) and the host, run the gateway, test, lint.
# Everything native builds with --release: one wasmtime build serves tests, run and bench.

CARGO  ?= cargo
WASM   := target/wasm32-wasip1/wasm/waygate.wasm
HOST   := target/release/waygate-host
LISTEN ?= 127.0.0.1:8080
FAKES  ?= 127.0.0.1:8081

.PHONY: all toolchain build wasm host run test lint check-configs bench clean

all: build

# RUSTUP_AUTO_INSTALL=0 on our machines: install the pinned toolchain and target explicitly.
toolchain:
	@rustup toolchain install >/dev/null 2>&1 || rustup toolchain install

# The touch marks the .wasm as current for the tests' staleness check even when cargo
# had nothing to rebuild (a file under src/ newer than it but not part of the build).
wasm: toolchain
	$(CARGO) rustc --target wasm32-wasip1 --profile wasm -p waygate --lib --crate-type cdylib
	@touch $(WASM)

host: toolchain
	$(CARGO) build --release -p waygate-host

build: wasm host
	@echo "built $(WASM) ($$(wc -c < $(WASM)) bytes) and $(HOST)"

# The gateway on $(LISTEN) with the fake providers on $(FAKES); no API keys needed.
run: build
	@echo ""
	@echo "waygate on http://$(LISTEN)/api/v1 (dev key: wg-dev-key). Try:"
	@echo "  curl -s http://$(LISTEN)/api/v1/chat/completions -H 'authorization: Bearer wg-dev-key' \\"
	@echo "       -H 'content-type: application/json' -d '{\"model\":\"fake/ok\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'"
	@echo ""
	@$(HOST) fake-providers --listen $(FAKES) & fakes=$$!; \
	  trap 'kill $$fakes 2>/dev/null' EXIT INT TERM; \
	  $(HOST) -c envoy/local.yaml

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

clean:
	$(CARGO) clean
