# The two commands of a fresh Debian machine (as root):
#   make demo   set everything up, then vmplacer on an example host and on real guests
#   make test   set everything up, then run every test
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
DEMO_HOST ?= examples/hosts/xeon-2s-56c-smt2.xml
DEMO_REQUEST ?= examples/requests/mixed.yaml
PYTEST_ARGS ?=

.PHONY: demo test setup postgres testbed-up testbed-down image unit bench clean

setup:
	@bash scripts/setup.sh

postgres: setup
	@bash scripts/postgres.sh >/dev/null

# Dry run on an example host, then real guests badly placed on the local two-host
# testbed, one `vmplacer rebalance`, and each guest's throughput before and after.
demo: setup
	@DEMO_HOST=$(DEMO_HOST) DEMO_REQUEST=$(DEMO_REQUEST) bash scripts/demo.sh

test: setup
	@export VMPLACER_TEST_POSTGRES_URL="$$(bash scripts/postgres.sh)" && \
	  $(BIN)/python -m pytest -ra --durations=15 $(PYTEST_ARGS)

# Fast inner loop: pure logic only, no daemons.
unit: setup
	@$(BIN)/python -m pytest -q tests/unit $(PYTEST_ARGS)

testbed-up: setup
	@bash scripts/testbed.sh up

testbed-down:
	@bash scripts/testbed.sh down

image: setup
	@bash scripts/testbed.sh image

bench: setup
	@for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
