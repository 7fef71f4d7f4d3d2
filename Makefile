# leasehold — the two quick-start commands are `make demo` and `make test`.
CARGO ?= cargo
LIB_CRATES := -p leasehold -p leasehold-redis

.PHONY: test unit lint docs demo bench soak

## test: lint, docs, then every test against real redis-server processes the tests start.
test: lint docs unit

unit:
	@command -v redis-server >/dev/null || [ -n "$$LEASEHOLD_REDIS_SERVER" ] || { \
	  echo "redis-server not found: install it with 'sudo apt-get install -y redis-server'" \
	       "(or set LEASEHOLD_REDIS_SERVER=/path/to/redis-server)"; exit 1; }
	@if $(CARGO) nextest --version >/dev/null 2>&1; then \
	  $(CARGO) nextest run --workspace --all-features --no-fail-fast; \
	else \
	  $(CARGO) test --workspace --all-features --no-fail-fast; \
	fi
	$(CARGO) test --workspace --all-features --doc

## lint: formatting and clippy, warnings denied.
lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets --all-features -- -D warnings

## docs: rustdoc for the library crates, missing docs and broken links denied.
docs:
	RUSTDOCFLAGS="-D warnings -D missing_docs" $(CARGO) doc --no-deps $(LIB_CRATES) --all-features

## demo: the fencing story, told by the `leasehold` binary on an ephemeral local redis-server.
demo:
	$(CARGO) run -q -p leasehold-cli -- demo

## bench: operation latency against raw redis-rs, hand-off latency against polling and rslock,
## and 10,000 kept leases for 60 s, each on an ephemeral redis-server.
bench:
	$(CARGO) run -q --release -p leasehold-redis --example bench_ops
	$(CARGO) run -q --release -p leasehold-redis --example handoff
	$(CARGO) run -q --release -p leasehold-redis --example keepalive_bench

## soak: 100 forced Sentinel failovers per test (two tests, about 4 minutes), checking that no
## fence is ever handed out twice; prints the counts.
soak:
	LEASEHOLD_SOAK_FAILOVERS=100 $(CARGO) nextest run -p leasehold-redis --test fences_survive \
	  --no-fail-fast --success-output immediate
