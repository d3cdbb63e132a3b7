"""Record the libvirt stats sequence `cpu_two_spin_guests_one_pcpu.json` from a real host.

How the file in this directory was made: two 1-vCPU spin guests (`spin-a`,
`spin-b`) pinned to the same pCPU on a TCG testbed host; frames every 50 ms:
12 frames shared, 12 with `spin-b` suspended, 12 shared again, then `spin-a`
restarted (new run id, counters reset) and 6 more frames.

    python tests/data/libvirt_stats/record_cpu.py qemu:///system spin-a spin-b OUT.json RESTART_CMD...

RESTART_CMD restarts spin-a (e.g. a script that destroys and re-creates it).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import libvirt

from vmplacer.adapters.samplers.cpu import CpuShareSampler
from vmplacer.adapters.samplers.stats import LibvirtStatsReader, record_frames


def main(uri: str, first: str, second: str, out: str, *restart: str) -> None:
    conn = libvirt.open(uri)
    reader = LibvirtStatsReader(lambda: conn, CpuShareSampler.groups)
    names = [first, second]
    frames = list(record_frames(reader, names, 12, 0.05))
    conn.lookupByName(second).suspend()
    try:
        frames += record_frames(reader, names, 12, 0.05)
    finally:
        conn.lookupByName(second).resume()
    frames += record_frames(reader, names, 12, 0.05)
    subprocess.run(list(restart), check=True)
    time.sleep(1.0)
    frames += record_frames(reader, names, 6, 0.05)
    Path = __import__("pathlib").Path
    Path(out).write_text(json.dumps({
        "host": uri, "groups": list(CpuShareSampler.groups), "guests": names,
        "phases": {"shared": [0, 12], "second_suspended": [12, 24], "shared_again": [24, 36],
                   "first_restarted": [36, 42]},
        "frames": frames,
    }, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
