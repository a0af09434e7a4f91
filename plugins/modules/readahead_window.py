#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: readahead_window
short_description: Throttle block-device readahead for a time window, restored by a timer on the node
version_added: 0.1.0
description:
  - Lowers C(queue/read_ahead_kb) of the block device(s) that hold O(path) (or of O(device)) for O(duration)
    seconds, typically while vLLM loads a model whose weights would otherwise be read ahead into page cache
    that competes with the GPU for the shared memory of a unified-memory machine.
  - Resolves the devices from sysfs - a partition to its disk (C(nvme0n1p1) to C(nvme0n1), C(sda1) to C(sda)),
    a device-mapper or md device to itself and, recursively, the disks under it (C(slaves/)); loop, NVMe and
    virtio disks are leaves. Filesystems without a device number of their own (btrfs) are resolved through
    the mount's source device.
  - Records the values found before the first throttle in O(state_dir)C(/readahead-NAME.json); a second run
    while the window is open keeps the first record (it never records the throttled value as the original).
  - The window is closed ON THE NODE by a transient systemd timer C(uma-readahead-restore-NAME.timer) that
    runs C(_blockdev.py restore) from O(lib_dir), so a play that fails or loses its connection after this task
    never leaves a disk throttled. An enabled oneshot C(uma-readahead-restore.service) restores every pending
    record at boot, for a reboot or container restart in the middle of a window.
  - The restorer program is installed into O(lib_dir) from the collection's own source (a change only when
    the content differs).
  - O(state=restored) closes the window now - restores the recorded values, stops the timer and deletes the
    record.
  - O(persist=true) also writes a udev rule with the steady-state (restored) value per device, for the next
    boot and hot-plug.
  - Everything is validated before anything is touched; a refusal names the option, the value and the fix.
author:
  - uma.vllm developers (@uma-vllm)
extends_documentation_fragment:
  - uma.vllm.attributes
  - uma.vllm.attributes.NODE
