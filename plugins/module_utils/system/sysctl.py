# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pure logic of uma.vllm.uma_sysctl: sizing, validation, planning, applying.

The sysctl files' side (boot order, conflicts, byte-exact put-back) is in ``_sysctl_files``.

The module wrapper only maps options to :class:`SysctlRequest`, calls
:func:`plan`, and (outside check mode) :func:`execute`. Every path the logic
touches comes from the request, so tests run against temporary directories.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import (
    UmaError,
    atomic_write,
    atomic_write_json,
    check_path,
    read_meminfo,
    read_text,
)
from ansible_collections.uma.vllm.plugins.module_utils.node.base.memavail import (
    MAX_RESERVE_PERCENT,
    memavailable_cost,
    size_min_free_kbytes,
)
from ansible_collections.uma.vllm.plugins.module_utils.node.base.paths import STATE_DIR
from ansible_collections.uma.vllm.plugins.module_utils.system import sysctl_files as files

# The names this module has always had; write_live is looked up here at each write (the tests
# replace it to play a kernel that refuses a value).
normalize_key, normalize_value, parse_sysctl_text = files.normalize_key, files.normalize_value, files.parse_sysctl_text
boot_order, find_conflicts, read_live, render_file = (
    files.boot_order,
    files.find_conflicts,
    files.read_live,
    files.render_file,
)
write_live = files.write_live

GIB = 1024**3
MIB = 1024**2

# The order systemd-sysctl(8) searches; for equal file names the earlier
# directory wins, then all files are applied sorted by file name.
DEFAULT_SYSCTL_DIRS = [
    "/etc/sysctl.d",
    "/run/sysctl.d",
    "/usr/local/lib/sysctl.d",
    "/usr/lib/sysctl.d",
    "/lib/sysctl.d",
]
DEFAULT_SYSCTL_CONF = "/etc/sysctl.conf"
RECORD_NAME = "sysctl-original.json"

MIN_RAM_GIB = 1.0
MAX_SYSCTL_VALUE = 2**63 - 1

MANAGED_KEYS = ("vm.min_free_kbytes", "vm.vfs_cache_pressure", "vm.dirty_ratio", "vm.dirty_background_ratio")
_KEY_RE = re.compile(r"^vm\.[a-z0-9_]+$")
_VALUE_RE = re.compile(r"^-?[0-9]+( -?[0-9]+)*$")


@dataclass
class SysctlRequest:
    state: str = "present"
    min_free_kbytes: Any = None
    ram_gib: Any = None
    vfs_cache_pressure: Any = 200
    dirty_ratio: Any = 5
    dirty_background_ratio: Any = 2
    extra: Dict[str, Any] = field(default_factory=dict)
    path: str = "/etc/sysctl.d/90-vllm.conf"
    apply: bool = True
    conflicts: str = "warn"
    proc_root: str = "/proc"
    sysctl_dirs: List[str] = field(default_factory=lambda: list(DEFAULT_SYSCTL_DIRS))
    sysctl_conf: str = DEFAULT_SYSCTL_CONF
    state_dir: str = STATE_DIR


def _int_option(name: str, value: Any, fix: str) -> int:
    if isinstance(value, bool) or value is None:
        raise UmaError(name, value, "is not an integer", fix)
    if isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and re.fullmatch(r"\s*-?[0-9]+\s*", value, re.ASCII):
        number = int(value)
    else:
        raise UmaError(name, value, "is not an integer", fix)
    if number < 0:
        raise UmaError(name, value, "is negative", fix)
    return number


def _ratio(name: str, value: Any) -> int:
    fix = "Give a whole percentage from 1 to 100."
    number = _int_option(name, value, fix)
    if not 1 <= number <= 100:
        raise UmaError(name, value, "is outside 1-100", fix)
    return number


