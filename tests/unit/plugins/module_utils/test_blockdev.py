# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Unit tests of _blockdev: device resolution on fake sysfs trees, records, restore, rendered files."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.base import blockdev as _blockdev
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError, parse_fingerprint

# ---------------------------------------------------------------------------------------------
# A fake sysfs: /devices/... holds the device directories, /dev/block/MAJ:MIN and
# /class/block/NAME are symbolic links to them, like the kernel's.


class FakeSysfs:
    def __init__(self, root: str) -> None:
        self.root = root
        self.dirs = {}

    def _link(self, link: str, target: str) -> None:
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(os.path.relpath(target, os.path.dirname(link)), link)

    def _register(self, name: str, path: str, dev: str) -> None:
        with open(os.path.join(path, "dev"), "w", encoding="ascii") as handle:
            handle.write(dev + "\n")
        self._link(os.path.join(self.root, "dev", "block", dev), path)
        self._link(os.path.join(self.root, "class", "block", name), path)
        self.dirs[name] = path

    def disk(self, name: str, dev: str, ra: int = 128, bus: str = "pci0000:00/0000:00:01.0") -> str:
        path = os.path.join(self.root, "devices", bus, "block", name)
        os.makedirs(os.path.join(path, "queue"))
        with open(os.path.join(path, "queue", "read_ahead_kb"), "w", encoding="ascii") as handle:
            handle.write("%d\n" % ra)
        self._register(name, path, dev)
        return path

    def partition(self, disk: str, name: str, dev: str) -> str:
        path = os.path.join(self.dirs[disk], name)
        os.makedirs(path)
        with open(os.path.join(path, "partition"), "w", encoding="ascii") as handle:
            handle.write("1\n")
        self._register(name, path, dev)
        return path

    def holder(self, name: str, dev: str, slaves, ra: int = 128) -> str:
        path = self.disk(name, dev, ra, bus="virtual")
        os.makedirs(os.path.join(path, "slaves"))
        for slave in slaves:
            self._link(os.path.join(path, "slaves", slave), self.dirs[slave])
        return path

    def ra(self, name: str) -> int:
        with open(os.path.join(self.dirs[name], "queue", "read_ahead_kb"), encoding="ascii") as handle:
            return int(handle.read())


@pytest.fixture
def sysfs(tmp_path):
    fake = FakeSysfs(str(tmp_path / "sys"))
    fake.disk("nvme0n1", "259:0")
    fake.partition("nvme0n1", "nvme0n1p1", "259:1")
    fake.partition("nvme0n1", "nvme0n1p2", "259:2")
    fake.disk("sda", "8:0", ra=256)
    fake.partition("sda", "sda1", "8:1")
    fake.disk("sdb", "8:16")
    fake.disk("sdc", "8:32")
    fake.disk("vda", "254:0", ra=8192)
    fake.partition("vda", "vda1", "254:1")
    fake.disk("mmcblk0", "179:0", ra=512)
    fake.partition("mmcblk0", "mmcblk0p2", "179:2")
    fake.disk("loop3", "7:3", bus="virtual")
    fake.holder("dm-0", "253:0", ["nvme0n1p2", "sda1"])
    fake.holder("md0", "9:0", ["sdb", "sdc"])
    fake.holder("dm-1", "253:1", ["md0"])  # LVM on md RAID
    return fake


def names(devices):
    return [(d.name, d.role) for d in devices]


# -- resolution ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "device, expected",
    [
        ("nvme0n1", [("nvme0n1", "disk")]),
        ("/dev/nvme0n1p1", [("nvme0n1", "disk")]),
        ("nvme0n1p2", [("nvme0n1", "disk")]),
        ("sda1", [("sda", "disk")]),
        ("vda1", [("vda", "disk")]),
        ("mmcblk0p2", [("mmcblk0", "disk")]),
        ("loop3", [("loop3", "disk")]),
        ("dm-0", [("dm-0", "holder"), ("nvme0n1", "disk"), ("sda", "disk")]),
        ("md0", [("md0", "holder"), ("sdb", "disk"), ("sdc", "disk")]),
        ("dm-1", [("dm-1", "holder"), ("md0", "holder"), ("sdb", "disk"), ("sdc", "disk")]),
    ],
)
def test_resolve_device(sysfs, device, expected):
    assert names(_blockdev.resolve_device(device, sysfs.root)) == expected