options:
  state:
    description:
      - V(throttled) opens the window (or keeps an open one as it is).
      - V(restored) closes it now.
    type: str
    choices: [throttled, restored]
    default: throttled
  name:
    description:
      - Name of the window; one record and one timer per name. 1-64 characters from C(A-Z a-z 0-9 _ . -).
    type: str
    default: default
  path:
    description:
      - A file or directory (the model directory) on the node; the devices holding it are throttled.
      - Mutually exclusive with O(device); one of them is required for O(state=throttled).
    type: path
  device:
    description:
      - A block device name or node, for example C(nvme0n1), C(/dev/nvme0n1), C(/dev/mapper/vg-models), C(dm-0).
    type: str
  read_ahead_kb:
    description:
      - The value during the window, in KiB. C(0) turns readahead off.
      - A whole number from 0 to 4294967295 (the kernel's limit). The kernel keeps whole pages, so the value
        reads back rounded down to a multiple of the page size (4 KiB, or 64 KiB on some arm64 kernels).
    type: raw
    default: 8
  duration:
    description:
      - Length of the window in seconds, from the moment it opens, 1 to 86400. Re-running the task while the
        window is open does not move its end.
    type: raw
    default: 180
  persist:
    description:
      - Also write a udev rule (O(udev_rules_dir)C(/60-uma-vllm-readahead.rules)) that sets each resolved device
        to its steady-state value - the value recorded before the window (the restored value).
      - Entries for other devices in that file are kept.
    type: bool
    default: false
  python:
    description: The node's Python 3 interpreter that runs the restorer under systemd.
    type: str
    default: /usr/bin/python3
  lib_dir:
    description: Where the node-side programs (C(_blockdev.py), C(_common.py)) are installed.
    type: str
    default: /usr/local/lib/uma-vllm
  state_dir:
    description: Where the records of open windows live (C(readahead-NAME.json)); must survive a reboot.
    type: str
    default: /var/lib/uma-vllm
  systemd_dir:
    description: Where the boot-time restore unit C(uma-readahead-restore.service) is written.
    type: path
    default: /etc/systemd/system
  udev_rules_dir:
    description: Where the rule of O(persist=true) is written.
    type: path
    default: /etc/udev/rules.d
  sysfs_root:
    description: Root of sysfs; tests point it at a temporary tree.
    type: path
    default: /sys
  proc_root:
    description: Root of procfs (C(self/mountinfo) for filesystems without a device number).
    type: path
    default: /proc
notes:
  - C(/sys/block/*/queue/read_ahead_kb) is not namespaced; inside a container this changes the host kernel's
    value, and a container restart does not reset it (the boot unit does).
  - udev does not run inside containers; the rule of O(persist=true) then only takes effect on a real boot.
  - The udev rule matches the kernel name (C(KERNEL==)); names of NVMe namespaces can change between boots
    on machines with several controllers.
seealso:
  - module: uma.vllm.drop_cache_loop
"""

EXAMPLES = r"""
- name: Throttle readahead of the model disk for 3 minutes while vLLM maps the weights
  uma.vllm.readahead_window:
    name: llama70b
    path: /models/llama-3.1-70b
    read_ahead_kb: 8
    duration: 180
  become: true

- name: Same, by device, and keep the operator's value for the next boot in a udev rule
  uma.vllm.readahead_window:
    device: /dev/nvme0n1
    persist: true
  become: true

- name: Close the window as soon as the server answers
  uma.vllm.readahead_window:
    name: llama70b
    state: restored
  become: true
"""

RETURN = r"""
state:
  description: The requested state.
  returned: always
  type: str
  sample: throttled
devices:
  description:
    - The devices the window applies to, with their recorded original value and the live value before and
      after the run (predicted in check mode). C(role) is C(disk), or C(holder) for dm/md devices.
  returned: always
  type: list
  elements: dict
  sample: [{"device": "nvme0n1", "dev": "259:0", "role": "disk", "original_kb": 128, "before_kb": 128,
            "after_kb": 8}]
read_ahead_kb:
  description: The requested value and what the kernel keeps of it (C(effective_kb), whole pages).
  returned: always
  type: dict
  sample: {"requested_kb": 8, "effective_kb": 8, "page_kb": 4}
window:
  description:
    - The window - C(open), the timer unit, when it opened and when the timer restores the values
      (seconds since the epoch), and the record file.
  returned: always
  type: dict
  sample: {"open": true, "timer": "uma-readahead-restore-llama70b.timer", "opened_at": 1767225600,
           "ends_at": 1767225780, "duration": 180, "record": "/var/lib/uma-vllm/readahead-llama70b.json"}
record:
  description: Content of the record after the run (C(null) once restored).
  returned: always
  type: dict
  sample: {"name": "llama70b", "read_ahead_kb": 8, "duration": 180, "opened_at": 1767225600,
           "ends_at": 1767225780, "devices": [{"device": "nvme0n1", "dev": "259:0", "original_kb": 128}]}
restored:
  description: For O(state=restored) - the devices put back, and devices skipped (gone, or the name now names
    another disk).
  returned: when state is restored
  type: dict
  sample: {"restored": [{"device": "nvme0n1", "read_ahead_kb": 128}], "skipped": []}
boot_unit:
  description: The boot-time restore unit - its path and whether it is enabled (predicted in check mode).
  returned: when state is throttled
  type: dict
  sample: {"path": "/etc/systemd/system/uma-readahead-restore.service", "enabled": true, "changed": false}
udev_rules:
  description: The udev rule file and the steady-state values in it.
  returned: when persist is true
  type: dict
  sample: {"path": "/etc/udev/rules.d/60-uma-vllm-readahead.rules", "entries": {"nvme0n1": 128}, "changed": true}
node_files:
  description: The node-side programs in O(lib_dir), whether this run wrote them, and their checksums.
  returned: when state is throttled
  type: list
  elements: dict
  sample: [{"path": "/usr/local/lib/uma-vllm/_blockdev.py", "changed": false, "sha256": "9c1e...",
            "sha256_before": "9c1e..."}]
"""

import copy
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.uma.vllm.plugins.module_utils import _blockdev, _common
from ansible_collections.uma.vllm.plugins.module_utils._blockdev import BlockDevice
from ansible_collections.uma.vllm.plugins.module_utils._common import (
    UmaError,
    atomic_write,
    check_path,
    read_text,
    require_int,
)
from ansible_collections.uma.vllm.plugins.module_utils._diff import DifferenceTracker
from ansible_collections.uma.vllm.plugins.module_utils._nodefiles import (
    NodeFile,
    install_node_files,
    plan_node_files,
)
from ansible_collections.uma.vllm.plugins.module_utils._systemd import Systemd, check_name

MAX_DURATION = 86400


@dataclass
class WindowRequest:
    state: str = "throttled"
    name: str = "default"
    path: Optional[str] = None
    device: Optional[str] = None
    read_ahead_kb: Any = 8
    duration: Any = 180
    persist: bool = False
    python: str = "/usr/bin/python3"
    lib_dir: str = "/usr/local/lib/uma-vllm"
    state_dir: str = "/var/lib/uma-vllm"
    systemd_dir: str = "/etc/systemd/system"
    udev_rules_dir: str = "/etc/udev/rules.d"
    sysfs_root: str = "/sys"
    proc_root: str = "/proc"


@dataclass
class WindowPlan:
    request: WindowRequest
    kb: int
    duration: int
    page: int
    devices: List[BlockDevice]
    originals: Dict[str, int]
    live_before: Dict[str, int]
    live_after: Dict[str, int]
    record_path: str
    record_before: Optional[Dict[str, Any]]
    record_after: Optional[Dict[str, Any]]
    timer: str
    timer_active: bool
    timer_loaded: bool
    arm_timer: bool = False
    stop_timer: bool = False
    boot_path: Optional[str] = None
    boot_before: Optional[str] = None
    boot_after: Optional[str] = None
    boot_enabled: bool = True
    node_files: List[NodeFile] = field(default_factory=list)
    udev_path: Optional[str] = None
    udev_before: Optional[str] = None
    udev_after: Optional[str] = None
    skipped: List[Dict[str, str]] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)

    @property
    def live_changes(self) -> Dict[str, int]:
        return {n: v for n, v in self.live_after.items() if self.live_before.get(n) != v}

    @property
    def boot_changed(self) -> bool:
        return self.boot_after is not None and (self.boot_before != self.boot_after or not self.boot_enabled)

    @property
    def udev_changed(self) -> bool:
        return self.udev_after is not None and self.udev_before != self.udev_after

    @property
    def changed(self) -> bool:
        return bool(
            self.live_changes
            or self.record_before != self.record_after
            or self.arm_timer
            or self.stop_timer
            or self.boot_changed
            or self.udev_changed
            or any(f.changed for f in self.node_files)
        )

    def window(self) -> Dict[str, Any]:
        rec = self.record_after or {}
        return {
            "open": self.record_after is not None,
            "timer": self.timer,
            "opened_at": rec.get("opened_at"),
            "ends_at": rec.get("ends_at"),
            "duration": rec.get("duration"),
            "record": self.record_path,
        }

    def device_report(self) -> List[Dict[str, Any]]:
        return [
            dict(
                d.as_dict(),
                original_kb=self.originals.get(d.name),
                before_kb=self.live_before.get(d.name),
                after_kb=self.live_after.get(d.name),
            )
            for d in self.devices
        ]

    def diff(self) -> List[Dict[str, str]]:
        def live(values: Dict[str, int]) -> str:
            return "".join("%s read_ahead_kb = %s\n" % (n, values[n]) for n in sorted(values))

        def timer(active: bool, ends_at: Any) -> str:
            return "%s: %s\n" % (self.timer, ("waiting, ends at %s" % ends_at) if active else "inactive")

        def programs(key: str) -> str:
            return "".join(_program_line(f.path, f.summary()[key]) for f in self.node_files)

        timer_after = (self.timer_active and not self.stop_timer) or self.arm_timer
        tracker = DifferenceTracker()
        tracker.add("live values", live(self.live_before), live(dict(self.live_before, **self.live_after)))
        tracker.add(
            "timer",
            timer(self.timer_active, (self.record_before or {}).get("ends_at")),
            timer(timer_after, (self.record_after or {}).get("ends_at")),
        )
        tracker.add(self.record_path, self.record_before, self.record_after)
        if self.boot_path is not None:
            boot_before = (self.boot_before or "") + ("" if self.boot_enabled else "# (not enabled)\n")
            tracker.add(self.boot_path, boot_before, self.boot_after or "")
        if self.udev_path is not None and self.udev_after is not None:
            tracker.add(self.udev_path, self.udev_before or "", self.udev_after)
        if self.node_files:
            tracker.add("node programs", programs("sha256_before"), programs("sha256"))
        return tracker.text_diffs()


def _program_line(path: str, digest: Optional[str]) -> str:
    return "%s %s\n" % (path, "sha256:" + digest if digest else "(absent)")


def validate(req: WindowRequest) -> Dict[str, Any]:
    if req.state not in ("throttled", "restored"):
        raise UmaError("state", req.state, "is not a known state", "Use throttled or restored.")
    check_name("name", req.name)
    if req.path and req.device:
        raise UmaError("path", req.path, "and device are mutually exclusive", "Give either path or device.")
    if req.state == "throttled" and not req.path and not req.device:
        raise UmaError(
            "path", req.path, "is required (or device) for state=throttled", "Give the model directory or the disk."
        )
    kb = require_int(
        "read_ahead_kb",
        req.read_ahead_kb,
        0,
        _blockdev.KERNEL_MAX_KB,
        "Give a whole number of KiB from 0 (readahead off) to 4294967295, e.g. 8.",
    )
    duration = require_int(
        "duration",
        req.duration,
        1,
        MAX_DURATION,
        "Give the window length in seconds, 1 to 86400; for a lasting value use persist=true.",
    )
    for option in ("lib_dir", "state_dir", "python"):
        _blockdev.check_safe_path(option, getattr(req, option))
    for option in ("systemd_dir", "udev_rules_dir", "sysfs_root", "proc_root"):
        check_path(option, getattr(req, option), fix="Give an absolute directory path.")
    for option in ("lib_dir", "state_dir", "systemd_dir", "udev_rules_dir"):
        value = getattr(req, option)
        if os.path.lexists(value) and not os.path.isdir(value):
            raise UmaError(option, value, "exists and is not a directory", "Give a directory (or a path to create).")
    # sysfs_root is an argument of the boot unit's ExecStart (quoted there too)
    _blockdev.check_safe_path("sysfs_root", req.sysfs_root)
    if req.state == "throttled" and not os.access(req.python, os.X_OK):
        raise UmaError(
            "python", req.python, "is not an executable on the node", "Give the node's python3, e.g. /usr/bin/python3."
        )
    return {"kb": kb, "duration": duration}


def _devices_from_record(record: Dict[str, Any], sysfs_root: str) -> List[BlockDevice]:
    devices = []
    for item in record.get("devices", []):
        if not isinstance(item, dict):
            continue
        name = str(item.get("device", ""))
        sysfs_dir = os.path.join(sysfs_root, "class", "block", name)
        devices.append(BlockDevice(name=name, dev=str(item.get("dev", "")), sysfs_dir=sysfs_dir, role="recorded"))
    return devices


def plan(req: WindowRequest, systemd: Systemd, now: Optional[float] = None, page: Optional[int] = None) -> WindowPlan:
    """Everything the run would change, computed without touching anything."""
    checked = validate(req)
    kb, duration = checked["kb"], checked["duration"]
    now = time.time() if now is None else now
    page = _blockdev.page_kb() if page is None else page
    if req.path:
        devices = _blockdev.resolve_path(req.path, req.sysfs_root, req.proc_root)
    elif req.device:
        devices = _blockdev.resolve_device(req.device, req.sysfs_root)
    else:
        devices = []
    systemd.require("state", req.state)
    record_path = _blockdev.record_path(req.state_dir, req.name)
    record_before = _blockdev.load_record(record_path)
    if record_before is None and os.path.exists(record_path):
        raise UmaError(
            "state_dir",
            req.state_dir,
            "holds an unreadable record %s" % record_path,
            "Inspect it, put the values back by hand and delete it.",
        )
    timer = _blockdev.TIMER_PREFIX + req.name + ".timer"
    shown = systemd.show(timer)
    timer_loaded = shown.get("LoadState") == "loaded"
    timer_active = shown.get("ActiveState") == "active" and shown.get("SubState", "waiting") == "waiting"

    recorded = {}
    for item in (record_before or {}).get("devices", []):
        if isinstance(item, dict) and isinstance(item.get("original_kb"), int):
            recorded[str(item.get("device"))] = item["original_kb"]

    p = WindowPlan(
        request=req,
        kb=kb,
        duration=duration,
        page=page,
        devices=[],
        originals={},
        live_before={},
        live_after={},
        record_path=record_path,
        record_before=record_before,
        record_after=None,
        timer=timer,
        timer_active=timer_active,
        timer_loaded=timer_loaded,
    )

    if req.state == "restored":
        known = {d.name for d in devices}
        for dev in _devices_from_record(record_before or {}, req.sysfs_root):
            if dev.name not in known:
                devices.append(dev)
                known.add(dev.name)
        for dev in devices:
            now_dev = _blockdev.read_first_line(os.path.join(dev.sysfs_dir, "dev"))
            if now_dev is None:
                p.skipped.append({"device": dev.name, "reason": "device is gone"})
                continue
            if dev.dev and now_dev != dev.dev:
                p.skipped.append({"device": dev.name, "reason": "name now belongs to %s, not %s" % (now_dev, dev.dev)})
                continue
            p.devices.append(dev)
            p.live_before[dev.name] = _blockdev.read_ra(dev)
            original = recorded.get(dev.name, p.live_before[dev.name])
            p.originals[dev.name] = original
            p.live_after[dev.name] = _blockdev.effective_kb(original, page)
        p.stop_timer = timer_loaded
        p.record_after = None
    else:
        p.devices = devices
        for dev in devices:
            p.live_before[dev.name] = _blockdev.read_ra(dev)
            p.originals[dev.name] = recorded.get(dev.name, p.live_before[dev.name])
            p.live_after[dev.name] = _blockdev.effective_kb(kb, page)
        if _blockdev.effective_kb(kb, page) != kb:
            p.warnings.append(
                "read_ahead_kb %d is kept as %d by this kernel (pages of %d KiB)"
                % (kb, _blockdev.effective_kb(kb, page), page)
            )
        if record_before is not None and timer_active:
            # The window is open: keep its record (first originals) and its end; add new devices only.
            after = copy.deepcopy(record_before)
            after["read_ahead_kb"] = kb
            listed = {str(i.get("device")) for i in after["devices"] if isinstance(i, dict)}
            for dev in devices:
                if dev.name not in listed:
                    after["devices"].append({"device": dev.name, "dev": dev.dev, "original_kb": p.originals[dev.name]})
            p.record_after = after
        else:
            p.record_after = _blockdev.new_record(req.name, devices, p.originals, kb, duration, now)
            for item in (record_before or {}).get("devices", []):
                if isinstance(item, dict) and str(item.get("device")) not in p.originals:
                    p.record_after["devices"].append(item)  # still owed a restore
            p.arm_timer = True
        for dev in devices:
            if record_before is None and p.live_before[dev.name] == p.live_after[dev.name]:
                p.warnings.append(
                    "%s is already at read_ahead_kb %d with no open window; that value is recorded as its original"
                    % (dev.name, p.live_before[dev.name])
                )
        p.boot_path = os.path.join(req.systemd_dir, _blockdev.BOOT_UNIT)
        p.boot_before = _read_file("systemd_dir", p.boot_path)
        p.boot_after = _blockdev.render_boot_unit(req.python, req.lib_dir, req.state_dir, req.sysfs_root)
        p.boot_enabled = systemd.is_enabled(_blockdev.BOOT_UNIT) == "enabled"
        p.node_files = plan_node_files([_blockdev, _common], req.lib_dir)

    if req.persist:
        p.udev_path = os.path.join(req.udev_rules_dir, _blockdev.UDEV_RULES_NAME)
        p.udev_before = _read_file("udev_rules_dir", p.udev_path)
        entries = _blockdev.parse_udev_rules(p.udev_before)
        for dev in p.devices:
            entries[dev.name] = p.originals[dev.name]
        p.udev_after = _blockdev.render_udev_rules(entries)
    return p


def _read_file(option: str, path: str) -> Optional[str]:
    try:
        return read_text(path)
    except (OSError, UnicodeDecodeError) as err:
        raise UmaError(
            option, os.path.dirname(path), "cannot read %s (%s)" % (path, err), "Check permissions."
        ) from None


def _write_file(option: str, path: str, content: str) -> None:
    try:
        atomic_write(path, content, 0o644)
    except OSError as err:
        raise UmaError(
            option,
            os.path.dirname(path),
            "could not be written (%s: %s)" % (err.filename or path, err.strerror),
            "Run with become: true or choose a writable directory.",
        ) from None


def _snapshot(path: Optional[str]) -> Optional[Tuple[bytes, int]]:
    """The bytes and mode of ``path`` before execute (None: absent)."""
    if not path:
        return None
    try:
        with open(path, "rb") as handle:
            return handle.read(), os.stat(path).st_mode & 0o7777
    except OSError:
        return None


def _put_back(path: str, old: Optional[Tuple[bytes, int]]) -> None:
    """``path`` as it was: the old bytes (written atomically, old mode), or gone when it was absent."""
    if old is None:
        if os.path.lexists(path):
            os.unlink(path)
        return
    tmp = "%s.uma-undo.%d" % (path, os.getpid())
    try:
        with open(tmp, "wb") as handle:
            handle.write(old[0])
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, old[1])
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


class _Undo:
    """What execute changed, undone in reverse order when a later step fails (all or nothing)."""

    def __init__(self, dirs: Sequence[Optional[str]]) -> None:
        self.steps: List[Tuple[str, Callable[[], None]]] = []
        # directories execute may create: removed again (when empty) on a failure
        self.new_dirs = sorted({d for d in dirs if d and not os.path.exists(d)}, key=len, reverse=True)

    def add(self, what: str, step: Callable[[], None]) -> None:
        self.steps.append((what, step))

    def file(self, path: str) -> None:
        old = _snapshot(path)
        self.add(path, lambda: _put_back(path, old))

    def run(self) -> Tuple[List[str], List[str]]:
        """Undo everything; returns (what was put back, what could not be)."""
        done, failed = [], []
        for what, step in reversed(self.steps):
            try:
                step()
                done.append(what)
            except (OSError, UmaError) as err:
                failed.append("%s (%s)" % (what, getattr(err, "message", None) or err))
        for path in self.new_dirs:
            try:
                os.rmdir(path)
            except OSError:
                pass
        return done, failed


def _set_live(p: WindowPlan, undo: _Undo) -> None:
    """The live values, each set only after the one before it took; a refused one names its device."""
    for name, kb in sorted(p.live_changes.items()):
        dev = next(d for d in p.devices if d.name == name)
        try:
            _blockdev.write_ra(dev.ra_path, kb)
        except UmaError as err:
            raise UmaError(
                "read_ahead_kb", kb, "was refused for device %s: %s" % (name, err.problem), err.fix
            ) from None
        old = p.live_before.get(name)
        if old is not None:
            undo.add(
                "device %s read_ahead_kb back to %d" % (name, old),
                lambda d=dev, v=old: _blockdev.write_ra(d.ra_path, v),
            )


def _execute(p: WindowPlan, systemd: Systemd, undo: _Undo) -> None:
    req = p.request
    if req.state == "throttled":
        for item in p.node_files:
            if item.changed:
                undo.file(item.path)
        install_node_files(p.node_files)
        if p.boot_after is not None and p.boot_path is not None and p.boot_changed:
            if p.boot_before != p.boot_after:
                undo.file(p.boot_path)
                undo.add("daemon-reload", systemd.daemon_reload)
                _write_file("systemd_dir", p.boot_path, p.boot_after)
                systemd.daemon_reload()
            if not p.boot_enabled or p.boot_before != p.boot_after:
                if not p.boot_enabled:
                    unit = _blockdev.BOOT_UNIT
                    undo.add("disable " + unit, lambda: systemd.runner([systemd.systemctl, "disable", unit]) and None)
                systemd.enable(_blockdev.BOOT_UNIT)
        if p.record_after is not None and p.record_after != p.record_before:
            undo.file(p.record_path)
            _blockdev.write_record(p.record_path, p.record_after)
        if p.arm_timer:
            if p.timer_loaded:
                systemd.stop(p.timer)
                systemd.reset_failed(p.timer)
            service = p.timer[: -len(".timer")] + ".service"
            systemd.reset_failed(service)
            systemd.run(
                p.timer[: -len(".timer")],
                _blockdev.restore_command(req.python, req.lib_dir, req.sysfs_root, record=p.record_path),
                description="uma.vllm: end of readahead window %s (restore read_ahead_kb)" % req.name,
                properties=["Environment=PYTHONDONTWRITEBYTECODE=1"],
                timer_properties=["AccuracySec=1s"],
                on_active=p.duration,
            )
            undo.add("stop " + p.timer, lambda: systemd.stop(p.timer))
        _set_live(p, undo)
    else:
        # live values first: a refused one leaves the timer and the record of the open window as they were
        _set_live(p, undo)
        if p.stop_timer:
            systemd.stop(p.timer)
            systemd.reset_failed(p.timer)
        if p.record_before is not None or os.path.exists(p.record_path):
            try:
                os.unlink(p.record_path)
            except FileNotFoundError:
                pass
            except OSError as err:
                raise UmaError(
                    "state_dir",
                    req.state_dir,
                    "record %s cannot be deleted (%s)" % (p.record_path, err.strerror),
                    "Run with become: true.",
                ) from None
    if p.udev_changed and p.udev_path is not None and p.udev_after is not None:
        undo.file(p.udev_path)
        _write_file("udev_rules_dir", p.udev_path, p.udev_after)


def execute(p: WindowPlan, systemd: Systemd) -> None:
    """Carry out a plan, all or nothing. Throttle: programs, boot unit, record, timer, THEN live
    values; restore: live values, then timer and record. When a step fails, every step before it
    is undone (live values set back, files and the record put back byte for byte, an armed timer
    stopped, created directories removed) and the error names what failed."""
    req = p.request
    undo = _Undo(
        [req.lib_dir if any(f.changed for f in p.node_files) else None,
         os.path.dirname(p.record_path), os.path.dirname(p.boot_path or ""), os.path.dirname(p.udev_path or "")]
    )  # fmt: skip
    try:
        _execute(p, systemd, undo)
    except (UmaError, OSError) as err:
        if not isinstance(err, UmaError):
            err = UmaError("state", req.state, "failed (%s)" % err, "Check the node.")
        done, failed = undo.run()
        if failed:
            tail = "Undone: %s. NOT undone: %s - fix these by hand." % (", ".join(done) or "nothing", "; ".join(failed))
        else:
            tail = "Nothing was changed: %s." % (", ".join(done) + " put back" if done else "no step had run")
        raise UmaError(err.option, err.value, "%s. %s" % (err.problem.rstrip("."), tail), err.fix) from None


def result(p: WindowPlan, systemd_ok: bool = True) -> Dict[str, Any]:
    out: Dict[str, Any] = {
        "changed": p.changed,
        "state": p.request.state,
        "devices": p.device_report(),
        "read_ahead_kb": {
            "requested_kb": p.kb,
            "effective_kb": _blockdev.effective_kb(p.kb, p.page),
            "page_kb": p.page,
        },
        "window": p.window(),
        "record": p.record_after,
    }
    if p.request.state == "restored":
        out["restored"] = {
            "restored": [{"device": n, "read_ahead_kb": v} for n, v in sorted(p.live_after.items())],
            "skipped": p.skipped,
        }
    else:
        out["boot_unit"] = {"path": p.boot_path, "enabled": True, "changed": p.boot_changed}
        out["node_files"] = [f.summary() for f in p.node_files]
    if p.udev_path is not None:
        out["udev_rules"] = {
            "path": p.udev_path,
            "entries": _blockdev.parse_udev_rules(p.udev_after),
            "changed": p.udev_changed,
        }
    return out


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", default="throttled", choices=["throttled", "restored"]),
            name=dict(type="str", default="default"),
            path=dict(type="path"),
            device=dict(type="str"),
            read_ahead_kb=dict(type="raw", default=8),
            duration=dict(type="raw", default=180),
            persist=dict(type="bool", default=False),
            python=dict(type="str", default="/usr/bin/python3"),
            lib_dir=dict(type="str", default="/usr/local/lib/uma-vllm"),
            state_dir=dict(type="str", default="/var/lib/uma-vllm"),
            systemd_dir=dict(type="path", default="/etc/systemd/system"),
            udev_rules_dir=dict(type="path", default="/etc/udev/rules.d"),
            sysfs_root=dict(type="path", default="/sys"),
            proc_root=dict(type="path", default="/proc"),
        ),
        mutually_exclusive=[("path", "device")],
        supports_check_mode=True,
    )

    systemd = Systemd.for_module(module)
    request = WindowRequest(**module.params)
    try:
        p = plan(request, systemd)
    except UmaError as err:
        module.fail_json(msg=err.message, option=err.option)
    for warning in p.warnings:
        module.warn(warning)
    if p.changed and not module.check_mode:
        try:
            execute(p, systemd)
        except UmaError as err:
            module.fail_json(msg=err.message, option=err.option, **result(p))
    out = result(p)
    if module._diff:
        out["diff"] = p.diff()
    module.exit_json(**out)


if __name__ == "__main__":
    main()
