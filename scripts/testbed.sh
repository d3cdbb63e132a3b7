#!/bin/sh
# The two-host libvirt testbed: scripts/testbed.sh up|down|image|status|clean
set -eu
cd "$(dirname "$0")/.."
exec .venv/bin/python -m vmplacer.testbed "$@"