def resolve_ram(request: SysctlRequest) -> Tuple[int, str]:
    """RAM in bytes and where it came from (``ram_gib`` or MemTotal)."""
    if request.ram_gib is not None and request.ram_gib != "":
        value = request.ram_gib
        fix = "Give the host's RAM in GiB as a positive number (e.g. 121), or leave it unset to read MemTotal."
        if isinstance(value, bool):
            raise UmaError("ram_gib", value, "is not a number", fix)
        try:
            gib = float(value)
        except (TypeError, ValueError):
            raise UmaError("ram_gib", value, "is not a number", fix) from None
        if not math.isfinite(gib) or gib <= 0:
            raise UmaError("ram_gib", value, "must be positive", fix)
        if gib < MIN_RAM_GIB:
            raise UmaError(
                "ram_gib",
                value,
                "is below %g GiB, where the sizing rule has no room for a reserve" % MIN_RAM_GIB,
                fix,
            )
        if gib > 1 << 20:
            raise UmaError("ram_gib", value, "is larger than any machine", fix)
        return int(gib * GIB), "ram_gib"
    path = os.path.join(request.proc_root, "meminfo")
    try:
        total = read_meminfo(request.proc_root).get("MemTotal")
    except OSError as err:
        raise UmaError(
            "ram_gib",
            None,
            "is unset and %s (under proc_root) cannot be read (%s)" % (path, err.strerror),
            "Set ram_gib for this host, or point proc_root at the node's /proc.",
        ) from None
    if not total:
        raise UmaError(
            "ram_gib",
            None,
            "is unset and %s (under proc_root) has no MemTotal" % path,
            "Set ram_gib for this host, or point proc_root at the node's /proc.",
        )
    if total < MIN_RAM_GIB * GIB:
        raise UmaError(
            "ram_gib",
            None,
            "is unset and MemTotal in %s (under proc_root) is %d bytes, below %g GiB" % (path, total, MIN_RAM_GIB),
            "Set ram_gib for this host.",
        )
    return total, "MemTotal"


def takes_effect_here(request: SysctlRequest) -> bool:
    """True when the values reach this host's kernel: applied live, or read at boot."""
    if request.apply:
        return True
    directory = os.path.realpath(os.path.dirname(request.path))
    in_dirs = any(os.path.realpath(d) == directory for d in request.sysctl_dirs)
    return in_dirs or os.path.realpath(request.path) == os.path.realpath(request.sysctl_conf)


def _min_free(request: SysctlRequest, ram_bytes: int, sizing: Dict[str, Any]) -> int:
    """vm.min_free_kbytes: the explicit value within the kernel default and 10% of RAM, or the sized one."""
    if request.min_free_kbytes is None or request.min_free_kbytes == "":
        return sizing["min_free_kbytes"]
    kernel_default = sizing["kernel_default_kbytes"]
    ceiling_kb = ram_bytes * MAX_RESERVE_PERCENT // 100 // 1024
    fix = "Give kB between the kernel default %d and 10%% of RAM (%d), or leave it unset to size it from RAM." % (
        kernel_default,
        ceiling_kb,
    )
    min_free = _int_option("min_free_kbytes", request.min_free_kbytes, fix)
    if min_free < kernel_default and sizing["bounds_checked"]:
        raise UmaError(
            "min_free_kbytes",
            request.min_free_kbytes,
            "is below the kernel's own default of %d kB for %.1f GiB of RAM" % (kernel_default, ram_bytes / GIB),
            fix,
        )
    if min_free > ceiling_kb and sizing["bounds_checked"]:
        raise UmaError(
            "min_free_kbytes",
            request.min_free_kbytes,
            "is above 10%% of RAM (%d kB of %.1f GiB); the kernel would reclaim or OOM constantly"
            % (ceiling_kb, ram_bytes / GIB),
            fix,
        )
    if min_free == 0:
        raise UmaError("min_free_kbytes", request.min_free_kbytes, "is zero", fix)
    sizing["rule"] = "explicit"
    sizing["min_free_kbytes"] = min_free
    sizing["memavailable_reserve_bytes"] = memavailable_cost(ram_bytes, min_free)
    return min_free


