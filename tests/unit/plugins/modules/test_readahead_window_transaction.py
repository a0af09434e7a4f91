# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""readahead_window all or nothing (issue 10): a device whose read_ahead_kb cannot be written
midway through the live values. Before: the devices set so far stayed throttled, the record,
boot unit, programs and udev rule stayed written, the timer stayed armed; the message named
the value and the path only.

The failure is real, not mocked: between the plan and the writes the last device's
``queue/read_ahead_kb`` becomes a directory (as when a device goes away mid-run), so the real
``open(..., "w")`` fails with EISDIR. sysfs is the test tree of test_readahead_window.py.
"""

from __future__ import annotations

import json
import os
import shutil

# the node fixture (fake sysfs, fake systemd) of test_readahead_window.py
from test_readahead_window import node  # noqa: F401 # pylint: disable=unused-import

from ansible_collections.uma.vllm.plugins.modules import readahead_window

REAL_PLAN = readahead_window.plan


def snapshot(root, skip):
    """Every path under root: type, mode, bytes or link target (skip: the sabotaged file)."""
    out = {}
    for base, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(base, name)
            if path.startswith(skip):
                continue
            st = os.lstat(path)
            if os.path.islink(path):
                out[path] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                out[path] = ("dir", st.st_mode)
            else:
                with open(path, "rb") as handle:
                    out[path] = ("file", st.st_mode, handle.read())
    return out


def sabotage_after_plan(monkeypatch, node, device):  # noqa: F811
    """Let the real plan run, then turn ``device``'s read_ahead_kb into a directory."""
    real_plan = readahead_window.plan
    target = node.root / "sys" / "class" / "block" / device / "queue" / "read_ahead_kb"

    def plan(req, systemd, *args, **kwargs):
        p = real_plan(req, systemd, *args, **kwargs)
        real = os.path.realpath(target)
        os.unlink(real)
        os.mkdir(real)
        return p

    monkeypatch.setattr(readahead_window, "plan", plan)
    return os.path.realpath(target)


def test_new_window_refused_on_the_third_device_changes_nothing(run_module, node, monkeypatch):  # noqa: F811
    before = snapshot(str(node.root), skip=str(node.root / "sys" / "devices" / "virtual" / "block" / "sda" / "queue"))
    sabotage_after_plan(monkeypatch, node, "sda")
    failed, result = run_module(readahead_window, node.args(device="dm-0", persist=True))
    assert failed, result
    msg = result["msg"]
    # which device and which key failed, and that nothing stayed changed
    assert result["option"] == "read_ahead_kb"
    assert "was refused for device sda" in msg and "read_ahead_kb" in msg and "Is a directory" in msg
    assert "Nothing was changed" in msg
    assert "device dm-0 read_ahead_kb back to 128" in msg and "device nvme0n1 read_ahead_kb back to 128" in msg
    # the devices set before sda are back, every file byte for byte as it was, no directory left over
    assert (node.ra("dm-0"), node.ra("nvme0n1")) == (128, 128)
    assert (
        snapshot(str(node.root), skip=str(node.root / "sys" / "devices" / "virtual" / "block" / "sda" / "queue"))
        == before
    )
    assert not node.record.exists() and not node.boot_unit.exists() and not node.udev.exists()
    # the timer armed for the window is stopped again
    assert "uma-readahead-restore-w.timer" not in node.systemd.units


def test_changed_value_in_an_open_window_refused_midway_keeps_the_window(run_module, node, monkeypatch):  # noqa: F811
    failed, result = run_module(readahead_window, node.args(device="dm-0"))
    assert not failed and node.ra("dm-0") == 8
    record = node.record.read_bytes()
    unit = node.boot_unit.read_bytes()
    timers = dict(node.systemd.units)
    sabotage_after_plan(monkeypatch, node, "sda")
    failed, result = run_module(readahead_window, node.args(device="dm-0", read_ahead_kb=64))
    assert failed and "was refused for device sda" in result["msg"] and "Nothing was changed" in result["msg"]
    # the window as it was: its values, its record (byte for byte), its unit and its timer
    assert (node.ra("dm-0"), node.ra("nvme0n1")) == (8, 8)
    assert node.record.read_bytes() == record and node.boot_unit.read_bytes() == unit
    assert node.systemd.units == timers


def test_restore_refused_midway_keeps_the_window_to_restore_later(run_module, node, monkeypatch):  # noqa: F811
    failed, result = run_module(readahead_window, node.args(device="dm-0"))
    assert not failed
    record = node.record.read_bytes()
    timers = dict(node.systemd.units)
    sabotage_after_plan(monkeypatch, node, "sda")
    failed, result = run_module(readahead_window, node.args(state="restored"))
    assert failed and "was refused for device sda" in result["msg"] and "Nothing was changed" in result["msg"]
    # still throttled as the window says, its record and its timer still there (the timer or the
    # boot unit restores it later; a second run restores it once the device is writable)
    assert (node.ra("dm-0"), node.ra("nvme0n1")) == (8, 8)
    assert node.record.read_bytes() == record and node.systemd.units == timers
    assert json.loads(record)["devices"][0]["original_kb"] == 128
    monkeypatch.setattr(readahead_window, "plan", REAL_PLAN)
    sda = node.root / "sys" / "devices" / "virtual" / "block" / "sda" / "queue" / "read_ahead_kb"
    shutil.rmtree(sda)
    sda.write_text("8\n")
    failed, result = run_module(readahead_window, node.args(state="restored"))
    assert not failed, result
    assert (node.ra("dm-0"), node.ra("nvme0n1"), node.ra("sda")) == (128, 128, 4096)
    assert not node.record.exists()
