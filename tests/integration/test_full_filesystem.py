# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Issue 10, faults: a real filesystem that is full (a 4 MiB ext4 image, loop-mounted, filled up)
while the collection writes the sysctl drop-in, the boot unit, an engine JSON and a launch record:
the old file stays whole, no temporary file is left, and the error says so.

Needs root and mount (it is what CI runs as); UMA_REQUIRE_TOOLS=1 turns a skip into a failure.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "unit", "harness"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "unit", "plugins", "modules"))
import harness_core as h

from ansible_collections.uma.vllm.plugins.module_utils.node.base import blockdev as _blockdev
from ansible_collections.uma.vllm.plugins.module_utils.node.base import common as _common
from ansible_collections.uma.vllm.plugins.modules import readahead_window, uma_sysctl

# tests/all.sh runs this file with no other test beside it: it reads
# loop devices and their read_ahead_kb
pytestmark = pytest.mark.alone

OLD = "old content, must survive\n" * 40


def _can_mount():
    return os.geteuid() == 0 and shutil.which("mkfs.ext4") and shutil.which("mount")


@pytest.fixture
def full_fs(tmp_path):
    if not _can_mount():
        if os.environ.get("UMA_REQUIRE_TOOLS") == "1":
            pytest.fail("needs root, mkfs.ext4 and mount (UMA_REQUIRE_TOOLS=1)")
        pytest.skip("needs root, mkfs.ext4 and mount")
    image, mnt = tmp_path / "fs.img", tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["truncate", "-s", "4M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], check=True)
    # Attaching a loop device sets its read_ahead_kb from the backing file (2560 on this
    # machine) and detaching does not put it back: the machine's value is restored after.
    before = _loop_read_ahead()
    subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
        _restore_loop_read_ahead(before)


def _loop_read_ahead():
    """read_ahead_kb of every loop device not attached now (the ones a mount may take)."""
    out = {}
    for queue in glob.glob("/sys/block/loop*/queue/read_ahead_kb"):
        dev = queue.split("/")[3]
        if not os.path.exists("/sys/block/%s/loop" % dev):
            with open(queue) as handle:
                out[queue] = handle.read().strip()
    return out


def _restore_loop_read_ahead(before):
    for queue, value in before.items():
        dev = queue.split("/")[3]
        for _attempt in range(20):  # the autoclear detach can lag the umount
            if not os.path.exists("/sys/block/%s/loop" % dev):
                break
            time.sleep(0.25)
        with open(queue) as handle:
            now = handle.read().strip()
        if now != value:
            with open(queue, "w") as handle:
                handle.write(value)


def fill(mnt):
    """Fill the filesystem to the last block (and the last inode does not matter: data fails)."""
    with open(mnt / "filler", "wb") as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
        except OSError:
            pass
    # also the last partial blocks
    n = 0
    try:
        while True:
            with open(mnt / ("small%d" % n), "wb") as small:
                small.write(b"x" * 1024)
            n += 1
    except OSError:
        pass


def leftovers(directory):
    return [n for n in os.listdir(directory) if n.endswith(".tmp")]


@pytest.mark.parametrize("what", ["engine JSON", "launch record"])
def test_json_writes_on_a_full_fs_keep_the_old_file(full_fs, what):
    target = full_fs / ("tiny.json" if what == "engine JSON" else "launch.json")
    target.write_text(json.dumps({"old": OLD}))
    before = target.read_bytes()
    fill(full_fs)
    with pytest.raises(OSError) as err:
        _common.atomic_write_json(str(target), {"new": "x" * 100000})
    assert "No space left on device" in str(err.value) and "stays as it was" in str(err.value)
    assert target.read_bytes() == before and not leftovers(full_fs)


def test_sysctl_drop_in_on_a_full_fs(full_fs, tmp_path):
    from test_harness_modules import Sysctl

    args = Sysctl().build(str(tmp_path / "node"))
    drop_in = full_fs / "90-vllm.conf"
    drop_in.write_text(OLD)
    args.update(path=str(drop_in), sysctl_dirs=[str(full_fs)], state_dir=str(full_fs / "state"), apply=False)
    os.mkdir(full_fs / "state")
    fill(full_fs)
    before = h.snapshot(str(full_fs))
    with h.patched(), h.patch_module_args(dict(args, _ansible_remote_tmp=str(tmp_path))):
        with pytest.raises(h._Exit) as done:
            uma_sysctl.main()
    assert done.value.failed
    msg = done.value.result["msg"]
    assert "No space left on device" in msg and "old file stays whole" in msg, msg
    assert h.snapshot(str(full_fs)) == before


def test_boot_unit_on_a_full_fs(full_fs, tmp_path):
    from test_harness_modules import Readahead

    target = Readahead()
    args = target.build(str(tmp_path / "node"))
    unit = full_fs / _blockdev.BOOT_UNIT
    unit.write_text(OLD)
    args.update(systemd_dir=str(full_fs))
    fill(full_fs)
    before = unit.read_bytes()
    with h.patched(target.runner(), target.extra_patches()), h.patch_module_args(
        dict(args, _ansible_remote_tmp=str(tmp_path))
    ):
        with pytest.raises(h._Exit) as done:
            readahead_window.main()
    assert done.value.failed
    msg = done.value.result["msg"]
    assert "systemd_dir" in msg and "No space left on device" in msg and "stays as it was" in msg, msg
    assert unit.read_bytes() == before and not leftovers(full_fs)