def test_resolve_device_reports_dev_numbers(sysfs):
    devices = _blockdev.resolve_device("dm-0", sysfs.root)
    assert [d.dev for d in devices] == ["253:0", "259:0", "8:0"]
    assert devices[1].ra_path.endswith("nvme0n1/queue/read_ahead_kb")


@pytest.mark.parametrize(
    "device, problem",
    [
        ("nope0", "is not a block device on the node"),
        ("/dev/nope0", "is not a block device on the node"),
        ("../../etc", "is not a block device name"),
        ("", "is empty"),
        ("  ", "is empty"),
    ],
)
def test_resolve_device_refuses(sysfs, device, problem):
    with pytest.raises(UmaError) as info:
        _blockdev.resolve_device(device, sysfs.root)
    assert info.value.option == "device"
    assert problem in info.value.message


def _fake_stat(monkeypatch, target: str, st_dev: int):
    real_stat = os.stat

    def fake(path, *args, **kwargs):
        if os.fspath(path) == target:
            return SimpleNamespace(st_dev=st_dev, st_rdev=0, st_mode=0o40755)
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(_blockdev.os, "stat", fake)


@pytest.mark.parametrize(
    "devnum, expected",
    [
        ((259, 1), [("nvme0n1", "disk")]),
        ((8, 1), [("sda", "disk")]),
        ((253, 0), [("dm-0", "holder"), ("nvme0n1", "disk"), ("sda", "disk")]),
        ((7, 3), [("loop3", "disk")]),
    ],
)
def test_resolve_path_by_st_dev(sysfs, tmp_path, monkeypatch, devnum, expected):
    model = tmp_path / "models"
    model.mkdir()
    _fake_stat(monkeypatch, str(model), os.makedev(*devnum))
    assert names(_blockdev.resolve_path(str(model), sysfs.root, str(tmp_path / "proc"))) == expected


def _mountinfo(tmp_path, lines):
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mountinfo").write_text("\n".join(lines) + "\n")
    return str(proc)


def test_resolve_path_btrfs_uses_mount_source(sysfs, tmp_path, monkeypatch):
    model = tmp_path / "models"
    model.mkdir()
    _fake_stat(monkeypatch, str(model), os.makedev(0, 45))
    proc = _mountinfo(
        tmp_path,
        [
            "22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/vda1 rw",
            "45 22 0:45 /@models %s rw,relatime shared:9 - btrfs /dev/nvme0n1p2 rw,space_cache=v2" % model,
        ],
    )
    assert names(_blockdev.resolve_path(str(model), sysfs.root, proc)) == [("nvme0n1", "disk")]


@pytest.mark.parametrize("fstype, source", [("overlay", "overlay"), ("tmpfs", "tmpfs"), ("nfs4", "srv:/export")])
def test_resolve_path_without_block_device_is_refused(sysfs, tmp_path, monkeypatch, fstype, source):
    model = tmp_path / "models"
    model.mkdir()
    _fake_stat(monkeypatch, str(model), os.makedev(0, 77))
    proc = _mountinfo(tmp_path, ["77 1 0:77 / / rw - %s %s rw" % (fstype, source)])
    with pytest.raises(UmaError) as info:
        _blockdev.resolve_path(str(model), sysfs.root, proc)
    assert info.value.option == "path"
    assert "without a block device of its own (%s on /)" % fstype in info.value.message
    assert "device=" in info.value.fix


def test_resolve_path_unknown_devnum(sysfs, tmp_path, monkeypatch):
    model = tmp_path / "m"
    model.mkdir()
    _fake_stat(monkeypatch, str(model), os.makedev(65, 3))
    with pytest.raises(UmaError, match="lies on block device 65:3"):
        _blockdev.resolve_path(str(model), sysfs.root)


@pytest.mark.parametrize(
    "path, problem", [("relative/dir", "is not an absolute path"), ("/nonexistent/x", "does not exist")]
)
def test_resolve_path_refuses(sysfs, path, problem):
    with pytest.raises(UmaError) as info:
        _blockdev.resolve_path(path, sysfs.root)
    assert info.value.option == "path"
    assert problem in info.value.message


