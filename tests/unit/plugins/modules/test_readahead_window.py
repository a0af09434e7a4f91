# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""uma.vllm.readahead_window against a fake sysfs and a fake systemd (the real one is in molecule/guard)."""

from __future__ import annotations

import json
import os

import pytest
from ansible.module_utils import basic

from ansible_collections.uma.vllm.plugins.module_utils.node.base import blockdev as _blockdev
from ansible_collections.uma.vllm.plugins.module_utils.node.base import common as _common
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError, parse_fingerprint
from ansible_collections.uma.vllm.plugins.module_utils.plumbing.node_install import module_source
from ansible_collections.uma.vllm.plugins.modules import readahead_window

PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else None
pytestmark = pytest.mark.skipif(PYTHON is None, reason="needs /usr/bin/python3 as the node's interpreter")


class FakeSystemd:
    """Just enough of systemctl/systemd-run/journalctl for the modules."""

    def __init__(self) -> None:
        self.units = {}
        self.enabled = set()
        self.calls = []
        self.system_state = "running"

    def actions(self):
        reads = ("show", "is-enabled", "is-system-running")
        return [c for c in self.calls if not (c[0].endswith("systemctl") and c[1] in reads)]

    def __call__(self, argv):
        argv = list(argv)
        self.calls.append(argv)
        tool = os.path.basename(argv[0])
        if tool == "systemctl":
            verb = argv[1]
            if verb == "is-system-running":
                return (0 if self.system_state == "running" else 1), self.system_state + "\n", ""
            if verb == "show":
                unit = self.units.get(argv[2])
                props = argv[4].split(",")
                values = unit or {"LoadState": "not-found", "ActiveState": "inactive", "SubState": "dead"}
                return 0, "".join("%s=%s\n" % (p, values.get(p, "")) for p in props), ""
            if verb == "is-enabled":
                return 0, ("enabled" if argv[2] in self.enabled else "disabled") + "\n", ""
            if verb == "enable":
                self.enabled.add(argv[-1])
                return 0, "", ""
            if verb == "stop":
                if argv[2] not in self.units:
                    return 5, "", "Unit %s not loaded." % argv[2]
                del self.units[argv[2]]
                return 0, "", ""
            if verb in ("daemon-reload", "reset-failed"):
                return 0, "", ""
        if tool == "systemd-run":
            unit = argv[argv.index("--unit") + 1]
            if any(a.startswith("--on-active=") for a in argv):
                self.units[unit + ".timer"] = {"LoadState": "loaded", "ActiveState": "active", "SubState": "waiting"}
            else:
                self.units[unit + ".service"] = {"LoadState": "loaded", "ActiveState": "active", "SubState": "running"}
            return 0, "", ""
        if tool == "journalctl":
            return 0, "", ""
        return 127, "", "unexpected command %s" % argv


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A node: fake sysfs with nvme0n1 (+p1), sda, dm-0 over nvme0n1p1 and sda; fake systemd."""
    sys_root = tmp_path / "sys"

    def device(name, dev, ra, parent=None):
        base = sys_root / "devices" / "virtual" / "block"
        path = (base / parent / name) if parent else (base / name)
        path.mkdir(parents=True)
        (path / "dev").write_text(dev + "\n")
        if parent:
            (path / "partition").write_text("1\n")
        else:
            (path / "queue").mkdir()
            (path / "queue" / "read_ahead_kb").write_text("%d\n" % ra)
        for link in (sys_root / "class" / "block" / name, sys_root / "dev" / "block" / dev):
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(path)
        return path

    device("nvme0n1", "259:0", 128)
    device("nvme0n1p1", "259:1", 0, parent="nvme0n1")
    device("sda", "8:0", 4096)
    dm = device("dm-0", "253:0", 128)
    (dm / "slaves").mkdir()
    (dm / "slaves" / "nvme0n1p1").symlink_to(sys_root / "class" / "block" / "nvme0n1p1")
    (dm / "slaves" / "sda").symlink_to(sys_root / "class" / "block" / "sda")

    fake = FakeSystemd()
    monkeypatch.setattr(basic.AnsibleModule, "run_command", lambda self, args, **kw: fake(args))
    monkeypatch.setattr(basic.AnsibleModule, "get_bin_path", lambda self, name, *a, **kw: "/usr/bin/" + name)
    monkeypatch.setattr(_blockdev, "page_kb", lambda: 4)

    class Node:
        systemd = fake
        root = tmp_path

        @staticmethod
        def ra(name):
            return int((sys_root / "class" / "block" / name / "queue" / "read_ahead_kb").read_text())

        @staticmethod
        def args(**kw):
            base = dict(
                name="w",
                python=PYTHON,
                lib_dir=str(tmp_path / "lib"),
                state_dir=str(tmp_path / "state"),
                systemd_dir=str(tmp_path / "systemd"),
                udev_rules_dir=str(tmp_path / "udev"),
                sysfs_root=str(sys_root),
                proc_root=str(tmp_path / "proc"),
            )
            base.update(kw)
            return base

        record = tmp_path / "state" / "readahead-w.json"
        boot_unit = tmp_path / "systemd" / "uma-readahead-restore.service"
        udev = tmp_path / "udev" / "60-uma-vllm-readahead.rules"

    return Node


def test_throttle_by_device_opens_a_window(run_module, node):
    failed, result = run_module(readahead_window, node.args(device="/dev/nvme0n1p1"))
    assert not failed, result
    assert result["changed"]
    assert node.ra("nvme0n1") == 8
    assert result["devices"] == [
        {"device": "nvme0n1", "dev": "259:0", "role": "disk", "original_kb": 128, "before_kb": 128, "after_kb": 8}
    ]
    record = json.loads(node.record.read_text())
    assert record["devices"] == [{"device": "nvme0n1", "dev": "259:0", "original_kb": 128}]
    assert record["ends_at"] - record["opened_at"] == 180
    assert result["window"]["open"] and result["window"]["timer"] == "uma-readahead-restore-w.timer"
    # the node's timer, armed before the live value changed
    run = next(c for c in node.systemd.calls if c[0].endswith("systemd-run"))
    assert "--on-active=180s" in run and "--timer-property=AccuracySec=1s" in run
    assert run[run.index("--unit") + 1] == "uma-readahead-restore-w"
    tail = run[run.index(PYTHON) :]
    lib, sys_root = str(node.root / "lib"), str(node.root / "sys")
    assert tail == [
        PYTHON,
        lib + "/uma_readahead.py",
        "restore",
        "--record",
        str(node.record),
        "--sysfs-root",
        sys_root,
    ]
    # the restorer's package is installed from the collection's source, with its entry script
    assert (node.root / "lib" / "uma_vllm_node" / "base" / "blockdev.py").read_text() == module_source(_blockdev)
    assert (node.root / "lib" / "uma_vllm_node" / "base" / "common.py").read_text() == module_source(_common)
    assert oct(os.stat(node.root / "lib" / "uma_readahead.py").st_mode & 0o777) == "0o644"
    # the boot unit, enabled
    unit = node.boot_unit.read_text()
    assert parse_fingerprint(unit)["intact"] and "restore --all --state-dir %s" % (node.root / "state") in unit
    assert "uma-readahead-restore.service" in node.systemd.enabled
    verbs = [c[1] if c[0].endswith("systemctl") else "systemd-run" for c in node.systemd.actions()]
    assert verbs[:2] == ["daemon-reload", "enable"] and "systemd-run" in verbs
    assert not node.udev.exists()


def test_second_run_in_open_window_changes_nothing_and_keeps_the_original(run_module, node):
    run_module(readahead_window, node.args(device="nvme0n1"))
    before = node.record.read_text()
    node.systemd.calls.clear()
    failed, result = run_module(readahead_window, node.args(device="nvme0n1"))
    assert not failed and not result["changed"], result
    assert node.record.read_text() == before
    assert result["devices"][0]["original_kb"] == 128 and result["devices"][0]["before_kb"] == 8
    assert node.systemd.actions() == []


def test_new_value_in_open_window_keeps_first_original_and_end(run_module, node):
    run_module(readahead_window, node.args(device="nvme0n1"))
    first = json.loads(node.record.read_text())
    failed, result = run_module(readahead_window, node.args(device="nvme0n1", read_ahead_kb=16, duration=999))
    assert not failed and result["changed"]
    assert node.ra("nvme0n1") == 16
    record = json.loads(node.record.read_text())
    assert record["devices"] == first["devices"] and record["ends_at"] == first["ends_at"]
    assert record["read_ahead_kb"] == 16
    assert len([c for c in node.systemd.calls if c[0].endswith("systemd-run")]) == 1


def test_expired_timer_with_record_left_keeps_original(run_module, node):
    """The timer is gone but the record stayed (e.g. its restore failed): never record 8 as the original."""
    run_module(readahead_window, node.args(device="nvme0n1"))
    node.systemd.units.clear()  # timer gone, device still throttled
    failed, result = run_module(readahead_window, node.args(device="nvme0n1"))
    assert not failed and result["changed"]
    assert json.loads(node.record.read_text())["devices"][0]["original_kb"] == 128
    assert len([c for c in node.systemd.calls if c[0].endswith("systemd-run")]) == 2


def test_check_mode_touches_nothing(run_module, node):
    failed, result = run_module(readahead_window, node.args(device="dm-0"), check_mode=True, diff=True)
    assert not failed and result["changed"]
    assert [d["after_kb"] for d in result["devices"]] == [8, 8, 8]
    assert node.ra("dm-0") == 128 and node.ra("sda") == 4096
    assert not node.record.exists() and not node.boot_unit.exists() and not (node.root / "lib").exists()
    assert node.systemd.actions() == []
    headers = [d["before_header"] for d in result["diff"]]
    assert headers[:3] == ["live values", "timer", str(node.record)]
    assert str(node.boot_unit) in headers and "node programs" in headers
    assert "sda read_ahead_kb = 4096" in result["diff"][0]["before"]
    assert "sda read_ahead_kb = 8" in result["diff"][0]["after"]


def test_restored_puts_back_stops_timer_and_deletes_record(run_module, node):
    run_module(readahead_window, node.args(device="dm-0", persist=True))
    assert node.ra("sda") == 8
    failed, result = run_module(readahead_window, node.args(state="restored"), diff=True)
    assert not failed and result["changed"], result
    assert (node.ra("dm-0"), node.ra("nvme0n1"), node.ra("sda")) == (128, 128, 4096)
    assert not node.record.exists()
    assert "uma-readahead-restore-w.timer" not in node.systemd.units
    assert result["window"]["open"] is False and result["record"] is None
    assert result["restored"]["skipped"] == []
    assert "(absent)" not in result["diff"][2]["before"]
    # again: nothing left to do
    failed, result = run_module(readahead_window, node.args(state="restored"))
    assert not failed and not result["changed"]


def test_restored_skips_device_whose_name_moved(run_module, node):
    run_module(readahead_window, node.args(device="sda"))
    record = json.loads(node.record.read_text())
    record["devices"][0]["dev"] = "8:16"
    node.record.write_text(json.dumps(record))
    failed, result = run_module(readahead_window, node.args(state="restored"))
    assert not failed
    assert result["restored"]["skipped"][0]["device"] == "sda"
    assert node.ra("sda") == 8  # not another disk's value
    assert not node.record.exists()


def test_persist_writes_steady_state_rule_and_keeps_other_entries(run_module, node):
    node.udev.parent.mkdir()
    node.udev.write_text(_blockdev.render_udev_rules({"vdb": 512}))
    failed, result = run_module(readahead_window, node.args(device="dm-0", persist=True))
    assert not failed
    assert _blockdev.parse_udev_rules(node.udev.read_text()) == {"vdb": 512, "dm-0": 128, "nvme0n1": 128, "sda": 4096}
    assert result["udev_rules"]["changed"]
    failed, result = run_module(readahead_window, node.args(device="dm-0", persist=True))
    assert not failed and not result["changed"] and not result["udev_rules"]["changed"]


def test_page_rounding_warns_and_is_idempotent(node):
    req = readahead_window.WindowRequest(**node.args(device="sda", read_ahead_kb=8))
    from ansible_collections.uma.vllm.plugins.module_utils.node.base.systemd import Systemd

    systemd = Systemd(node.systemd)
    p = readahead_window.plan(req, systemd, now=0, page=64)
    assert p.live_after == {"sda": 0}
    assert any("kept as 0" in w for w in p.warnings)
    readahead_window.execute(p, systemd)
    assert node.ra("sda") == 0
    again = readahead_window.plan(req, systemd, now=5, page=64)
    assert not again.changed


def test_boot_unit_drift_is_repaired(run_module, node):
    run_module(readahead_window, node.args(device="sda"))
    node.boot_unit.write_text(node.boot_unit.read_text().replace("multi-user", "graphical"))
    node.systemd.enabled.clear()
    failed, result = run_module(readahead_window, node.args(device="sda"))
    assert not failed and result["changed"] and result["boot_unit"]["changed"]
    assert "multi-user.target" in node.boot_unit.read_text()
    assert "uma-readahead-restore.service" in node.systemd.enabled


@pytest.mark.parametrize(
    "args, option, problem",
    [
        (dict(path="/x", device="sda"), None, "mutually exclusive"),
        (dict(), "path", "is required (or device)"),
        (dict(path="/nonexistent/models"), "path", "does not exist on the node"),
        (dict(path="models"), "path", "is not an absolute path"),
        (dict(device="nvme9n9"), "device", "is not a block device on the node"),
        (dict(device="sda", read_ahead_kb=-1), "read_ahead_kb", "below the minimum 0"),
        (dict(device="sda", read_ahead_kb=4294967296), "read_ahead_kb", "above the maximum 4294967295"),
        (dict(device="sda", read_ahead_kb="lots"), "read_ahead_kb", "is not an integer"),
        (dict(device="sda", read_ahead_kb=True), "read_ahead_kb", "is a boolean"),
        (dict(device="sda", duration=0), "duration", "below the minimum 1"),
        (dict(device="sda", duration=86401), "duration", "above the maximum 86400"),
        (dict(device="sda", duration="3m"), "duration", "is not an integer"),
        (dict(device="sda", name="../etc"), "name", "safe unit-name fragment"),
        (dict(device="sda", name="a b"), "name", "safe unit-name fragment"),
        (dict(device="sda", lib_dir="/opt/my lib"), "lib_dir", "is not an absolute path made of"),
        (dict(device="sda", python="/nonexistent/python3"), "python", "is not an executable"),
        (dict(device="sda", state="open"), None, "value of state must be one of"),
    ],
)
def test_bad_options_fail_cleanly_and_touch_nothing(run_module, node, args, option, problem):
    failed, result = run_module(readahead_window, node.args(**args))
    assert failed
    assert problem in result["msg"]
    if option:
        assert result["msg"].startswith("option '%s' = " % option)
        assert result["option"] == option
    assert node.ra("sda") == 4096 and node.ra("nvme0n1") == 128
    assert not node.record.exists() and not (node.root / "lib").exists()
    assert node.systemd.actions() == []


def test_no_systemd_is_refused(run_module, node):
    node.systemd.system_state = "offline"
    failed, result = run_module(readahead_window, node.args(device="sda"))
    assert failed and "needs a running systemd" in result["msg"]
    assert node.ra("sda") == 4096


def test_unreadable_record_is_refused(run_module, node):
    node.record.parent.mkdir()
    node.record.write_text("{oops")
    failed, result = run_module(readahead_window, node.args(device="sda"))
    assert failed and result["option"] == "state_dir"
    assert "holds a damaged readahead record: %s is not valid JSON, truncated or damaged" % node.record in result["msg"]
    assert node.record.read_text() == "{oops" and node.ra("sda") == 4096


# Issue 36 item 4: an open window's record whose entry cannot be read held the device's original all
# the same. Before, such an entry was dropped in silence: state=restored put nothing back and deleted
# the record (the operator's 4096 gone, the device left at the window's 8), and a new window recorded 8
# as the original. Now: refused naming the file, the field, its value and the fix; nothing changes.
@pytest.mark.parametrize(
    "damage, problem",
    [
        (lambda r: r["devices"][0].update(original_kb="4096"), 'has devices[0].original_kb = "4096" (device sda), not'),
        (lambda r: r["devices"][0].update(original_kb=True), "has devices[0].original_kb = true (device sda)"),
        (lambda r: r["devices"][0].update(original_kb=-1), "has devices[0].original_kb = -1 (device sda)"),
        (lambda r: r["devices"][0].update(original_kb=2**40), "has devices[0].original_kb = 1099511627776"),
        (lambda r: r["devices"][0].pop("original_kb"), "has devices[0].original_kb = null (device sda)"),
        (lambda r: r["devices"][0].update(device="../sda"), 'has devices[0].device = "../sda", not a block device'),
        (lambda r: r["devices"][0].update(dev="sda"), 'has devices[0].dev = "sda", not a device number'),
        (lambda r: r["devices"].append("junk"), 'has devices[1] = "junk", not an object'),
        (lambda r: r.update(devices={"sda": 4096}), "has no device list"),
        (lambda r: r.update(ends_at="soon"), 'has ends_at = "soon", not a whole number'),
    ],
)
@pytest.mark.parametrize("state", ["restored", "throttled"])
@pytest.mark.parametrize("check_mode", [False, True])
def test_a_damaged_record_entry_is_refused_never_dropped(run_module, node, damage, problem, state, check_mode):
    failed, _result = run_module(readahead_window, node.args(device="sda"))
    assert not failed and node.ra("sda") == 8
    record = json.loads(node.record.read_text())
    damage(record)
    node.record.write_text(json.dumps(record))
    written = node.record.read_text()
    node.systemd.calls.clear()
    args = node.args(state="restored") if state == "restored" else node.args(device="sda", read_ahead_kb=16)
    failed, result = run_module(readahead_window, args, check_mode=check_mode)
    assert failed, result
    assert result["option"] == "state_dir"
    assert "holds a damaged readahead record: %s %s" % (node.record, problem) in result["msg"]
    assert "it is not taken for no record, and nothing was changed" in result["msg"]
    assert '"original_kb": <original>' in result["msg"]  # the fix shows the shape it must have
    assert node.record.read_text() == written
    assert node.ra("sda") == 8
    assert node.systemd.actions() == []


@pytest.mark.parametrize(
    "content, problem",
    [(b"", "is empty"), (b"\xff\xfe", "is not UTF-8 (byte 0)"), (b"[1]", "holds a JSON list, not a JSON object")],
)
def test_a_record_that_is_not_text_is_refused_naming_why(run_module, node, content, problem):
    node.record.parent.mkdir()
    node.record.write_bytes(content)
    failed, result = run_module(readahead_window, node.args(state="restored"))
    assert failed and "holds a damaged readahead record: %s %s." % (node.record, problem) in result["msg"]
    assert node.record.read_bytes() == content


def test_failing_systemd_run_fails_cleanly_and_changes_nothing(run_module, node, monkeypatch):
    real = node.systemd.__call__

    def broken(argv):
        if argv[0].endswith("systemd-run"):
            return 1, "", "Failed to start transient timer unit: Unit uma-readahead-restore-w.timer already exists."
        return real(argv)

    monkeypatch.setattr(basic.AnsibleModule, "run_command", lambda self, args, **kw: broken(args))
    failed, result = run_module(readahead_window, node.args(device="sda"))
    assert failed and "already exists" in result["msg"]
    assert node.ra("sda") == 4096  # not throttled without a timer
    # all or nothing (issue 10): the record, the boot unit and the programs written before are gone again
    assert "Nothing was changed" in result["msg"]
    assert not node.record.exists() and not node.boot_unit.exists() and not (node.root / "lib").exists()


def test_validate_is_pure():
    with pytest.raises(UmaError):
        readahead_window.validate(readahead_window.WindowRequest(state="throttled"))