def _cache_and_dirty(request: SysctlRequest) -> Tuple[int, int, int]:
    """vm.vfs_cache_pressure, vm.dirty_ratio and vm.dirty_background_ratio, checked together."""
    vfs = _int_option(
        "vfs_cache_pressure", request.vfs_cache_pressure, "Give a whole number such as 200 (100 is the kernel default)."
    )
    if vfs > 100000:
        raise UmaError("vfs_cache_pressure", request.vfs_cache_pressure, "is above 100000", "Give a value such as 200.")
    if vfs == 0:
        raise UmaError(
            "vfs_cache_pressure",
            request.vfs_cache_pressure,
            "is 0: the kernel would never reclaim dentries and inodes, which ends in out-of-memory",
            "Give a value from 1 to 100000, such as 200 (100 is the kernel default).",
        )
    dirty = _ratio("dirty_ratio", request.dirty_ratio)
    background = _ratio("dirty_background_ratio", request.dirty_background_ratio)
    if background >= dirty:
        raise UmaError(
            "dirty_background_ratio",
            request.dirty_background_ratio,
            "is not below dirty_ratio (%d); background writeback must start before writers are throttled" % dirty,
            "Give a dirty_background_ratio below dirty_ratio, e.g. 2 with dirty_ratio 5.",
        )
    return vfs, dirty, background


def _extra_key(raw_key: Any, raw_value: Any, managed: Dict[str, str]) -> str:
    """The vm.* key of one ``extra`` entry, refused when this module must not set it there."""
    key = files.normalize_key(str(raw_key))
    item = {raw_key: raw_value}
    if not _KEY_RE.match(key):
        raise UmaError(
            "extra",
            item,
            "key %r is not a vm.* sysctl" % raw_key,
            "This module manages only vm.* keys; use ansible.posix.sysctl for others.",
        )
    if key in managed:
        raise UmaError(
            "extra",
            item,
            "key %s has its own option" % key,
            "Set it with the option %s instead." % key.split(".", 1)[1],
        )
    if key in ("vm.dirty_bytes", "vm.dirty_background_bytes"):
        raise UmaError(
            "extra",
            item,
            "%s would override the dirty ratios this module sets" % key,
            "Use dirty_ratio / dirty_background_ratio instead.",
        )
    if key == "vm.drop_caches":
        raise UmaError(
            "extra",
            item,
            "vm.drop_caches is an action, not a setting",
            "Use uma.vllm.drop_cache_loop to evict page cache.",
        )
    return key


def _extra_value(request: SysctlRequest, raw_key: Any, raw_value: Any, key: str) -> str:
    """The value of one ``extra`` entry: whole numbers >= 0 the kernel holds, for a key this kernel has."""
    item = {raw_key: raw_value}
    if isinstance(raw_value, bool) or not isinstance(raw_value, (int, str)):
        raise UmaError("extra", item, "the value is not an integer", "Give whole numbers.")
    value = files.normalize_value(raw_value)
    if not _VALUE_RE.match(value):
        raise UmaError("extra", item, "the value is not an integer list", "Give whole numbers, space separated.")
    if value.startswith("-"):
        raise UmaError("extra", item, "the value is negative", "Give a value >= 0.")
    if any(int(part) > MAX_SYSCTL_VALUE for part in value.split()):
        raise UmaError(
            "extra",
            item,
            "the value is larger than any kernel setting holds (%d)" % MAX_SYSCTL_VALUE,
            "Give a value the kernel documents for %s." % key,
        )
    if os.path.isdir(os.path.join(request.proc_root, "sys", "vm")) and not os.path.exists(
        files.key_file(request.proc_root, key)
    ):
        raise UmaError(
            "extra", item, "this kernel has no %s" % key, "Check the spelling against /proc/sys/vm or drop the key."
        )
    return value


def desired_values(request: SysctlRequest) -> Tuple[Dict[str, str], Dict[str, Any]]:
    """Validate the request; return ``{key: value}`` to manage and the sizing record.

    Raises UmaError before anything is touched.
    """
    ram_bytes, ram_source = resolve_ram(request)
    sizing = size_min_free_kbytes(ram_bytes)
    sizing["ram_source"] = ram_source
    # The bounds belong to the host where the values take effect. A file
    # outside the boot search path, not applied live, is a rendering for some
    # other host: without its ram_gib this host's RAM says nothing about it.
    sizing["bounds_checked"] = ram_source == "ram_gib" or takes_effect_here(request)
    min_free = _min_free(request, ram_bytes, sizing)
    vfs, dirty, background = _cache_and_dirty(request)
    values = {
        "vm.min_free_kbytes": str(min_free),
        "vm.vfs_cache_pressure": str(vfs),
        "vm.dirty_ratio": str(dirty),
        "vm.dirty_background_ratio": str(background),
    }
    extra = request.extra or {}
    if not isinstance(extra, dict):
        raise UmaError(
            "extra", extra, "is not a mapping", "Give a dict of vm.* keys to values, e.g. {vm.swappiness: 10}."
        )
    for raw_key in sorted(extra):
        key = _extra_key(raw_key, extra[raw_key], values)
        values[key] = _extra_value(request, raw_key, extra[raw_key], key)
    return values, sizing


