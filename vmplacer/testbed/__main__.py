"""`python -m vmplacer.testbed up|down|image|status|clean`."""

from __future__ import annotations

import argparse
import grp
import stat
import sys
from pathlib import Path

from vmplacer.testbed.daemons import (
    HOST1_URI,
    HOST2_URI,
    KVM_KEY,
    TestbedError,
    answers,
    down,
    recorded,
    status,
    up,
)
from vmplacer.testbed.image import ImageError, build_image
from vmplacer.testbed.paths import StateDirs


def _cmd_up(_args: argparse.Namespace) -> int:
    result = up()
    for key in result.started:
        print(f"started  {key}")
    for key in result.already_running:
        print(f"running  {key} (already)")
    print(f"host1 {HOST1_URI}\nhost2 {HOST2_URI}\nup in {result.seconds:.1f} s")
    return 0


def _cmd_down(_args: argparse.Namespace) -> int:
    result = down()
    for key in result.stopped:
        print(f"stopped  {key}")
    for key, why in result.left_running.items():
        print(f"left     {key}: {why}")
    if not result.stopped and not result.left_running:
        print("nothing the testbed started is running")
    return 0


def _cmd_image(args: argparse.Namespace) -> int:
    image = build_image(force=args.force)
    state = "built" if image.built else "cached"
    print(f"{state} in {image.seconds:.1f} s ({image.kernel_package}, inputs {image.inputs_hash[:12]})")
    print(f"kernel {image.kernel}\ninitrd {image.initrd}")
    return 0


def _cmd_status(_args: argparse.Namespace) -> int:
    for row in status():
        pid = row["pid"] or "-"
        who = "testbed" if row["started_by_testbed"] else "other"
        line = f"{row['daemon']:<15} pid {pid!s:<8} started by {who:<8}"
        if "answers" in row:
            line += f" {'answers' if row['answers'] else 'DOES NOT ANSWER'} on {row['uri']}"
        print(line)
    dirs = StateDirs.default()
    kvm = Path("/dev/kvm")
    if kvm.exists():
        st = kvm.stat()
        changed = " (set by the testbed; `down` restores it)" if KVM_KEY in recorded(dirs) else ""
        print(f"/dev/kvm        {grp.getgrgid(st.st_gid).gr_name} {stat.S_IMODE(st.st_mode):04o}{changed}")
    image = dirs.image_dir / "initrd.img"
    print(f"image           {'present' if image.exists() else 'not built'} in {dirs.image_dir}")
    return 0


def _cmd_clean(args: argparse.Namespace) -> int:
    import libvirt

    from vmplacer.testbed.guests import cleanup_guests, cleanup_orphans, prune_consoles

    for uri in (HOST1_URI, HOST2_URI):
        if answers(uri):
            conn = libvirt.open(uri)
            try:
                removed = cleanup_guests(conn) if args.all else cleanup_orphans(conn)
            finally:
                conn.close()
            print(f"{uri}: removed {', '.join(removed) or 'nothing'}")
    print(f"deleted {len(prune_consoles())} console files of guests whose owner has exited")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vmplacer.testbed",
                                     description="Two real libvirt hosts on this machine, for tests and demos.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("up", help="start host1 and host2 daemons (only what is not running)")
    commands.add_parser("down", help="stop only the daemons `up` started")
    image = commands.add_parser("image", help="build the guest kernel + initramfs (cached)")
    image.add_argument("--force", action="store_true", help="rebuild even if the inputs did not change")
    commands.add_parser("status", help="show what runs")
    clean = commands.add_parser("clean", help="remove leftover testbed guests (vmpt-*) on both hosts")
    clean.add_argument("--all", action="store_true", help="also guests of test runs still running")
    args = parser.parse_args(argv)
    handler = {"up": _cmd_up, "down": _cmd_down, "image": _cmd_image, "status": _cmd_status,
               "clean": _cmd_clean}[args.command]
    try:
        return handler(args)
    except (TestbedError, ImageError) as exc:
        print(f"testbed {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
