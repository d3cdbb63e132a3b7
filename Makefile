# The two commands of a fresh Debian machine (as root):
#   make demo   set everything up, then run vmplacer on an embedded example host
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

demo: setup
	@echo "== vmplacer topology: $(DEMO_HOST)"
	@$(BIN)/vmplacer topology --caps $(DEMO_HOST)
	@echo
	@echo "== vmplacer plan (dry run): $(DEMO_REQUEST) on $(DEMO_HOST)"
	@$(BIN)/vmplacer plan --caps $(DEMO_HOST) --request $(DEMO_REQUEST)

test: setup
	@export VMPLACER_TEST_POSTGRES_URL="$$(bash scripts/postgres.sh)" && \
	  $(BIN)/python -m pytest -ra $(PYTEST_ARGS)

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
