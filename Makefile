# The README's commands. Each target installs what a fresh Debian 12
# machine lacks (as root) before it builds.

.PHONY: all build prod run demo test test-sanitize test-loaded soak fuzz model db migrate stop reset api provider bench bench-schema deps clean \
	cluster cluster-failover cluster-reset test-cluster test-edge test-upgrade

all: build

deps:
	@scripts/deps

build: deps
	@scripts/build dev

prod: deps
	@scripts/build prod

run: deps
	@scripts/run

demo: deps
	@scripts/demo

test:
	@scripts/test

test-sanitize:
	@IDEM_TEST_FLAVOR=sanitize scripts/test

test-loaded:
	@scripts/test-loaded

soak:
	@scripts/soak

fuzz:
	@scripts/fuzz

model:
	@scripts/model

db: deps
	@scripts/db

# ARGS=--dry-run lists what it would apply (docs/operations.md, Migrations).
migrate:
	@scripts/migrate $(ARGS)

stop:
	@scripts/stop

reset:
	@scripts/reset

api: build
	@scripts/api

provider: build
	@scripts/provider

bench: deps
	@scripts/bench

bench-schema: deps
	@scripts/bench schema

clean:
	kodev clean || true
	rm -f app.so .build-flavor
	rm -rf .fuzz .model

cluster: deps
	@scripts/cluster

cluster-failover:
	@scripts/cluster-failover

cluster-reset:
	@scripts/cluster-reset

test-cluster:
	@scripts/test-cluster

# The edge alone (tests/cluster/edge.py) in make test-cluster's topology,
# its differential run 20,000 cases long (IDEM_EDGE_CASES, IDEM_EDGE_SEED).
test-edge:
	@IDEM_TEST_EDGE_ONLY=1 IDEM_EDGE_CASES=$${IDEM_EDGE_CASES:-20000} scripts/test-cluster

test-upgrade:
	@scripts/test-upgrade