@dataclass
class SysctlPlan:
    state: str
    path: str
    values: Dict[str, str]
    sizing: Dict[str, Any]
    file_before: Optional[str]
    file_after: Optional[str]
    live_before: Dict[str, Optional[str]]
    live_after: Dict[str, Optional[str]]
    record_before: Optional[Dict[str, str]]
    record_after: Optional[Dict[str, str]]
    record_path: str
    conflicts: List[Dict[str, Any]]
    drift: Dict[str, Any]

    @property
    def file_changed(self) -> bool:
        return self.file_before != self.file_after

    @property
    def live_changed(self) -> Dict[str, Tuple[Optional[str], Optional[str]]]:
        return {
            k: (self.live_before.get(k), v)
            for k, v in self.live_after.items()
            if v is not None and self.live_before.get(k) != v
        }

    @property
    def changed(self) -> bool:
        return self.file_changed or bool(self.live_changed) or self.record_before != self.record_after

    def diff(self) -> List[Dict[str, str]]:
        def show(values: Dict[str, Optional[str]]) -> str:
            return "".join("%s = %s\n" % (k, "(absent)" if v is None else v) for k, v in sorted(values.items()))

        keys = sorted(self.live_after)
        return [
            {
                "before_header": self.path,
                "after_header": self.path,
                "before": self.file_before or "",
                "after": self.file_after or "",
            },
            {
                "before_header": "live values (%s)" % ", ".join(keys),
                "after_header": "live values (%s)" % ", ".join(keys),
                "before": show({k: self.live_before.get(k) for k in keys}),
                "after": show({k: self.live_after.get(k) for k in keys}),
            },
        ]


def _check_paths(request: SysctlRequest) -> None:
    """The request's state, policy and paths, refused before anything is read."""
    if request.state not in ("present", "absent"):
        raise UmaError("state", request.state, "is not a known state", "Use present or absent.")
    if request.conflicts not in ("warn", "fail", "ignore"):
        raise UmaError("conflicts", request.conflicts, "is not a known policy", "Use warn, fail or ignore.")
    if not request.path or not os.path.isabs(request.path) or not request.path.endswith(".conf"):
        raise UmaError("path", request.path, "is not an absolute *.conf path", "Give e.g. /etc/sysctl.d/90-vllm.conf.")
    for option in ("proc_root", "sysctl_conf", "state_dir", "path"):
        check_path(option, getattr(request, option))
    for directory in request.sysctl_dirs or []:
        check_path("sysctl_dirs", directory)
    if os.path.isdir(request.path):
        raise UmaError("path", request.path, "is a directory", "Give the path of the drop-in file.")
    parent = os.path.dirname(request.path)
    if os.path.lexists(parent) and not os.path.isdir(parent):
        raise UmaError("path", request.path, "has a parent that is not a directory", "Give a path in a directory.")
    if os.path.lexists(request.path) and not os.path.isfile(request.path):
        raise UmaError(
            "path",
            request.path,
            "is not a regular file (a dangling or looping link?)",
            "Remove it or give another path.",
        )
    if os.path.lexists(request.state_dir) and not os.path.isdir(request.state_dir):
        raise UmaError("state_dir", request.state_dir, "is not a directory", "Give a directory, e.g. %s." % STATE_DIR)
    if not request.state_dir or not os.path.isabs(request.state_dir):
        raise UmaError("state_dir", request.state_dir, "is not an absolute path", "Give e.g. %s." % STATE_DIR)


