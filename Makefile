# The README's commands. Each target installs what a fresh Debian 12
# machine lacks (as root) before it builds.

.PHONY: all build prod run demo test test-sanitize soak fuzz model db stop reset api provider bench bench-schema deps clean \
	cluster cluster-failover cluster-reset test-cluster

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

soak:
	@scripts/soak

fuzz:
	@scripts/fuzz

model:
	@scripts/model

db: deps
	@scripts/db

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
