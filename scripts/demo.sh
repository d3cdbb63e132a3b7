#!/usr/bin/env bash
# The vmplacer demo: a dry run on an example host, then — where QEMU and libvirt are available —
# real guests badly placed on the two-host testbed, one `vmplacer rebalance`, and each guest's
# throughput before and after, read from the guests' own progress counters.
#
# The testbed's two hosts are one machine: host1 may use pCPU 0 only and host2 pCPU 1 only
# (reserved_cpus in the demo's config), so they behave like two one-pCPU machines. Two busy guests
# share host1's pCPU, host2 runs only an idle guest: the rebalancer live-migrates one busy guest
# to host2 and both run about twice as fast. Then protection in place: a latency-critical guest
# and a batch guest share host1's pCPU; `vmplacer protect` throttles the batch guest (libvirt CPU
# bandwidth) until the latency-critical one holds its floor. Takes about two minutes; cleans up
# after itself. It ends by printing where `vmplacer serve` would show the web view (no server is
# left running).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
DEMO_HOST=${DEMO_HOST:-examples/hosts/xeon-2s-56c-smt2.xml}
DEMO_REQUEST=${DEMO_REQUEST:-examples/requests/mixed.yaml}

# Where the read-only web view would be: api.listen of the config given (the default config without one).
web_view() {
  local listen
  listen=$("$BIN/vmplacer" "$@" config show --format json |
    "$BIN/python" -c 'import json, sys; print(json.load(sys.stdin)["api"]["listen"])')
  echo
  echo "== web view: \`vmplacer$([[ $# -gt 0 ]] && printf ' %s' "$@") serve\` would show the fleet and each host's"
  echo "   pCPU map at http://$listen/ui/ (sign in with a token: \`vmplacer token create NAME --scope read\`;"
  echo "   over TLS as docs/operations.md, \"Web view\", says). No server was started."
}

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
  web_view
  exit 0
fi
if ! bash scripts/testbed.sh up || ! bash scripts/testbed.sh image; then
  echo "== live rebalancing demo skipped: the libvirt testbed could not be brought up (see above)"
  web_view
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
protect: {step: 0.15}
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
# Protection in place: vmplacer's metadata labels, as placing them through vmplacer would write them.
protect_layout = [("lc", "latency-critical", {"vmplacer.protect": "0.8"}),
                  ("batch", "batch", {"vmplacer.min_cpu_share": "0.1"})]
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
elif command == "protect-start":
    from vmplacer.adapters.domain_xml_fields import NAMESPACE

    for label, *_ in layout:  # the first part's guests leave the stage
        for conn in conns.values():
            guests.destroy_and_undefine(conn, name(label))
    for label, workload_class, labels in protect_layout:
        handle = guests.define_guest(conns["host1"], name(label), workload="spin", pin="0")
        items = "".join(f'<label name="{k}">{v}</label>' for k, v in labels.items())
        conns["host1"].lookupByName(handle.name).setMetadata(
            libvirt.VIR_DOMAIN_METADATA_ELEMENT,
            f'<placement xmlns="{NAMESPACE}" version="1"><workload_class>{workload_class}</workload_class>'
            f'<labels>{items}</labels></placement>', "vmplacer", NAMESPACE, libvirt.VIR_DOMAIN_AFFECT_CONFIG)
        guests.start(conns["host1"], handle)
    for label, *_ in protect_layout:
        guests.wait_for_progress(guests.console_path(name(label)), samples=8, timeout_s=120)
elif command == "protect-measure":
    # The latency-critical guest's rate with the batch guest running, over its rate with the batch
    # guest suspended (its isolated rate), from its own counter; and the batch guest's rate.
    lc, batch = guests.console_path(name("lc")), guests.console_path(name("batch"))
    batch_dom = conns["host1"].lookupByName(name("batch"))
    shared, batch_rate = [], []
    alone = []
    for _ in range(3):
        first_b = guests.wait_for_progress(batch)[-1]
        shared.append(guests.progress_rate(lc, 1.0))
        batch_rate.append(guests.rate(first_b, guests.wait_for_progress(batch, after_seq=first_b.seq)[-1]))
        batch_dom.suspend()
        try:
            time.sleep(0.05)
            alone.append(guests.progress_rate(lc, 1.0))
        finally:
            batch_dom.resume()
        time.sleep(0.2)
    med = lambda xs: sorted(xs)[len(xs) // 2]
    json.dump({"shared": med(shared), "alone": med(alone), "batch": med(batch_rate)},
              open(f"{work}/{sys.argv[2]}.json", "w"))
elif command == "protect-table":
    before, after = (json.load(open(f"{work}/protect-{k}.json")) for k in ("before", "after"))
    share = conns["host1"].lookupByName(name("batch")).schedulerParameters()
    quota = share.get("vcpu_quota", -1)
    print(f"{'':28} {'before protect':>15} {'after protect':>14}")
    print(f"{'lc: units/s among batch':28} {before['shared']:>15,.0f} {after['shared']:>14,.0f}")
    print(f"{'lc: units/s alone':28} {before['alone']:>15,.0f} {after['alone']:>14,.0f}")
    print(f"{'lc: shared / alone':28} {before['shared'] / before['alone']:>15.2f} {after['shared'] / after['alone']:>14.2f}"
          "   (floor 0.80)")
    print(f"{'batch: units/s':28} {before['batch']:>15,.0f} {after['batch']:>14,.0f}"
          f"   (vcpu_quota now {quota} µs per 100000 µs; minimum share 0.10)")
elif command == "cleanup":
    for label in [label for label, *_ in layout] + [label for label, *_ in protect_layout]:
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
"${VM[@]}" plan --rebalance --all-hosts --scope "$SCOPE"
echo
echo "== vmplacer rebalance: profile (Freeze'nSense) → learn → plan → apply, holding a lease per host"
"${VM[@]}" rebalance --all-hosts --scope "$SCOPE" --profile-seconds 3
echo
sleep 2
driver measure after
echo "== throughput from each guest's own progress counter (work units per second)"
driver table
echo
echo "== protection in place: a latency-critical guest (vmplacer.protect 0.8) and a batch guest"
echo "   (vmplacer.min_cpu_share 0.1) share host1's pCPU"
driver protect-start
driver protect-measure protect-before
echo "== vmplacer protect run --host host1: Freeze'nSense → who hurts it (model) → throttle one step, each round"
"${VM[@]}" protect run --host host1 --scope "$SCOPE" --rounds 10 --interval 1s --samples 5 --tm 50ms || true
sleep 1
driver protect-measure protect-after
echo "== the latency-critical guest's own counter, before and after (work units per second)"
driver protect-table
web_view --config "$WORK/vmplacer.yaml"
