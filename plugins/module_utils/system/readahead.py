# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A readahead window: the logic of the ``readahead_window`` module (no Ansible import).

Runs inside the module on the node. The flow (plugins/module_utils/plumbing/flow.py) is :func:`plan`
(validate, resolve the devices, read the live values, the record, the timer, the boot unit and
the node programs; touches nothing) -> check mode / diff (:meth:`WindowPlan.diff`) ->
:func:`execute` (all or nothing) -> :func:`result`. The node-side restorer it installs is
``uma_readahead.py`` (``node/base/blockdev.py`` of the node package it installs whole), run by a
transient timer at the end of the window and by the boot unit after a crash.
"""

from __future__ import annotations

import copy
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ansible_collections.uma.vllm.plugins.module_utils.node.base import blockdev as _blockdev
from ansible_collections.uma.vllm.plugins.module_utils.node.base import paths as _paths
from ansible_collections.uma.vllm.plugins.module_utils.node.base.blockdev import BlockDevice
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import (
    UmaError,
    atomic_write,
    check_path,
    read_text,
    require_int,
)
from ansible_collections.uma.vllm.plugins.module_utils.node.base.systemd import Systemd, check_name
from ansible_collections.uma.vllm.plugins.module_utils.plumbing.diff import DifferenceTracker
from ansible_collections.uma.vllm.plugins.module_utils.plumbing.node_install import (
    NodeFile,
    install_node_files,
    package_dirs,
    plan_node_files,
)

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
    python: str = _paths.PYTHON
    lib_dir: str = _paths.LIB_DIR
    state_dir: str = _paths.STATE_DIR
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
    """The devices a record lists (checked when it was read: ``_read_record``)."""
    return [
        BlockDevice(
            name=item["device"],
            dev=item.get("dev", ""),
            sysfs_dir=os.path.join(sysfs_root, "class", "block", item["device"]),
            role="recorded",
        )
        for item in record.get("devices", [])
    ]


def _resolve_devices(req: WindowRequest) -> List[BlockDevice]:
    if req.path:
        return _blockdev.resolve_path(req.path, req.sysfs_root, req.proc_root)
    if req.device:
        return _blockdev.resolve_device(req.device, req.sysfs_root)
    return []


def _read_record(req: WindowRequest) -> Tuple[str, Optional[Dict[str, Any]]]:
    """The open window's record (None: none). A damaged one holds the devices' original values
    all the same: it is never taken for "no record" (a window would then record the value it set
    as the original, and state=restored would put nothing back); refused naming the file, the
    field and the fix, before anything changes."""
    record_path = _blockdev.record_path(req.state_dir, req.name)
    record_before, problem = _blockdev.read_record(record_path)
    if problem is not None:
        raise UmaError(
            "state_dir",
            req.state_dir,
            "holds a damaged readahead record: %s %s. It holds the devices' original read_ahead_kb values: "
            "it is not taken for no record, and nothing was changed" % (record_path, problem),
            "Write the devices' original values back into it (%s), or put each device's original "
            "read_ahead_kb back by hand and delete the record." % _blockdev.RECORD_EXAMPLE,
        )
    return record_path, record_before


def _recorded_originals(record: Optional[Dict[str, Any]]) -> Dict[str, int]:
    return {item["device"]: item["original_kb"] for item in (record or {}).get("devices", [])}


def _plan_restore(p: WindowPlan, devices: List[BlockDevice], recorded: Dict[str, int]) -> None:
    """state=restored: every named or recorded device that is still the same disk, back to its original."""
    req = p.request
    known = {d.name for d in devices}
    for dev in _devices_from_record(p.record_before or {}, req.sysfs_root):
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
        p.live_after[dev.name] = _blockdev.effective_kb(original, p.page)
    p.stop_timer = p.timer_loaded
    p.record_after = None


def _plan_record(p: WindowPlan, devices: List[BlockDevice], now: float) -> None:
    """state=throttled: the record after the run; an open window keeps its first originals and its end."""
    record_before = p.record_before
    if record_before is not None and p.timer_active:
        after = copy.deepcopy(record_before)
        after["read_ahead_kb"] = p.kb
        listed = {item["device"] for item in after["devices"]}
        for dev in devices:
            if dev.name not in listed:
                after["devices"].append({"device": dev.name, "dev": dev.dev, "original_kb": p.originals[dev.name]})
        p.record_after = after
        return
    p.record_after = _blockdev.new_record(p.request.name, devices, p.originals, p.kb, p.duration, now)
    for item in (record_before or {}).get("devices", []):
        if item["device"] not in p.originals:
            p.record_after["devices"].append(item)  # still owed a restore
    p.arm_timer = True


def _plan_throttle(
    p: WindowPlan, devices: List[BlockDevice], recorded: Dict[str, int], systemd: Systemd, now: float
) -> None:
    """state=throttled: live values, the record and timer, the boot unit and the node programs."""
    req, kb, page = p.request, p.kb, p.page
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
    _plan_record(p, devices, now)
    for dev in devices:
        if p.record_before is None and p.live_before[dev.name] == p.live_after[dev.name]:
            p.warnings.append(
                "%s is already at read_ahead_kb %d with no open window; that value is recorded as its original"
                % (dev.name, p.live_before[dev.name])
            )
    p.boot_path = os.path.join(req.systemd_dir, _blockdev.BOOT_UNIT)
    p.boot_before = _read_file("systemd_dir", p.boot_path)
    p.boot_after = _blockdev.render_boot_unit(req.python, req.lib_dir, req.state_dir, req.sysfs_root)
    p.boot_enabled = systemd.is_enabled(_blockdev.BOOT_UNIT) == "enabled"
    p.node_files = plan_node_files(req.lib_dir)  # the node package: uma_readahead.py runs from it


def _plan_udev(p: WindowPlan) -> None:
    """persist=true: the udev rule that sets each device's original at boot and hotplug."""
    p.udev_path = os.path.join(p.request.udev_rules_dir, _blockdev.UDEV_RULES_NAME)
    p.udev_before = _read_file("udev_rules_dir", p.udev_path)
    entries = _blockdev.parse_udev_rules(p.udev_before)
    for dev in p.devices:
        entries[dev.name] = p.originals[dev.name]
    p.udev_after = _blockdev.render_udev_rules(entries)