def test_mount_of_unescapes_and_prefers_devnum(tmp_path):
    proc = _mountinfo(
        tmp_path,
        [
            "22 1 8:1 / / rw - ext4 /dev/sda1 rw",
            r"30 22 259:2 / /mnt/my\040models rw - xfs /dev/nvme0n1p2 rw",
        ],
    )
    assert _blockdev.mount_of(os.makedev(259, 2), "/elsewhere", proc) == ("/mnt/my models", "xfs", "/dev/nvme0n1p2")
    assert _blockdev.mount_of(os.makedev(1, 1), "/mnt/my models/x", proc)[0] == "/mnt/my models"
    assert _blockdev.mount_of(os.makedev(1, 1), "/x", str(tmp_path / "none")) is None


# -- values -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kb, page, expected", [(8, 4, 8), (5, 4, 4), (8, 64, 0), (128, 64, 128), (0, 4, 0), (100, 64, 64)]
)
def test_effective_kb(kb, page, expected):
    assert _blockdev.effective_kb(kb, page) == expected


def test_read_and_write_ra(sysfs):
    dev = _blockdev.resolve_device("sda", sysfs.root)[0]
    assert _blockdev.read_ra(dev) == 256
    _blockdev.write_ra(dev.ra_path, 8)
    assert sysfs.ra("sda") == 8


def test_write_ra_failure_is_a_uma_error(tmp_path):
    with pytest.raises(UmaError) as info:
        _blockdev.write_ra(str(tmp_path / "missing" / "read_ahead_kb"), 8)
    assert info.value.option == "read_ahead_kb"
    assert "could not be written" in info.value.message


def test_read_ra_garbage(sysfs):
    dev = _blockdev.resolve_device("sdb", sysfs.root)[0]
    with open(dev.ra_path, "w", encoding="ascii") as handle:
        handle.write("lots\n")
    with pytest.raises(UmaError, match="unreadable"):
        _blockdev.read_ra(dev)


# -- records and restore ------------------------------------------------------------------------


def _record(tmp_path, sysfs, name="w", entries=None):
    devices = _blockdev.resolve_device("dm-0", sysfs.root)
    originals = {"dm-0": 128, "nvme0n1": 128, "sda": 256}
    data = _blockdev.new_record(name, devices, originals, 8, 60, 1000.0)
    if entries is not None:
        data["devices"] = entries
    path = _blockdev.record_path(str(tmp_path / "state"), name)
    _blockdev.write_record(path, data)
    for dev in devices:
        _blockdev.write_ra(dev.ra_path, 8)
    return path, data


def test_new_record_shape(sysfs, tmp_path):
    _path, data = _record(tmp_path, sysfs)
    assert data["opened_at"] == 1000 and data["ends_at"] == 1060
    assert data["timer"] == "uma-readahead-restore-w.timer"
    assert data["devices"][2] == {"device": "sda", "dev": "8:0", "original_kb": 256}


def test_restore_record_puts_values_back_and_deletes_it(sysfs, tmp_path):
    path, _data = _record(tmp_path, sysfs)
    result = _blockdev.restore_record(path, sysfs.root)
    assert result["errors"] == [] and result["skipped"] == []
    assert [r["device"] for r in result["restored"]] == ["dm-0", "nvme0n1", "sda"]
    assert (sysfs.ra("dm-0"), sysfs.ra("nvme0n1"), sysfs.ra("sda")) == (128, 128, 256)
    assert not os.path.exists(path)
    # a second restore (timer and boot unit racing) is a no-op
    assert _blockdev.restore_record(path, sysfs.root) == {"record": path, "restored": [], "skipped": [], "errors": []}


def test_restore_skips_renamed_and_gone_devices(sysfs, tmp_path):
    entries = [
        {"device": "sdb", "dev": "8:99", "original_kb": 4096},  # the name now names another disk
        {"device": "sdz", "dev": "8:200", "original_kb": 4096},  # gone
        {"device": "sdc", "dev": "8:32", "original_kb": 1024},
        {"device": "../x", "dev": "1:1", "original_kb": 1},
        "junk",
    ]
    path, _data = _record(tmp_path, sysfs, entries=entries)
    result = _blockdev.restore_record(path, sysfs.root)
    assert [s["device"] for s in result["skipped"]] == ["sdb", "sdz"]
    assert "now belongs to 8:16" in result["skipped"][0]["reason"]
    assert result["restored"] == [{"device": "sdc", "dev": "8:32", "read_ahead_kb": 1024}]
    assert sysfs.ra("sdb") == 128 and sysfs.ra("sdc") == 1024
    # a damaged entry is named, never skipped in silence: the record stays for the next restore
    # (before issue 36 item 4 they were "malformed entry" skips and the record was deleted)
    assert len(result["errors"]) == 2
    assert '%s has devices[3].device = "../x", not a block device name: left in place' % path in result["errors"][0]
    assert '%s has devices[4] = "junk", not an object: left in place' % path in result["errors"][1]
    assert os.path.exists(path)


