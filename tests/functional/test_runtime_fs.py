"""The testbed's tmpfs for libvirt's runtime directory keeps what the directory held."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support import require
from vmplacer.testbed import runtime_fs


def test_mount_and_unmount_keep_the_directory_content(tmp_path):
    require(os.geteuid() == 0, "mounting tmpfs needs root")
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    (runtime / "qemu").mkdir()
    (runtime / "qemu" / "guest.xml").write_text("<domstatus/>")
    spare = tmp_path / "spare"

    assert runtime_fs.mount_tmpfs(runtime, spare) is True
    try:
        assert runtime_fs.on_tmpfs(runtime)
        assert (runtime / "qemu" / "guest.xml").read_text() == "<domstatus/>"
        assert runtime.stat().st_mode & 0o777 == 0o700
        assert runtime_fs.mount_tmpfs(runtime, spare) is False  # already tmpfs: nothing to do
        (runtime / "qemu" / "new.xml").write_text("<domstatus id='2'/>")
    finally:
        runtime_fs.unmount_tmpfs(runtime, spare)

    assert not runtime_fs.on_tmpfs(runtime)
    assert sorted(p.name for p in (runtime / "qemu").iterdir()) == ["guest.xml", "new.xml"]
    assert list(spare.iterdir()) == []


def test_unmount_of_a_busy_tmpfs_fails_clearly_and_keeps_the_mount(tmp_path):
    require(os.geteuid() == 0, "mounting tmpfs needs root")
    runtime = tmp_path / "run"
    runtime_fs.mount_tmpfs(runtime, tmp_path / "spare")
    try:
        with (runtime / "held").open("w"):
            try:
                runtime_fs.unmount_tmpfs(runtime, tmp_path / "spare")
            except runtime_fs.RuntimeFsError as exc:
                assert str(runtime) in str(exc)
            else:
                raise AssertionError("unmounting a tmpfs with an open file should fail")
            assert runtime_fs.on_tmpfs(runtime)
    finally:
        runtime_fs.unmount_tmpfs(runtime, tmp_path / "spare")
    assert not runtime_fs.on_tmpfs(runtime)


def test_filesystem_type_picks_the_longest_mount_point():
    assert runtime_fs.filesystem_type(Path("/proc/self")) == "proc"
