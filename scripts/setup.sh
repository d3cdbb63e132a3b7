#!/usr/bin/env bash
# One-time (idempotent) set-up of a fresh Debian machine for vmplacer:
# Debian packages (only the missing ones), a virtualenv in .venv, vmplacer installed editable.
# A second run takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  # libvirt + QEMU for the real testbed (see docs/testbed.md)
  libvirt-daemon libvirt-daemon-driver-qemu libvirt-daemon-system libvirt-clients
  libvirt-dev pkg-config qemu-system-x86 cpio busybox-static libxml2-utils
  # PostgreSQL for fleet mode and its tests
  postgresql
  # the web view's browser tests (headless)
  chromium chromium-driver
  # the man page's rendering test and the units' Documentation=man:vmplacer(1) check
  man-db groff-base
  # building libvirt-python
  gcc python3-dev python3-venv
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done
# The testbed downloads a kernel package with apt: it needs package lists even when
# every package above is already installed.
if ! compgen -G "/var/lib/apt/lists/*_Packages*" >/dev/null && [[ $(id -u) -eq 0 ]]; then
  need_update=1
fi
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup: missing Debian packages: ${missing[*]}" >&2
    echo "setup: run as root (or: sudo apt-get install -y --no-install-recommends ${missing[*]})" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  need_update=0
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [[ ${need_update:-0} -eq 1 ]]; then
  echo "setup: apt-get update (package lists are empty)"
  apt-get update -qq
fi

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "setup: $PYTHON is $("$PYTHON" --version 2>&1); vmplacer needs Python >= 3.11" >&2
  exit 1
fi
if [[ ! -x .venv/bin/python ]]; then
  echo "setup: creating .venv"
  "$PYTHON" -m venv .venv
fi
# Reinstall only when the dependency list changed (pip is slow even when nothing changes).
stamp=.venv/.vmplacer-setup-stamp
want=$(sha256sum setup.cfg setup.py pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
# … or when vmplacer itself is gone from it (a pip run elsewhere uninstalled it)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" || ! -x .venv/bin/vmplacer ]]; then
  echo "setup: installing vmplacer and its dependencies (pinned by constraints.txt) into .venv"
  log=.venv/pip-install.log
  if ! { .venv/bin/pip install -q --upgrade pip && .venv/bin/pip install -q -c constraints.txt -e '.[dev]'; } >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "setup: pip install failed (full log: $log)" >&2
    exit 1
  fi
  echo "$want" >"$stamp"
fi
echo "setup: ok"
