#!/usr/bin/env bash
# The vmplacer demo: a dry run on an example host, then — where QEMU and libvirt are available —
# real guests badly placed on the two-host testbed, one `vmplacer rebalance`, and each guest's
# throughput before and after, read from the guests' own progress counters.
#
# The testbed's two hosts are one machine: host1 may use pCPU 0 only and host2 pCPU 1 only
# (reserved_cpus in the demo's config), so they behave like two one-pCPU machines. Two busy guests
# share host1's pCPU, host2 runs only an idle guest: the rebalancer live-migrates one busy guest
# to host2 and both run about twice as fast. Takes about a minute; cleans up after itself.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
DEMO_HOST=${DEMO_HOST:-examples/hosts/xeon-2s-56c-smt2.xml}
DEMO_REQUEST=${DEMO_REQUEST:-examples/requests/mixed.yaml}

echo "== vmplacer topology: $DEMO_HOST"
"$BIN/vmplacer" topology --caps "$DEMO_HOST"
echo
echo "== vmplacer plan (dry run): $DEMO_REQUEST on $DEMO_HOST"
"$BIN/vmplacer" plan --caps "$DEMO_HOST" --request "$DEMO_REQUEST"
echo

# ----- the live part needs root, QEMU and libvirt ---------------------------------------------------
missing=()
for tool in libvirtd virtlogd virsh qemu-system-x86_64 unshare cpio; do
  PATH="$PATH:/usr/sbin:/sbin" command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
[[ -x /bin/busybox ]] || missing+=("busybox-static")
[[ $(id -u) -eq 0 ]] || missing+=("root")
if ((${#missing[@]})); then
  echo "== live rebalancing demo skipped: needs ${missing[*]} (see docs/testbed.md)"
  exit 0
fi
if ! bash scripts/testbed.sh up || ! bash scripts/testbed.sh image; then
  echo "== live rebalancing demo skipped: the libvirt testbed could not be brought up (see above)"
  exit 0
fi

WORK=$(mktemp -d /tmp/vmplacer-demo.XXXXXX)
export DEMO_OWNER=$$ DEMO_WORK=$WORK
cat >"$WORK/vmplacer.yaml" <<EOF
database_url: sqlite:///$WORK/vmplacer.db
data_dir: $WORK
hosts:
  - {name: host1, uri: "qemu:///system", domain_type: qemu, sampler: cpu, reserved_cpus: "1"}
  - {name: host2, uri: "qemu+tcp://127.0.0.1:16510/system", domain_type: qemu, sampler: cpu, reserved_cpus: "0"}
profiler: {t_m_ms: 10, t_sleep_s: 0.5}
EOF

driver() {
  "$BIN/python" - "$@" <<'PY'
import json, os, sys, time
import libvirt
from vmplacer.testbed import daemons, guests
from vmplacer.testbed.guest_init import PROGRESS_TAG

libvirt.registerErrorHandler(lambda _c, _e: None, None)
owner = int(os.environ["DEMO_OWNER"])
work = os.environ["DEMO_WORK"]
hosts = {"host1": daemons.HOST1_URI, "host2": daemons.HOST2_URI}
layout = [("busy-a", "spin", "host1", "0"), ("busy-b", "spin", "host1", "0"), ("quiet", "idle", "host2", "1")]
name = lambda label: guests.owned_name(f"demo-{label}", pid=owner)


def where(conns, guest):
    for host, conn in conns.items():
        try:
            dom = conn.lookupByName(guest)
        except libvirt.libvirtError:
            continue
        if dom.isActive():
            pins = dom.vcpuPinInfo(0)[0]
            return host, ",".join(str(i) for i, on in enumerate(pins) if on)
    return "-", "-"


conns = {h: libvirt.open(uri) for h, uri in hosts.items()}
command = sys.argv[1]
if command == "start":
    for label, workload, host, pin in layout:
        handle = guests.define_guest(conns[host], name(label), workload=workload, pin=pin)
        guests.start(conns[host], handle)
    for label, *_ in layout:
        guests.wait_for_progress(guests.console_path(name(label)), samples=8, timeout_s=120)
elif command == "measure":
    # All busy guests over the same window: work units per second from each console, and the
    # share of a pCPU libvirt says each vCPU got (outside load shows up there).
    busy = [label for label, workload, *_ in layout if workload != "idle"]
    placed = {label: where(conns, name(label)) for label, *_ in layout}

    def cpu_seconds(label):
        dom = conns[placed[label][0]].lookupByName(name(label))
        return sum(t[2] for t in dom.vcpus()[0]) / 1e9

    first = {label: guests.wait_for_progress(guests.console_path(name(label)))[-1] for label in busy}
    cpu0, began = {label: cpu_seconds(label) for label in busy}, time.monotonic()
    time.sleep(5.0)
    last = {label: guests.wait_for_progress(guests.console_path(name(label)), after_seq=first[label].seq)[-1]
            for label in busy}
    elapsed = time.monotonic() - began
    rates = {label: guests.rate(first[label], last[label]) for label in busy}
    shares = {label: (cpu_seconds(label) - cpu0[label]) / elapsed for label in busy}
    json.dump({"rates": rates, "shares": shares, "placed": placed}, open(f"{work}/{sys.argv[2]}.json", "w"))
elif command == "table":
    before, after = (json.load(open(f"{work}/{k}.json")) for k in ("before", "after"))
    print(f"{'guest':8} {'workload':8} {'before: host pCPU':18} {'after: host pCPU':17} "
          f"{'units/s before':>15} {'units/s after':>14} {'speed-up':>9} {'pCPU share before→after':>24}")
    for label, workload, *_ in layout:
        b, a = before["placed"][label], after["placed"][label]
        rb, ra = before["rates"].get(label), after["rates"].get(label)
        ratio = f"{ra / rb:.2f}x" if rb and ra else "-"
        share = (f"{before['shares'][label]:.2f} → {after['shares'][label]:.2f}"
                 if label in before["shares"] else "-")
        print(f"{label:8} {workload:8} {b[0] + ' ' + b[1]:18} {a[0] + ' ' + a[1]:17} "
              f"{(f'{rb:,.0f}' if rb else '-'):>15} {(f'{ra:,.0f}' if ra else '-'):>14} {ratio:>9} {share:>24}")
    got = sum(after["shares"].values())
    if got < 1.6:
        print(f"(the two busy guests got {got:.2f} pCPUs after the move, not ~2: other work on this machine "
              "took the rest — see `top`)")
elif command == "cleanup":
    for label, *_ in layout:
        for conn in conns.values():
            guests.destroy_and_undefine(conn, name(label))
        guests.console_path(name(label)).unlink(missing_ok=True)
PY
}

cleanup() {
  driver cleanup || true
  rm -rf "$WORK"
}
trap cleanup EXIT

VM=("$BIN/vmplacer" --config "$WORK/vmplacer.yaml")
SCOPE="vmpt-$$-demo-*"
echo "== starting three testbed guests, badly placed: two busy guests share host1's only pCPU,"
echo "   host2 runs just an idle guest"
driver start
driver measure before
echo
echo "== vmplacer plan --rebalance (dry run)"
"${VM[@]}" plan --rebalance --all --scope "$SCOPE"
echo
echo "== vmplacer rebalance: profile (Freeze'nSense) → learn → plan → apply, holding a lease per host"
"${VM[@]}" rebalance --all --scope "$SCOPE" --profile-seconds 3
echo
sleep 2
driver measure after
echo "== throughput from each guest's own progress counter (work units per second)"
driver table