@pytest.mark.parametrize(
    "bad, problem",
    [
        ("4096", 'has devices[0].original_kb = "4096" (device sdc), not a whole number of KiB'),
        (True, "has devices[0].original_kb = true (device sdc)"),
        (None, "has devices[0].original_kb = null (device sdc)"),
        (-8, "has devices[0].original_kb = -8 (device sdc)"),
        (4294967296, "has devices[0].original_kb = 4294967296 (device sdc)"),
        (1024.5, "has devices[0].original_kb = 1024.5 (device sdc)"),
    ],
)
def test_restore_names_an_original_it_cannot_read_and_keeps_the_record(sysfs, tmp_path, bad, problem):
    entries = [
        {"device": "sdc", "dev": "8:32", "original_kb": bad},
        {"device": "sda", "dev": "8:0", "original_kb": 256},
    ]
    path, _data = _record(tmp_path, sysfs, entries=entries)
    result = _blockdev.restore_record(path, sysfs.root)
    assert len(result["errors"]) == 1 and problem in result["errors"][0]
    assert "put the device's original read_ahead_kb back by hand" in result["errors"][0]
    assert result["restored"] == [{"device": "sda", "dev": "8:0", "read_ahead_kb": 256}]
    assert sysfs.ra("sdc") == 128  # untouched, not written with a guess
    assert os.path.exists(path)


def test_restore_keeps_record_when_a_write_fails(sysfs, tmp_path):
    path, _data = _record(tmp_path, sysfs)
    os.unlink(os.path.join(sysfs.dirs["sda"], "queue", "read_ahead_kb"))
    os.rmdir(os.path.join(sysfs.dirs["sda"], "queue"))
    result = _blockdev.restore_record(path, sysfs.root)
    assert len(result["errors"]) == 1 and "could not be written" in result["errors"][0]
    assert os.path.exists(path)


@pytest.mark.parametrize("content", ["{not json", json.dumps({"name": "x"}), json.dumps([1, 2]), "", "NaN"])
def test_restore_keeps_unreadable_record(sysfs, tmp_path, content):
    path = tmp_path / "readahead-bad.json"
    path.write_text(content)
    result = _blockdev.restore_record(str(path), sysfs.root)
    assert len(result["errors"]) == 1 and path.exists()
    assert result["errors"][0].startswith(str(path) + " ")
    assert "damaged, left in place, nothing restored" in result["errors"][0]
    record, problem = _blockdev.read_record(str(path))
    assert record is None and problem is not None


@pytest.mark.parametrize("how", ["fifo", "symlink", "directory"])
def test_restore_neither_hangs_on_nor_follows_what_is_not_a_record_file(sysfs, tmp_path, how):
    path = tmp_path / "readahead-odd.json"
    if how == "fifo":
        os.mkfifo(path)  # an open() of it would wait for a writer forever (the boot unit would hang)
    elif how == "symlink":
        target = tmp_path / "elsewhere.json"
        target.write_text(json.dumps({"devices": [{"device": "sdc", "dev": "8:32", "original_kb": 4}]}))
        path.symlink_to(target)
    else:
        path.mkdir()
    result = _blockdev.restore_record(str(path), sysfs.root)
    assert len(result["errors"]) == 1 and "nothing restored" in result["errors"][0]
    assert os.path.lexists(path) and sysfs.ra("sdc") == 128