def plan(req: WindowRequest, systemd: Systemd, now: Optional[float] = None, page: Optional[int] = None) -> WindowPlan:
    """Everything the run would change, computed without touching anything."""
    checked = validate(req)
    now = time.time() if now is None else now
    page = _blockdev.page_kb() if page is None else page
    devices = _resolve_devices(req)
    systemd.require("state", req.state)
    record_path, record_before = _read_record(req)
    timer = _blockdev.TIMER_PREFIX + req.name + ".timer"
    shown = systemd.show(timer)
    p = WindowPlan(
        request=req,
        kb=checked["kb"],
        duration=checked["duration"],
        page=page,
        devices=[],
        originals={},
        live_before={},
        live_after={},
        record_path=record_path,
        record_before=record_before,
        record_after=None,
        timer=timer,
        timer_active=shown.get("ActiveState") == "active" and shown.get("SubState", "waiting") == "waiting",
        timer_loaded=shown.get("LoadState") == "loaded",
    )
    recorded = _recorded_originals(record_before)
    if req.state == "restored":
        _plan_restore(p, devices, recorded)
    else:
        _plan_throttle(p, devices, recorded, systemd, now)
    if req.persist:
        _plan_udev(p)
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
    atomic_write(path, old[0], old[1])  # an exclusive temp file, never a predictable name


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
    programs = [req.lib_dir, *package_dirs(req.lib_dir)] if any(f.changed for f in p.node_files) else []
    undo = _Undo(
        [*programs, os.path.dirname(p.record_path), os.path.dirname(p.boot_path or ""),
         os.path.dirname(p.udev_path or "")]
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