def _read_record(request: SysctlRequest, record_path: str, managed: Sequence[str]) -> Optional[Dict[str, str]]:
    """The operator's original values this module recorded before its first change (None: none).

    A record that is there but cannot be read as one (truncated, not UTF-8, not JSON, another shape)
    is never taken for "no record": state=absent would then delete the drop-in and restore nothing,
    and state=present would record the collection's own values as the originals. It is refused,
    naming the file and the keys whose original values it must hold (``managed``: the drop-in's)."""
    try:
        with open(record_path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise UmaError(
            "state_dir",
            request.state_dir,
            "%s cannot be read (%s)" % (record_path, err.strerror),
            "Remove what is in its place; it holds the operator's original values.",
        ) from None
    try:
        record = json.loads(raw.decode("utf-8"))
        problem = None if isinstance(record, dict) else "not a JSON object"
    except UnicodeDecodeError:
        record, problem = None, "not UTF-8 text"
    except ValueError:
        record, problem = None, "not JSON (truncated?)" if raw.strip() else "empty"
    if problem is None:
        bad = sorted(k for k, v in record.items() if not _KEY_RE.match(k) or not _record_value(v))
        problem = "its keys %s are not vm.* names with a number as value" % bad if bad else None
    if problem is not None:
        keys = sorted(set(managed) | (set(record) if isinstance(record, dict) else set())) or list(MANAGED_KEYS)
        example = ", ".join('"%s": "<original>"' % key for key in keys)
        raise UmaError(
            "state_dir",
            request.state_dir,
            "%s holds the operator's original sysctl values and is damaged (%s); it is not taken for "
            "no record, and nothing was changed" % (record_path, problem),
            "Write the node's original values back into it as JSON ({%s}), or remove it if the values the "
            "node has now are to stay." % example,
        )
    return record


def _record_value(value: Any) -> bool:
    """A recorded original: a sysctl value as text, or a whole number (not a bool)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, str) and bool(_VALUE_RE.match(value.strip()))


def _plan_absent(
    request: SysctlRequest, record_path: str, record_before: Optional[Dict[str, str]], file_before: Optional[str]
) -> SysctlPlan:
    """state=absent: the file goes, the recorded originals come back live, the record goes."""
    managed = sorted(files.parse_sysctl_text(file_before or "")) if file_before else []
    keys = sorted(set(managed) | set(record_before or {}))
    live_before = files.read_live(request.proc_root, keys)
    live_after = dict(live_before)
    if request.apply:
        for key, original in (record_before or {}).items():
            if live_before.get(key) is not None:
                live_after[key] = files.normalize_value(original)
    return SysctlPlan(
        state="absent",
        path=request.path,
        values={},
        sizing={},
        file_before=file_before,
        file_after=None,
        live_before=live_before,
        live_after=live_after,
        record_before=record_before,
        record_after=None,
        record_path=record_path,
        conflicts=[],
        drift={"file": files.file_drift(file_before, None), "live": {}},
    )


def _plan_present(
    request: SysctlRequest, record_path: str, record_before: Optional[Dict[str, str]], file_before: Optional[str]
) -> SysctlPlan:
    """state=present: the file, the live values, the originals to record, drift and boot conflicts."""
    values, sizing = desired_values(request)
    file_after = files.render_file(values, sizing)
    keys = sorted(values)
    live_before = files.read_live(request.proc_root, keys)
    missing = [k for k in keys if live_before[k] is None]
    if request.apply and missing and os.path.isdir(os.path.join(request.proc_root, "sys", "vm")):
        raise UmaError(
            "apply",
            True,
            "this kernel has no %s" % ", ".join(missing),
            "Drop those keys or set apply=false to only write the file.",
        )
    live_after = dict(live_before)
    record_after = dict(record_before or {})
    if request.apply:
        for key in keys:
            live_after[key] = values[key]
            if key not in record_after and live_before.get(key) is not None and live_before[key] != values[key]:
                record_after[key] = live_before[key]  # the operator's value, before our first change
    live_drift = {
        key: {"expected": values[key], "actual": live_before.get(key)}
        for key in keys
        if live_before.get(key) != values[key]
    }
    return SysctlPlan(
        state="present",
        path=request.path,
        values=values,
        sizing=sizing,
        file_before=file_before,
        file_after=file_after,
        live_before=live_before,
        live_after=live_after,
        record_before=record_before,
        record_after=record_after if record_after else record_before,
        record_path=record_path,
        conflicts=files.find_conflicts(request.path, keys, request.sysctl_dirs, request.sysctl_conf),
        drift={"file": files.file_drift(file_before, file_after), "live": live_drift},
    )


def plan(request: SysctlRequest) -> SysctlPlan:
    """Everything that would change, computed without touching anything."""
    _check_paths(request)
    record_path = os.path.join(request.state_dir, RECORD_NAME)
    file_before = read_text(request.path)
    managed = sorted(files.parse_sysctl_text(file_before)) if file_before else []
    record_before = _read_record(request, record_path, managed)
    if request.state == "absent":
        return _plan_absent(request, record_path, record_before, file_before)
    return _plan_present(request, record_path, record_before, file_before)


class _Rollback:
    """What execute changed, put back in reverse order when a later step fails."""

    def __init__(self, p: SysctlPlan, proc_root: str) -> None:
        self.p = p
        self.proc_root = proc_root
        self.old_record = files.raw_bytes(p.record_path) if os.path.isfile(p.record_path) else None
        self.old_file = files.raw_bytes(p.path) if os.path.isfile(p.path) else None
        self.old_file_mode = os.stat(p.path).st_mode & 0o7777 if self.old_file is not None else 0o644
        self.created = files.missing_dirs(p.record_path) + files.missing_dirs(p.path)
        self.done_live: List[Tuple[str, Optional[str]]] = []
        self.wrote_record = self.wrote_file = False

    def run(self) -> List[str]:
        """Undo everything; the problems of what could not be put back."""
        problems = []
        for key, before in reversed(self.done_live):
            if before is None:
                continue
            try:
                write_live(self.proc_root, key, before)
            except UmaError as err:
                problems.append("%s not restored to %s (%s)" % (key, before, err.problem))
        for wrote, path, raw, mode in (
            (self.wrote_file, self.p.path, self.old_file, self.old_file_mode),
            (self.wrote_record, self.p.record_path, self.old_record, 0o600),
        ):
            if wrote:
                try:
                    files.put_back(path, raw, mode)
                except OSError as err:
                    problems.append("%s not restored (%s)" % (path, err.strerror))
        for directory in sorted(set(self.created), key=len, reverse=True):
            try:
                os.rmdir(directory)
            except OSError:
                pass
        return problems

    def note(self) -> str:
        """Roll back and say how it went, for the end of the error's fix."""
        problems = self.run()
        if problems:
            return " Rollback incomplete: %s." % "; ".join(problems)
        return " Nothing was changed: live values, %s and the record are as before." % self.p.path


def _write_files(p: SysctlPlan, undo: _Rollback) -> None:
    """The record of originals first, then the drop-in file (each atomically)."""
    try:
        if p.record_after != p.record_before and p.record_after is not None:
            undo.wrote_record = True
            atomic_write_json(p.record_path, p.record_after, 0o600)
        if p.file_changed:
            undo.wrote_file = True
            if p.file_after is None:
                if os.path.lexists(p.path):
                    os.unlink(p.path)
            else:
                atomic_write(p.path, p.file_after, 0o644)
    except OSError as err:
        option = "state_dir" if undo.wrote_record and not undo.wrote_file else "path"
        value = os.path.dirname(p.record_path) if option == "state_dir" else p.path
        raise UmaError(
            option,
            value,
            "could not be written (%s: %s); the old file stays whole" % (err.filename, err.strerror),
            "Free space or fix permissions on that filesystem, then run again." + undo.note(),
        ) from None


def _write_live_values(p: SysctlPlan, proc_root: str, undo: _Rollback) -> None:
    """The live values, each set only after the one before it took."""
    for key, (before, after) in sorted(p.live_changed.items()):
        try:
            write_live(proc_root, key, after or "")
        except UmaError as err:
            raise UmaError(
                err.option,
                err.value,
                "the kernel refused %s = %s (%s)" % (key, after, err.problem),
                "Give a value this kernel accepts for %s, or set apply=false to only write the file." % key
                + undo.note(),
            ) from None
        undo.done_live.append((key, before))


def execute(p: SysctlPlan, proc_root: str) -> None:
    """Carry out a plan all-or-nothing: record, file, then live values.

    When any step fails (a full disk, a key the kernel refuses), the live
    values already set are put back, the file and the record are restored to
    their old bytes (or removed when they did not exist), directories created
    on the way are removed, and the error names the step, the key and what was
    rolled back.
    """
    undo = _Rollback(p, proc_root)
    _write_files(p, undo)
    _write_live_values(p, proc_root, undo)
    if p.state == "absent" and p.record_before is not None:
        try:
            os.unlink(p.record_path)
        except FileNotFoundError:
            pass
        except OSError:
            pass
