# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Block devices under a path, their ``read_ahead_kb``, and the restore side of a readahead window.

Used by uma.vllm.readahead_window (importable) and, on the node, as a program
that the window's systemd timer and the boot unit run::

    python3 uma_readahead.py restore --record /var/lib/uma-vllm/readahead-NAME.json
    python3 uma_readahead.py restore --all --state-dir /var/lib/uma-vllm

Device resolution only reads sysfs under ``sysfs_root`` (and ``proc_root`` for
filesystems without a device number of their own, such as btrfs), so the unit
tests build fake sysfs trees in a temporary directory:

* the path's ``st_dev`` -> ``/sys/dev/block/MAJ:MIN`` -> the device directory;
* a partition (it has a ``partition`` file) -> its parent directory, the disk
  (``sda1`` -> ``sda``, ``nvme0n1p1`` -> ``nvme0n1``, ``mmcblk0p2`` -> ``mmcblk0``);
* a stacked device (dm-*, md*: non-empty ``slaves/``) -> itself (its queue drives
  the readahead of filesystems on it) and, recursively, the disks under it;
* loop, nvme, virtio, sd* and the rest are leaves.
"""

from __future__ import annotations

import glob
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .common import UmaError, managed_header, node_write_json, read_record_file, read_text, systemd_quote
from .paths import STATE_DIR

RECORD_PREFIX = "readahead-"
RECORD_VERSION = 1
BOOT_UNIT = "uma-readahead-restore.service"
TIMER_PREFIX = "uma-readahead-restore-"
UDEV_RULES_NAME = "60-uma-vllm-readahead.rules"
# The kernel stores read_ahead_kb as pages and refuses values above UINT_MAX
# (block/blk-sysfs.c: queue_ra_store -> queue_var_store).
KERNEL_MAX_KB = 4294967295

_DEVICE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:+!-]*$")
_SAFE_PATH_RE = re.compile(r"^/[A-Za-z0-9._/+-]*$")
_UDEV_LINE_RE = re.compile(r'KERNEL=="([^"]+)".*ATTR\{queue/read_ahead_kb\}="(\d+)"')


@dataclass
class BlockDevice:
    """One device whose ``queue/read_ahead_kb`` the window sets."""

    name: str
    dev: str  # "MAJ:MIN"
    sysfs_dir: str
    role: str  # "disk" or "holder" (dm/md on top of other devices)

    @property
    def ra_path(self) -> str:
        return os.path.join(self.sysfs_dir, "queue", "read_ahead_kb")

    def as_dict(self) -> Dict[str, str]:
        return {"device": self.name, "dev": self.dev, "role": self.role}


def page_kb() -> int:
    """The page size in KiB (4 on x86 and most arm64 kernels, 64 on some GH200/Grace kernels)."""
    try:
        return max(1, os.sysconf("SC_PAGE_SIZE") // 1024)
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        return 4


def effective_kb(kb: int, page: int) -> int:
    """What the kernel reads back after ``kb`` was written: whole pages, rounded down."""
    return (kb // page) * page


# -- resolution ------------------------------------------------------------------------------


def read_first_line(path: str) -> Optional[str]:
    try:
        text = read_text(path)
    except OSError:
        return None
    if text is None:
        return None
    return text.strip()


def _expand(devdir: str, sysfs_root: str, seen: set, depth: int = 0) -> List[BlockDevice]:
    if depth > 16:
        return []
    if os.path.exists(os.path.join(devdir, "partition")):
        devdir = os.path.dirname(devdir)
    if devdir in seen:
        return []
    seen.add(devdir)
    name = os.path.basename(devdir)
    dev = read_first_line(os.path.join(devdir, "dev")) or ""
    slaves_dir = os.path.join(devdir, "slaves")
    try:
        slaves = sorted(os.listdir(slaves_dir))
    except OSError:
        slaves = []
    result = []
    if os.path.exists(os.path.join(devdir, "queue", "read_ahead_kb")):
        result.append(BlockDevice(name=name, dev=dev, sysfs_dir=devdir, role="holder" if slaves else "disk"))
    for slave in slaves:
        result.extend(_expand(os.path.realpath(os.path.join(slaves_dir, slave)), sysfs_root, seen, depth + 1))
    return result


def resolve_devnum(major: int, minor: int, sysfs_root: str, option: str, value: Any) -> List[BlockDevice]:
    link = os.path.join(sysfs_root, "dev", "block", "%d:%d" % (major, minor))
    if not os.path.exists(link):
        raise UmaError(
            option,
            value,
            "lies on block device %d:%d, which %s does not list" % (major, minor, os.path.dirname(link)),
            "Give the disk with device= instead (e.g. device=nvme0n1).",
        )
    devices = _expand(os.path.realpath(link), sysfs_root, set())
    if not devices:
        raise UmaError(
            option,
            value,
            "lies on block device %d:%d, which has no queue/read_ahead_kb" % (major, minor),
            "Give the disk with device= instead (e.g. device=nvme0n1).",
        )
    return devices


def _unescape_mount(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_of(st_dev: int, path: str, proc_root: str) -> Optional[Tuple[str, str, str]]:
    """(mount point, fstype, source) of the mount whose superblock is ``st_dev``, else of the
    longest mount point containing ``path``; None when mountinfo cannot be read."""
    try:
        text = read_text(os.path.join(proc_root, "self", "mountinfo"))
    except OSError:
        return None
    if not text:
        return None
    wanted = "%d:%d" % (os.major(st_dev), os.minor(st_dev))
    real = os.path.realpath(path)
    by_dev = None
    by_prefix: Optional[Tuple[str, str, str]] = None
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        rest = right.split()
        if not sep or len(fields) < 5 or len(rest) < 2:
            continue
        mountpoint = _unescape_mount(fields[4])
        entry = (mountpoint, rest[0], _unescape_mount(rest[1]))
        if fields[2] == wanted:
            by_dev = entry
        inside = real == mountpoint or real.startswith(mountpoint.rstrip("/") + "/")
        if inside and (by_prefix is None or len(mountpoint) >= len(by_prefix[0])):
            by_prefix = entry
    return by_dev or by_prefix


def resolve_path(path: str, sysfs_root: str = "/sys", proc_root: str = "/proc") -> List[BlockDevice]:
    """The devices whose readahead applies to reads of ``path``."""
    if not isinstance(path, str) or not os.path.isabs(path):
        raise UmaError("path", path, "is not an absolute path", "Give the model directory, e.g. /models/llama.")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise UmaError(
            "path", path, "does not exist on the node", "Give an existing file or directory, or the disk with device=."
        ) from None
    except OSError as err:
        raise UmaError("path", path, "cannot be read (%s)" % err.strerror, "Run with become: true.") from None
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    if major != 0:
        return resolve_devnum(major, minor, sysfs_root, "path", path)
    # Anonymous device numbers (btrfs, overlay, tmpfs, NFS...): look at the mount's source.
    mount = mount_of(st.st_dev, path, proc_root)
    if mount is not None and mount[2].startswith("/dev/"):
        name = os.path.basename(os.path.realpath(mount[2]))
        if os.path.exists(os.path.join(sysfs_root, "class", "block", name)):
            return resolve_device(name, sysfs_root, option="path", value=path)
        try:
            rdev = os.stat(mount[2]).st_rdev
        except OSError:
            rdev = 0
        if rdev and os.major(rdev) != 0:
            return resolve_devnum(os.major(rdev), os.minor(rdev), sysfs_root, "path", path)
    fstype = mount[1] if mount else "unknown"
    raise UmaError(
        "path",
        path,
        "lies on a filesystem without a block device of its own (%s on %s)"
        % (fstype, mount[0] if mount else "an unknown mount"),
        "Give the disk that holds the data with device= (e.g. device=nvme0n1), or a path on a local disk.",
    )


def resolve_device(
    device: str, sysfs_root: str = "/sys", option: str = "device", value: Any = None
) -> List[BlockDevice]:
    """``nvme0n1``, ``/dev/nvme0n1``, ``/dev/mapper/vg-lv``, ``dm-0``, ``loop3``... -> devices."""
    value = device if value is None else value
    if not isinstance(device, str) or not device.strip():
        raise UmaError(option, value, "is empty", "Give a block device name such as nvme0n1 or /dev/nvme0n1.")
    device = device.strip()
    if device.startswith("/dev/"):
        if os.path.exists(device):
            real = os.path.realpath(device)
            name = os.path.basename(real)
            if not os.path.exists(os.path.join(sysfs_root, "class", "block", name)):
                try:
                    rdev = os.stat(real).st_rdev
                except OSError:
                    rdev = 0
                if rdev and os.major(rdev) != 0:
                    return resolve_devnum(os.major(rdev), os.minor(rdev), sysfs_root, option, value)
        else:
            name = device[len("/dev/") :]
    else:
        name = device
    if not _DEVICE_NAME_RE.match(name):
        raise UmaError(option, value, "is not a block device name", "Give e.g. nvme0n1, /dev/sda or dm-0.")
    link = os.path.join(sysfs_root, "class", "block", name)
    if not os.path.exists(link):
        raise UmaError(
            option,
            value,
            "is not a block device on the node (no %s under sysfs_root)" % link,
            "List the node's devices with 'lsblk' and give one of them.",
        )
    devices = _expand(os.path.realpath(link), sysfs_root, set())
    if not devices:
        raise UmaError(option, value, "has no queue/read_ahead_kb", "Give the whole disk (e.g. nvme0n1).")
    return devices


# -- live values -----------------------------------------------------------------------------


def read_ra(dev: BlockDevice) -> int:
    text = read_first_line(dev.ra_path)
    try:
        return int(text or "")
    except ValueError:
        raise UmaError(
            "device", dev.name, "has an unreadable %s (%r)" % (dev.ra_path, text), "Check the node's sysfs."
        ) from None


def write_ra(path: str, kb: int) -> None:
    try:
        with open(path, "w", encoding="ascii") as handle:
            handle.write("%d\n" % kb)
    except OSError as err:
        raise UmaError(
            "read_ahead_kb",
            kb,
            "could not be written to %s (%s)" % (path, err.strerror),
            "Run with become: true; in a container, /sys must be mounted read-write.",
        ) from None


# -- records and restore ---------------------------------------------------------------------


def record_path(state_dir: str, name: str) -> str:
    return os.path.join(state_dir, "%s%s.json" % (RECORD_PREFIX, name))


_DEV_RE = re.compile(r"^[0-9]{1,10}:[0-9]{1,10}$")
_RECORD_NUMBERS = ("version", "read_ahead_kb", "duration", "opened_at", "ends_at")
RECORD_EXAMPLE = '{"devices": [{"device": "nvme0n1", "dev": "259:0", "original_kb": <original>}, ...]}'


def _whole(value: Any, top: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= top


def _shown(value: Any) -> str:
    return json.dumps(value)[:80]


def record_problem(data: Dict[str, Any], entries: bool = True) -> Optional[str]:
    """What is wrong with a readahead record's content (None: nothing), field by field; the words
    read after the record's path.

    A record holds the devices' original ``read_ahead_kb`` values: an entry that cannot be read
    must never be taken for "no original" (the value the window set would then be kept as the
    device's own). Checked: a ``devices`` list; each entry an object with ``device`` (a block
    device name), ``dev`` (``MAJ:MIN``, or empty) and ``original_kb`` (a whole number from 0 to
    the kernel's maximum); ``version``, ``read_ahead_kb``, ``duration``, ``opened_at`` and
    ``ends_at`` whole numbers >= 0 where present (``entries=False``: the record without its
    entries, which :func:`entry_problem` checks one by one)."""
    devices = data.get("devices")
    if not isinstance(devices, list):
        return "has no device list (devices = %s)" % _shown(devices)
    for key in _RECORD_NUMBERS:
        if key in data and not _whole(data[key], 1 << 62):
            return "has %s = %s, not a whole number >= 0" % (key, _shown(data[key]))
    if not entries:
        return None
    return next((p for p in (entry_problem(i, item) for i, item in enumerate(devices)) if p), None)


def entry_problem(index: int, item: Any) -> Optional[str]:
    """What is wrong with entry ``index`` of a record's device list (None: nothing)."""
    where = "devices[%d]" % index
    if not isinstance(item, dict):
        return "has %s = %s, not an object" % (where, _shown(item))
    name, dev, original = item.get("device"), item.get("dev", ""), item.get("original_kb")
    if not isinstance(name, str) or not _DEVICE_NAME_RE.fullmatch(name):
        return "has %s.device = %s, not a block device name" % (where, _shown(name))
    if not isinstance(dev, str) or (dev and not _DEV_RE.fullmatch(dev)):
        return "has %s.dev = %s, not a device number MAJ:MIN" % (where, _shown(dev))
    if not _whole(original, KERNEL_MAX_KB):
        return "has %s.original_kb = %s (device %s), not a whole number of KiB from 0 to %d" % (
            where, _shown(original), name, KERNEL_MAX_KB)  # fmt: skip
    return None


def read_record(path: str, entries: bool = True) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """A readahead record and what is wrong with it: ``(record, None)``, ``(None, None)`` when
    there is none, ``(None, problem)`` when it is there but damaged (read as every node record is,
    :func:`read_record_file`: a symlink, FIFO, directory, empty, not UTF-8, not JSON, not an
    object; then the fields :func:`record_problem` checks; ``entries=False``: the device entries
    are left to the caller's :func:`entry_problem`)."""
    return read_record_file(path, dict, lambda data: record_problem(data, entries))


def restore_record(path: str, sysfs_root: str = "/sys") -> Dict[str, Any]:
    """Put back the original values of one record, then delete it.

    A device is written only when ``/sys/class/block/NAME/dev`` still has the
    recorded MAJ:MIN (after a reboot names can move to other disks). The
    record stays when a write failed or an entry is damaged (named in ``errors``,
    the other entries restored), so the boot unit tries again.
    """
    result: Dict[str, Any] = {"record": path, "restored": [], "skipped": [], "errors": []}
    fix = "put the device's original read_ahead_kb back by hand (or repair the record as %s), then delete it" % (
        RECORD_EXAMPLE
    )
    data, problem = read_record(path, entries=False)
    if problem is not None:
        result["errors"].append("%s %s: damaged, left in place, nothing restored; %s" % (path, problem, fix))
        return result
    if data is None:
        return result
    for index, item in enumerate(data["devices"]):
        # a damaged entry is never skipped in silence: it is named, the others are restored, and the
        # record stays (the boot unit tries again; the operator's value is not lost with it)
        problem = entry_problem(index, item)
        if problem is not None:
            result["errors"].append("%s %s: left in place; %s" % (path, problem, fix))
            continue
        name, dev, original = item["device"], item.get("dev", ""), item["original_kb"]
        base = os.path.join(sysfs_root, "class", "block", name)
        now_dev = read_first_line(os.path.join(base, "dev"))
        if now_dev is None:
            result["skipped"].append({"device": name, "reason": "device is gone"})
            continue
        if dev and now_dev != dev:
            result["skipped"].append({"device": name, "reason": "name now belongs to %s, not %s" % (now_dev, dev)})
            continue
        try:
            write_ra(os.path.join(base, "queue", "read_ahead_kb"), original)
        except UmaError as err:
            result["errors"].append(err.problem)
            continue
        result["restored"].append({"device": name, "dev": dev, "read_ahead_kb": original})
    if not result["errors"]:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as err:
            result["errors"].append("cannot delete %s: %s" % (path, err.strerror))
    return result


def pending_records(state_dir: str) -> List[str]:
    return sorted(glob.glob(os.path.join(glob.escape(state_dir), RECORD_PREFIX + "*.json")))


def restore_all(state_dir: str, sysfs_root: str = "/sys") -> List[Dict[str, Any]]:
    return [restore_record(path, sysfs_root) for path in pending_records(state_dir)]


def new_record(
    name: str, devices: Sequence[BlockDevice], originals: Dict[str, int], read_ahead_kb: int, duration: int, now: float
) -> Dict[str, Any]:
    return {
        "version": RECORD_VERSION,
        "name": name,
        "read_ahead_kb": read_ahead_kb,
        "duration": duration,
        "opened_at": int(now),
        "ends_at": int(now) + duration,
        "timer": TIMER_PREFIX + name + ".timer",
        "devices": [{"device": d.name, "dev": d.dev, "original_kb": originals[d.name]} for d in devices],
    }


def write_record(path: str, data: Dict[str, Any]) -> None:
    try:
        node_write_json(path, data, 0o644)
    except OSError as err:
        raise UmaError(
            "state_dir",
            os.path.dirname(path),
            "could not be written (%s: %s)" % (err.filename or path, err.strerror),
            "Run with become: true or choose a writable state_dir.",
        ) from None


# -- files for systemd and udev --------------------------------------------------------------


def check_safe_path(option: str, value: Any) -> str:
    """Paths that go into unit files unquoted: absolute, no spaces or shell/systemd specials."""
    if not isinstance(value, str) or not _SAFE_PATH_RE.match(value) or "/../" in value + "/":
        raise UmaError(
            option,
            value,
            "is not an absolute path made of A-Z a-z 0-9 . _ / + -",
            "Give a plain absolute path (it goes into a systemd unit unquoted).",
        )
    return value


def restore_command(
    python: str, lib_dir: str, sysfs_root: str, record: Optional[str] = None, state_dir: Optional[str] = None
) -> List[str]:
    argv = [python, os.path.join(lib_dir, "uma_readahead.py"), "restore"]
    if record is not None:
        argv += ["--record", record]
    else:
        argv += ["--all", "--state-dir", state_dir or STATE_DIR]
    if sysfs_root != "/sys":
        argv += ["--sysfs-root", sysfs_root]
    return argv


def render_boot_unit(python: str, lib_dir: str, state_dir: str, sysfs_root: str = "/sys") -> str:
    command = " ".join(systemd_quote(arg) for arg in restore_command(python, lib_dir, sysfs_root, state_dir=state_dir))
    body = (
        "[Unit]\n"
        "Description=uma.vllm: put back read_ahead_kb values left throttled by an open readahead window\n"
        "Documentation=https://github.com/uma-vllm/uma.vllm\n"
        "After=local-fs.target\n"
        "RequiresMountsFor=%(state_dir)s %(lib_dir)s\n"
        "ConditionPathIsDirectory=%(state_dir)s\n"
        "\n"
        "[Service]\n"
        "Type=oneshot\n"
        "Environment=PYTHONDONTWRITEBYTECODE=1\n"
        "ExecStart=%(command)s\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    ) % {"state_dir": state_dir, "lib_dir": lib_dir, "command": command}
    return managed_header("boot-time restore of readahead windows", body) + body


def parse_udev_rules(text: Optional[str]) -> Dict[str, int]:
    entries: Dict[str, int] = {}
    for line in (text or "").splitlines():
        if line.lstrip().startswith("#"):
            continue
        match = _UDEV_LINE_RE.search(line)
        if match:
            entries[match.group(1)] = int(match.group(2))
    return entries


def render_udev_rules(entries: Dict[str, int]) -> str:
    body = "".join(
        'ACTION=="add|change", SUBSYSTEM=="block", KERNEL=="%s", ATTR{queue/read_ahead_kb}="%d"\n' % (name, kb)
        for name, kb in sorted(entries.items())
    )
    return managed_header("steady-state read_ahead_kb", body) + body


# -- node-side program -----------------------------------------------------------------------


def main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="uma_readahead.py", description="uma.vllm: put back read_ahead_kb values recorded by a readahead window."
    )
    sub = parser.add_subparsers(dest="command")
    restore = sub.add_parser("restore", help="restore one record (--record) or every pending one (--all)")
    which = restore.add_mutually_exclusive_group(required=True)
    which.add_argument("--record", help="the record file (readahead-NAME.json)")
    which.add_argument("--all", action="store_true", help="every readahead-*.json under --state-dir")
    restore.add_argument("--state-dir", default=STATE_DIR)
    restore.add_argument("--sysfs-root", default="/sys")
    args = parser.parse_args(argv)
    if args.command != "restore":
        parser.print_usage(sys.stderr)
        return 2
    if args.record:
        results = [restore_record(args.record, args.sysfs_root)]
    else:
        results = restore_all(args.state_dir, args.sysfs_root)
    sys.stdout.write(json.dumps({"at": int(time.time()), "results": results}, sort_keys=True) + "\n")
    return 1 if any(r["errors"] for r in results) else 0