def test_restore_all_and_cli(sysfs, tmp_path, capsys):
    state = tmp_path / "state"
    p1, _data = _record(tmp_path, sysfs, name="one")
    sysfs_root = sysfs.root
    dev = _blockdev.resolve_device("loop3", sysfs_root)
    _blockdev.write_record(
        _blockdev.record_path(str(state), "two"), _blockdev.new_record("two", dev, {"loop3": 4096}, 8, 60, 0)
    )
    assert _blockdev.pending_records(str(state)) == [p1, str(state / "readahead-two.json")]
    code = _blockdev.main(["restore", "--all", "--state-dir", str(state), "--sysfs-root", sysfs_root])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["results"]) == 2
    assert sysfs.ra("loop3") == 4096 and sysfs.ra("sda") == 256
    assert _blockdev.pending_records(str(state)) == []


def test_cli_single_record_and_errors(sysfs, tmp_path, capsys):
    path, _data = _record(tmp_path, sysfs)
    os.unlink(os.path.join(sysfs.dirs["nvme0n1"], "queue", "read_ahead_kb"))
    os.rmdir(os.path.join(sysfs.dirs["nvme0n1"], "queue"))
    assert _blockdev.main(["restore", "--record", path, "--sysfs-root", sysfs.root]) == 1
    assert "could not be written" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        _blockdev.main(["restore"])
    assert info.value.code == 2
    assert _blockdev.main([]) == 2


def test_restore_command():
    assert _blockdev.restore_command("/usr/bin/python3", "/usr/local/lib/uma-vllm", "/sys", record="/v/r.json") == [
        "/usr/bin/python3",
        "/usr/local/lib/uma-vllm/uma_readahead.py",
        "restore",
        "--record",
        "/v/r.json",
    ]
    assert _blockdev.restore_command("/p", "/l", "/tmp/sys", state_dir="/s")[-5:] == [
        "--all",
        "--state-dir",
        "/s",
        "--sysfs-root",
        "/tmp/sys",
    ]


# -- rendered files -----------------------------------------------------------------------------


def test_boot_unit_is_managed_and_restores_all():
    text = _blockdev.render_boot_unit("/usr/bin/python3", "/usr/local/lib/uma-vllm", "/var/lib/uma-vllm")
    assert parse_fingerprint(text)["intact"]
    assert (
        "ExecStart=/usr/bin/python3 /usr/local/lib/uma-vllm/uma_readahead.py restore --all "
        "--state-dir /var/lib/uma-vllm\n" in text
    )
    assert "Type=oneshot\n" in text and "WantedBy=multi-user.target\n" in text


def test_udev_rules_round_trip():
    text = _blockdev.render_udev_rules({"nvme0n1": 128, "dm-0": 4096})
    assert parse_fingerprint(text)["intact"]
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines == [
        'ACTION=="add|change", SUBSYSTEM=="block", KERNEL=="dm-0", ATTR{queue/read_ahead_kb}="4096"',
        'ACTION=="add|change", SUBSYSTEM=="block", KERNEL=="nvme0n1", ATTR{queue/read_ahead_kb}="128"',
    ]
    assert _blockdev.parse_udev_rules(text) == {"nvme0n1": 128, "dm-0": 4096}
    assert _blockdev.parse_udev_rules(None) == {}
    assert _blockdev.parse_udev_rules('# KERNEL=="x", ATTR{queue/read_ahead_kb}="1"\n') == {}


@pytest.mark.parametrize("value", ["relative", "/with space", "/a/../b", "/x;rm", "/$HOME", None, 5])
def test_check_safe_path_refuses(value):
    with pytest.raises(UmaError) as info:
        _blockdev.check_safe_path("lib_dir", value)
    assert info.value.option == "lib_dir"


def test_check_safe_path_accepts():
    assert _blockdev.check_safe_path("lib_dir", "/usr/local/lib/uma-vllm") == "/usr/local/lib/uma-vllm"


def test_program_runs_without_ansible(tmp_path, sysfs):
    """The node runs `python3 uma_readahead.py` from lib_dir with the node package beside it, no Ansible on sys.path."""
    import subprocess
    import sys

    from ansible_collections.uma.vllm.plugins.module_utils.plumbing import node_install

    lib = tmp_path / "lib"
    lib.mkdir()
    node_install.install_node_files(node_install.plan_node_files(str(lib)))  # what readahead_window installs
    path, _data = _record(tmp_path, sysfs)
    env = {"PATH": os.environ.get("PATH", "/usr/bin"), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, "-S", str(lib / "uma_readahead.py"), "restore", "--record", path, "--sysfs-root", sysfs.root],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        cwd=str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["results"][0]["restored"]
    assert sysfs.ra("sda") == 256
