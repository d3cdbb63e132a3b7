"""Generate `ipc_two_guests.json`: a libvirt stats sequence WITH perf counters.

The project's CI machine has no hardware performance counters, so this file is
synthesized, deterministically (seeded), in exactly the shape libvirt returns
from `getAllDomainStats(STATE | PERF | VCPU)` on a host that has them: the same
keys (`perf.cpu_cycles`, `perf.instructions` cumulative since the events were
enabled, `vcpu.N.*`, `state.*`), a 2.4 GHz core, frames every 50 ms with the
stats call taking 1-3 ms. Each guest is a 1-vCPU compute guest with IPC 1.6
alone and 1.1 next to its neighbour. The `events` list says which windows are
deliberately ragged, so tests check the sampler against the file, not against
numbers copied into the test.

    python tests/data/libvirt_stats/make_ipc.py tests/data/libvirt_stats/ipc_two_guests.json
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

HZ = 2.4e9
IPC_ALONE = 1.6
IPC_SHARED = 1.1
PERIOD_S = 0.05


def main(out: str) -> None:
    rng = random.Random(20261121)
    names = ["web-a", "batch-b"]
    counters = {n: {"instructions": 10_000_000_000, "cycles": 8_000_000_000, "time": 50_000_000_000,
                    "delay": 1_000_000_000, "id": 3 + i} for i, n in enumerate(names)}
    frames, events = [], []
    t = 500.0
    # (phase, frames): web-a's neighbour batch-b suspended in "isolated".
    plan = ["shared"] * 12 + ["isolated"] * 12 + ["shared"] * 12
    for phase in plan:
        window = PERIOD_S + rng.uniform(0.001, 0.003)
        t += window
        frame = {"started": t, "finished": t + rng.uniform(0.001, 0.003), "domains": {}}
        for name in names:
            c = counters[name]
            paused = phase == "isolated" and name == "batch-b"
            if not paused:
                share = 1.0 if phase == "isolated" else rng.uniform(0.93, 0.99)
                ipc = (IPC_ALONE if phase == "isolated" else IPC_SHARED) * rng.uniform(0.95, 1.05)
                cycles = int(HZ * window * share)
                c["cycles"] += cycles
                c["instructions"] += int(cycles * ipc)
                c["time"] += int(window * share * 1e9)
                c["delay"] += int(window * (1 - share) * 1e9)
            frame["domains"][name] = {"id": c["id"], "stats": {
                "state.state": 3 if paused else 1,
                "state.reason": 1,
                "vcpu.current": 1,
                "vcpu.maximum": 1,
                "vcpu.0.state": 1,
                "vcpu.0.time": c["time"] // 10_000_000 * 10_000_000,
                "vcpu.0.wait": 0,
                "vcpu.0.delay": c["delay"],
                "perf.cpu_cycles": c["cycles"],
                "perf.instructions": c["instructions"],
            }}
        frames.append(frame)

    def ragged(window_index: int, name: str, kind: str, change) -> None:
        """Make the window ending at frame `window_index` ragged, and shift later frames alike."""
        for frame in frames[window_index:]:
            change(frame["domains"][name]["stats"], frame["domains"][name])
        events.append({"window": window_index - 1, "guest": name, "kind": kind})

    # A virtual-PMU glitch: instructions jump by far more than the core can retire.
    ragged(5, "web-a", "outside physical bounds",
           lambda s, d: s.update({"perf.instructions": s["perf.instructions"] + 2_000_000_000}))
    # The counters were reopened (perf events disabled and enabled again): they restart near 0.
    base = frames[30]["domains"]["batch-b"]["stats"]
    c0, i0 = base["perf.cpu_cycles"] - 1_000_000, base["perf.instructions"] - 1_000_000
    ragged(30, "batch-b", "counter reset",
           lambda s, d: s.update({"perf.cpu_cycles": s["perf.cpu_cycles"] - c0,
                                  "perf.instructions": s["perf.instructions"] - i0}))
    # web-a restarted: new run id (and, after the reset window, fresh counters).
    ragged(33, "web-a", "domain restarted", lambda s, d: d.update({"id": 99}))
    Path(out).write_text(json.dumps({
        "host": "synthesized (see make_ipc.py)",
        "groups": ["state", "perf", "vcpu"],
        "guests": names,
        "ipc": {"alone": IPC_ALONE, "shared": IPC_SHARED, "jitter": 0.05},
        "phases": {"shared": [0, 12], "isolated": [12, 24], "shared_again": [24, 36]},
        "isolated_guest": "web-a",
        "ragged": events,
        "frames": frames,
    }, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
