#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: drop_cache_loop
short_description: Run the page-cache guard on the node under systemd while a model loads
version_added: 0.1.0
description:
  - Starts the page-cache guard (C(uma_guard.py)) as the transient systemd service C(uma-guard-NAME.service) on
    the node, so it keeps running after the Ansible connection that started it is gone, and stops by itself -
    after O(max_duration), when O(until_url) answers HTTP 200, or when process O(until_pid) exits.
  - The guard evicts the checkpoint's pages from the page cache once they are read, so the cache does not
    crowd out the GPU's allocations on a unified-memory machine (DGX Spark GB10, GH200, Jetson Thor).
    V(files) uses C(posix_fadvise) on O(paths) only, V(global) writes C(/proc/sys/vm/drop_caches) every tick,
    V(adaptive) acts only when the unmapped file cache grows more than O(threshold_mib) (on O(paths) when given,
    else globally).
  - The program and the C(_common.py) it imports are installed into O(lib_dir) from the collection's own
    source (a change only when the content differs).
  - O(state=started) when a guard with the same configuration already runs changes nothing; a different
    configuration (or a new program version) restarts it. Starting twice leaves one guard.
  - O(state=stopped) stops it (SIGTERM; the guard writes its final status) and returns the final status and
    statistics. A guard that already stopped by itself is reported unchanged with its last status.
  - Options are validated on the node before anything is touched; a refusal names the option, the value and
    the fix.
author:
  - uma.vllm developers (@uma-vllm)
extends_documentation_fragment:
  - uma.vllm.attributes
  - uma.vllm.attributes.NODE
options:
  state:
    description:
      - V(started) runs the guard (restarting it when the configuration differs).
      - V(stopped) stops it and returns its final status.
    type: str
    choices: [started, stopped]
    default: started
  name:
    description:
      - Name of the guard; the unit is C(uma-guard-NAME.service), the status C(RUN_DIR/guard-NAME.json).
      - 1-64 characters from C(A-Z a-z 0-9 _ . -), starting with a letter or digit.
    type: str
    required: true
  mode:
    description:
      - V(files) - evict only the files under O(paths) (no root needed by the guard itself, no collateral).
      - V(global) - write O(drop_level) to C(/proc/sys/vm/drop_caches) every tick (root; evicts every workload's
        cache). O(paths) must be empty.
      - V(adaptive) - act only when the unmapped file cache grew by O(threshold_mib) or C(MemAvailable) fell
        below O(min_available_mib); with O(paths) it evicts those files, without them it drops globally.
    type: str
    choices: [global, files, adaptive]
    default: adaptive
  paths:
    description:
      - Files or directories (walked recursively) on the node, typically the model directory. Absolute and
        existing. Required for O(mode=files).
    type: list
    elements: str
    default: []
  interval:
    description: Seconds between ticks (the adaptive mode polls faster while the cache grows). More than 0, at most 60.
    type: raw
    default: 0.1
  threshold_mib:
    description:
      - Growth of the unmapped file cache (MiB) that makes the adaptive mode act. 1 to 1048576.
      - The default is the guard's own (C(uma_guard.py --threshold-mib)), chosen by the page-cache benchmark.
    type: raw
    default: 16
  min_available_mib:
    description: The adaptive mode also acts while C(MemAvailable) is below this (MiB); 0 turns it off.
    type: raw
    default: 0
  drop_level:
    description: What a global drop writes to C(drop_caches) - 1 (page cache) or 3 (also dentries and inodes).
    type: int
    choices: [1, 3]
    default: 1
  max_duration:
    description:
      - Seconds after which the guard stops by itself, 1 to 86400. systemd also stops the unit 60 s later
        (C(RuntimeMaxSec)) should the guard hang.
    type: raw
    default: 900
  until_url:
    description: Stop when this http(s) URL answers HTTP 200 (for example vLLM's C(/health)).
    type: str
  until_pid:
    description: Stop when this process exits (for example the loader's PID). It must exist when the guard starts.
    type: raw
  samples_file:
    description: Also write one JSON line of memory figures per tick to this absolute path on the node.
    type: str
  python:
    description: The node's Python 3 interpreter that runs the guard.
    type: str
    default: /usr/bin/python3
  lib_dir:
    description: Where the guard program (C(uma_guard.py), C(_common.py)) is installed on the node.
    type: str
    default: /usr/local/lib/uma-vllm
  run_dir:
    description:
      - Where the guard's status (C(guard-NAME.json)) and the unit's configuration (C(guard-NAME.unit.json)) live.
    type: str
    default: /run/uma-vllm
  proc_root:
    description: Root of procfs, for the O(until_pid) and C(drop_caches) checks; tests point it at a temporary tree.
    type: path
    default: /proc
notes:
  - The unit is transient (C(systemd-run)); nothing of it survives a reboot, and neither does the status under
    C(/run). A reboot therefore never leaves a guard running.
  - C(/proc/sys/vm/drop_caches) is not namespaced; in a container a global drop empties the host's cache.
seealso:
  - module: uma.vllm.readahead_window
  - module: uma.vllm.uma_sysctl
"""

EXAMPLES = r"""
- name: Guard the page cache while vLLM loads Llama 70B, until the server is healthy (at most 15 min)
  uma.vllm.drop_cache_loop:
    name: llama70b
    mode: files
    paths:
      - /models/llama-3.1-70b
    until_url: http://127.0.0.1:8000/health
    max_duration: 900
  become: true

- name: The published global fix, bounded by the loader's lifetime
  uma.vllm.drop_cache_loop:
    name: loader
    mode: global
    interval: 1
    until_pid: "{{ loader.pid }}"
  become: true

- name: Stop it and keep its statistics
  uma.vllm.drop_cache_loop:
    name: llama70b
    state: stopped
  become: true
  register: guard

- name: Show what it did
  ansible.builtin.debug:
    msg: "evicted {{ guard.status.evicted_bytes }} bytes, peak cache growth {{ guard.status.peak_growth_mib }} MiB"
"""

RETURN = r"""
unit:
  description: The systemd unit of the guard.
  returned: always
  type: str
  sample: uma-guard-llama70b.service
active:
  description: Whether the guard runs after this task (predicted in check mode).
  returned: always
  type: bool
  sample: true
action:
  description: What the task did (or would do) - V(started), V(restarted), V(unchanged), V(stopped) or V(none).
  returned: always
  type: str
  sample: started
pid:
  description: The guard's process id (C(MainPID) of the unit), 0 when it does not run.
  returned: always
  type: int
  sample: 4242
config:
  description: The guard's configuration as the module passes it.
  returned: always
  type: dict
  sample: {"mode": "files", "paths": ["/models/llama-3.1-70b"], "interval": 0.1, "threshold_mib": 16,
           "min_available_mib": 0, "drop_level": 1, "max_duration": 900.0, "until_url": null, "until_pid": null,
           "samples_file": null}
fingerprint:
  description: Fingerprint of the configuration and the program version, kept in the unit's description.
  returned: always
  type: str
  sample: 3f2a9c0d1e4b5a67
status_file:
  description: The guard's status file on the node.
  returned: always
  type: str
  sample: /run/uma-vllm/guard-llama70b.json
status:
  description:
    - The guard's status JSON (C(null) before its first run) - C(name), C(mode), C(pid), C(state) (V(running) or
      V(stopped)), C(started_at), C(stopped_at), C(elapsed_s), C(ticks), C(evictions), C(evicted_bytes),
      C(baseline_cache_mib), C(peak_cache_mib), C(peak_growth_mib), C(peak_mapped_mib), C(min_available_mib),
      C(cpu_seconds), C(stop_reason) (V(max_duration), V(until_url), V(until_pid), V(signal) or C(error...)) and
      C(config).
  returned: always
  type: dict
  sample: {"name": "llama70b", "state": "stopped", "stop_reason": "until_url", "elapsed_s": 212.4,
           "evictions": 1310, "evicted_bytes": 139586437120, "peak_growth_mib": 61.2, "cpu_seconds": 3.1}
node_files:
  description: The node-side programs in O(lib_dir), whether this run wrote them, and their checksums.
  returned: when state is started
  type: list
  elements: dict
  sample: [{"path": "/usr/local/lib/uma-vllm/uma_guard.py", "changed": false, "sha256": "9c1e...",
            "sha256_before": "9c1e..."}]
"""

import hashlib
import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional
from urllib.parse import urlparse

from ansible_collections.uma.vllm.plugins.module_utils import _common, uma_guard
from ansible_collections.uma.vllm.plugins.module_utils._common import (
    UmaError,
    atomic_write_json,
    check_path,
    read_json,
    require_int,
)
from ansible_collections.uma.vllm.plugins.module_utils._module import strict_module
from ansible_collections.uma.vllm.plugins.module_utils._nodefiles import (
    NodeFile,
    files_fingerprint,
    install_node_files,
    plan_node_files,
)
from ansible_collections.uma.vllm.plugins.module_utils._systemd import Systemd, check_name, description_fingerprint

UNIT_PREFIX = "uma-guard-"
RUNTIME_MARGIN_S = 60
MAX_DURATION_S = 86400
MAX_INTERVAL_S = 60.0
MAX_THRESHOLD_MIB = 1048576
START_WAIT_S = 10.0
UNLOAD_WAIT_S = 30.0
POLL_S = 0.25
ACTIVE_STATES = ("active", "activating", "reloading")

_sleep = time.sleep
_clock = time.monotonic


@dataclass
class GuardRequest:
    state: str = "started"
    name: str = ""
    mode: str = "adaptive"
    paths: List[str] = field(default_factory=list)
    interval: Any = 0.1
    threshold_mib: Any = 16
    min_available_mib: Any = 0
    drop_level: Any = 1
    max_duration: Any = 900
    until_url: Optional[str] = None
    until_pid: Any = None
    samples_file: Optional[str] = None
    python: str = "/usr/bin/python3"
    lib_dir: str = "/usr/local/lib/uma-vllm"
    run_dir: str = "/run/uma-vllm"
    proc_root: str = "/proc"


@dataclass
class GuardPlan:
    request: GuardRequest
    unit: str
    status_file: str
    sidecar: str
    config: Dict[str, Any]
    fingerprint: str
    action: str  # started / restarted / unchanged / stopped / none
    active_before: bool
    pid_before: int
    config_before: Optional[Dict[str, Any]]
    node_files: List[NodeFile] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.action in ("started", "restarted", "stopped") or any(f.changed for f in self.node_files)

    @property
    def active_after(self) -> bool:
        return self.request.state == "started"

    def diff(self) -> Dict[str, Any]:
        return {
            "before": {"active": self.active_before, "config": self.config_before},
            "after": {
                "active": self.active_after,
                "config": self.config if self.active_after else None,
            },
        }


def _number(option: str, value: Any, minimum_exclusive: float, maximum: float, fix: str) -> float:
    if isinstance(value, bool):
        raise UmaError(option, value, "is a boolean, not a number", fix)
    if isinstance(value, str) and not value.isascii():
        raise UmaError(option, value, "is not a number (digits 0-9 only)", fix)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UmaError(option, value, "is not a number", fix) from None
    if math.isnan(number) or not minimum_exclusive < number <= maximum:
        raise UmaError(option, value, "must be > %g and <= %g" % (minimum_exclusive, maximum), fix)
    return number


def validate(req: GuardRequest) -> Dict[str, Any]:
    """The guard's configuration, or UmaError naming the bad option. Reads the node, changes nothing."""
    if req.state not in ("started", "stopped"):
        raise UmaError("state", req.state, "is not a known state", "Use started or stopped.")
    check_name("name", req.name)
    for option in ("python", "lib_dir", "run_dir"):
        value = getattr(req, option)
        if not isinstance(value, str) or not os.path.isabs(value) or any(c.isspace() for c in value):
            raise UmaError(
                option, value, "is not an absolute path without spaces", "Give e.g. /usr/local/lib/uma-vllm."
            )
    check_path("proc_root", req.proc_root, fix="Give the node's /proc.")
    for option in ("lib_dir", "run_dir"):
        value = getattr(req, option)
        if os.path.lexists(value) and not os.path.isdir(value):
            raise UmaError(option, value, "exists and is not a directory", "Give a directory (or a path to create).")
    for name in ("guard-%s.json" % req.name, "guard-%s.unit.json" % req.name):
        path = os.path.join(req.run_dir, name)
        if os.path.lexists(path) and (os.path.islink(path) or not os.path.isfile(path)):
            raise UmaError(
                "run_dir",
                req.run_dir,
                "holds %s, which is not a regular file" % path,
                "Remove it; the module writes the guard's status there.",
            )
    if req.state == "stopped":
        return {}
    if req.mode not in uma_guard.MODES:
        raise UmaError("mode", req.mode, "is not a known mode", "Use files, global or adaptive.")
    paths = req.paths or []
    if not isinstance(paths, list):
        raise UmaError("paths", paths, "is not a list", "Give a list of absolute paths.")
    if req.mode == "files" and not paths:
        raise UmaError("paths", paths, "is empty but mode=files evicts only these", "Give the model directory.")
    if req.mode == "global" and paths:
        raise UmaError(
            "paths",
            paths,
            "has no effect with mode=global (it drops every file's cache)",
            "Use mode=files or adaptive.",
        )
    clean = []
    for path in paths:
        if not isinstance(path, str) or not os.path.isabs(path):
            raise UmaError("paths", path, "is not an absolute path", "Give absolute paths such as /models/llama.")
        if not os.path.exists(path):
            raise UmaError("paths", path, "does not exist on the node", "Give existing files or directories.")
        clean.append(os.path.normpath(path))
    interval = _number("interval", req.interval, 0.0, MAX_INTERVAL_S, "Give seconds between ticks, e.g. 0.1 or 1.")
    if interval < 0.01:
        raise UmaError("interval", req.interval, "is below 0.01 s", "Give at least 0.01 (the default 0.1 is cheap).")
    threshold = require_int("threshold_mib", req.threshold_mib, 1, MAX_THRESHOLD_MIB, "Give MiB, e.g. 32.")
    min_available = require_int("min_available_mib", req.min_available_mib, 0, MAX_THRESHOLD_MIB, "Give MiB, 0 = off.")
    drop_level = require_int("drop_level", req.drop_level, 1, 3, "Give 1 or 3.")
    if drop_level not in (1, 3):
        raise UmaError("drop_level", req.drop_level, "is not 1 or 3", "Give 1 (page cache) or 3 (also slab).")
    max_duration = _number(
        "max_duration", req.max_duration, 0.0, MAX_DURATION_S, "Give the longest a load may take, e.g. 900 seconds."
    )
    if max_duration < 1:
        raise UmaError("max_duration", req.max_duration, "is below 1 second", "Give e.g. 900.")
    url = req.until_url
    if url is not None:
        parsed = urlparse(url) if isinstance(url, str) else None
        if (
            parsed is None
            or parsed.scheme not in ("http", "https")
            or not parsed.netloc
            or any(c.isspace() for c in url)
        ):
            raise UmaError("until_url", url, "is not an http(s) URL", "Use e.g. http://127.0.0.1:8000/health.")
    pid = None
    if req.until_pid is not None and req.until_pid != "":
        pid = require_int("until_pid", req.until_pid, 1, 4194304, "Give the loader's process id.")
        if not os.path.exists(os.path.join(req.proc_root, str(pid))):
            raise UmaError(
                "until_pid",
                req.until_pid,
                "is not a running process on the node (no %s under proc_root)" % os.path.join(req.proc_root, str(pid)),
                "Start the loader first, then the guard.",
            )
    samples = req.samples_file
    if samples is not None and (not isinstance(samples, str) or not os.path.isabs(samples)):
        raise UmaError("samples_file", samples, "is not an absolute path", "Give e.g. /var/tmp/guard-samples.jsonl.")
    if samples is not None:
        check_path("samples_file", samples, fix="Give e.g. /var/tmp/guard-samples.jsonl.")
        if os.path.lexists(samples) and (os.path.islink(samples) or not os.path.isfile(samples)):
            raise UmaError(
                "samples_file",
                samples,
                "exists and is a symlink or not a regular file (the root guard never follows links)",
                "Give a new file in a directory only root can write, e.g. /run/uma-vllm/samples-NAME.jsonl.",
            )
        if not os.path.isdir(os.path.dirname(samples)):
            raise UmaError(
                "samples_file", samples, "is not in an existing directory", "Give a file in an existing directory."
            )
        info = os.stat(os.path.dirname(samples))
        if info.st_uid != os.geteuid() or info.st_mode & 0o022:
            raise UmaError(
                "samples_file",
                samples,
                "is in a directory another user can write (the root guard would write where they point it)",
                "Give a file in a directory only root can write, e.g. /run/uma-vllm/samples-NAME.jsonl.",
            )
    needs_drop = req.mode == "global" or (req.mode == "adaptive" and not clean)
    drop = os.path.join(req.proc_root, "sys", "vm", "drop_caches")
    if needs_drop and not os.access(drop, os.W_OK):
        raise UmaError(
            "mode",
            req.mode,
            "drops caches globally here and %s is not writable" % drop,
            "Run with become: true, or give paths (mode files/adaptive) to evict only the model's files.",
        )
    if not os.access(req.python, os.X_OK):
        raise UmaError("python", req.python, "is not an executable on the node", "Give the node's python3.")
    return {
        "mode": req.mode,
        "paths": clean,
        "interval": interval,
        "threshold_mib": threshold,
        "min_available_mib": min_available,
        "drop_level": drop_level,
        "max_duration": max_duration,
        "until_url": url,
        "until_pid": pid,
        "samples_file": samples,
    }


def _fmt(number: float) -> str:
    return "%g" % number


def guard_command(req: GuardRequest, config: Dict[str, Any], status_file: str) -> List[str]:
    argv = [req.python, os.path.join(req.lib_dir, "uma_guard.py"), "--name", req.name, "--mode", config["mode"]]
    if config["paths"]:
        argv += ["--paths", *config["paths"]]
    argv += [
        "--interval",
        _fmt(config["interval"]),
        "--threshold-mib",
        str(config["threshold_mib"]),
        "--min-available-mib",
        str(config["min_available_mib"]),
        "--drop-level",
        str(config["drop_level"]),
        "--max-duration",
        _fmt(config["max_duration"]),
    ]
    if config["until_url"]:
        argv += ["--until-url", config["until_url"]]
    if config["until_pid"]:
        argv += ["--until-pid", str(config["until_pid"])]
    argv += ["--status-file", status_file]
    if config["samples_file"]:
        argv += ["--samples-file", config["samples_file"]]
    if req.proc_root != "/proc":
        argv += ["--proc-root", req.proc_root]
    return argv


def _read_json(path: str) -> Any:
    """JSON content, or None when missing, unreadable or not JSON (never an exception)."""
    try:
        return read_json(path)
    except (OSError, UnicodeDecodeError):
        return None


def _pid(value: str) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


def plan(req: GuardRequest, systemd: Systemd) -> GuardPlan:
    config = validate(req)
    unit = UNIT_PREFIX + req.name + ".service"
    status_file = os.path.join(req.run_dir, "guard-%s.json" % req.name)
    sidecar = os.path.join(req.run_dir, "guard-%s.unit.json" % req.name)
    node_files: List[NodeFile] = []
    fingerprint = ""
    if req.state == "started":
        node_files = plan_node_files([uma_guard, _common], req.lib_dir)
        digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode("utf-8"))
        digest.update(files_fingerprint(node_files).encode("ascii"))
        fingerprint = digest.hexdigest()[:16]
    systemd.require("state", req.state)
    shown = systemd.show(unit)
    active = shown.get("ActiveState") in ACTIVE_STATES
    running_fp = description_fingerprint(shown.get("Description", "")) if active else None
    sidecar_data = _read_json(sidecar)
    config_before: Optional[Dict[str, Any]] = None
    if active:
        if isinstance(sidecar_data, dict) and sidecar_data.get("fingerprint") == running_fp:
            config_before = sidecar_data.get("config")
        else:
            config_before = {"fingerprint": running_fp}
    if req.state == "started":
        action = "started" if not active else ("unchanged" if running_fp == fingerprint else "restarted")
    else:
        action = "stopped" if active else "none"
        config = config_before or {}
    return GuardPlan(
        request=req,
        unit=unit,
        status_file=status_file,
        sidecar=sidecar,
        config=config,
        fingerprint=fingerprint,
        action=action,
        active_before=active,
        pid_before=_pid(shown.get("MainPID", "0")) if active else 0,
        config_before=config_before,
        node_files=node_files,
    )


def _wait_unloaded(systemd: Systemd, unit: str) -> None:
    deadline = _clock() + UNLOAD_WAIT_S
    while True:
        shown = systemd.show(unit)
        if shown.get("LoadState") != "loaded" or shown.get("ActiveState") in ("inactive", "failed"):
            systemd.reset_failed(unit)
            return
        if _clock() >= deadline:
            raise UmaError(
                "name",
                unit,
                "is still %s after %d s" % (shown.get("ActiveState"), UNLOAD_WAIT_S),
                "Check 'systemctl status %s' on the node and stop it by hand." % unit,
            )
        _sleep(POLL_S)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as err:
        raise UmaError(
            "run_dir", os.path.dirname(path), "cannot remove %s (%s)" % (path, err.strerror), "Check permissions."
        ) from None


def execute(p: GuardPlan, systemd: Systemd, warn: Any = None) -> Dict[str, Any]:
    """Carry out the plan; returns the guard's status afterwards."""
    req = p.request
    if req.state == "stopped":
        if p.action == "stopped":
            systemd.stop(p.unit)
            _wait_unloaded(systemd, p.unit)
        return {"status": _read_json(p.status_file), "pid": 0}

    install_node_files(p.node_files)
    if p.action == "unchanged":
        shown = systemd.show(p.unit)
        return {"status": _read_json(p.status_file), "pid": _pid(shown.get("MainPID", "0"))}
    try:
        os.makedirs(req.run_dir, mode=0o755, exist_ok=True)
        if p.action == "restarted":
            systemd.stop(p.unit)
        _wait_unloaded(systemd, p.unit)
        _unlink(p.status_file)  # any status from now on is the new guard's
        atomic_write_json(
            p.sidecar,
            {"unit": p.unit, "fingerprint": p.fingerprint, "config": p.config, "started_at": int(time.time())},
        )
    except OSError as err:
        raise UmaError(
            "run_dir",
            req.run_dir,
            "cannot be written (%s: %s)" % (err.filename, err.strerror),
            "Run with become: true.",
        ) from None
    try:
        _run_unit(p, systemd)
    except UmaError:
        # Another play may have started the same guard a moment ago: that is the guard we want.
        shown = systemd.show(p.unit)
        if (
            shown.get("ActiveState") in ACTIVE_STATES
            and description_fingerprint(shown.get("Description", "")) == p.fingerprint
        ):
            return {"status": _read_json(p.status_file), "pid": _pid(shown.get("MainPID", "0"))}
        raise
    return _wait_for_status(p, systemd, warn)


def guard_hardening(req: GuardRequest, config: Dict[str, Any]) -> List[str]:
    """Least privilege for the guard's unit: only what its mode needs (issue 10).

    It reads the model files and /proc, writes its status (and samples) under run_dir, and
    only in global/adaptive-without-paths mode writes /proc/sys/vm/drop_caches (CAP_SYS_ADMIN,
    kernel tunables writable). Everything else is read-only or absent. No MemoryDenyWriteExecute:
    the guard imports ctypes, whose import makes a libffi closure on some platforms.
    """
    drops = config.get("mode") == "global" or (config.get("mode") == "adaptive" and not config.get("paths"))
    writable = [req.run_dir]
    if config.get("samples_file"):
        writable.append(os.path.dirname(config["samples_file"]))
    props = [
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ReadWritePaths=%s" % " ".join("-" + w for w in writable),
        "ProtectHome=read-only",
        "PrivateTmp=yes",
        "PrivateDevices=yes",
        "PrivateNetwork=%s" % ("no" if config.get("until_url") else "yes"),
        "ProtectKernelModules=yes",
        "ProtectKernelLogs=yes",
        "ProtectControlGroups=yes",
        "ProtectClock=yes",
        "ProtectHostname=yes",
        "RestrictNamespaces=yes",
        "RestrictRealtime=yes",
        "RestrictSUIDSGID=yes",
        "LockPersonality=yes",
        "SystemCallArchitectures=native",
        "RestrictAddressFamilies=%s" % ("AF_UNIX AF_INET AF_INET6" if config.get("until_url") else "AF_UNIX"),
        "CapabilityBoundingSet=%s" % ("CAP_DAC_READ_SEARCH CAP_SYS_ADMIN" if drops else "CAP_DAC_READ_SEARCH"),
    ]
    if not drops:
        props.append("ProtectKernelTunables=yes")
    return props


def _run_unit(p: GuardPlan, systemd: Systemd) -> None:
    req = p.request
    systemd.run(
        p.unit[: -len(".service")],
        guard_command(req, p.config, p.status_file),
        description="uma.vllm page-cache guard %s [sha256:%s]" % (req.name, p.fingerprint),
        properties=[
            "Type=exec",
            "RuntimeMaxSec=%d" % (int(p.config["max_duration"]) + RUNTIME_MARGIN_S),
            "TimeoutStopSec=20",
            "Environment=PYTHONDONTWRITEBYTECODE=1",
            *guard_hardening(req, p.config),
        ],
    )


def _wait_for_status(p: GuardPlan, systemd: Systemd, warn: Any) -> Dict[str, Any]:
    """Wait until the new guard wrote its first status (or exited); fail when it could not run."""
    req = p.request
    deadline = _clock() + START_WAIT_S
    while True:
        shown = systemd.show(p.unit)
        status = _read_json(p.status_file)
        running = shown.get("ActiveState") in ACTIVE_STATES
        if isinstance(status, dict) and status.get("state") in ("running", "stopped"):
            reason = str(status.get("stop_reason") or "")
            if status.get("state") == "stopped" and reason.startswith("error"):
                raise UmaError(
                    "name",
                    req.name,
                    "guard stopped right after it started (%s)" % reason,
                    "Fix the cause and run again.",
                )
            if status.get("state") == "stopped" and warn is not None:
                warn("the guard %s stopped right after it started (stop_reason %s)" % (req.name, reason))
            return {"status": status, "pid": _pid(shown.get("MainPID", "0")) if running else 0}
        if not running:
            journal = systemd.journal_tail(p.unit)
            raise UmaError(
                "name",
                req.name,
                "guard exited without writing a status%s" % (": " + journal.replace("\n", " | ") if journal else ""),
                "See 'journalctl -u %s' on the node." % p.unit,
            )
        if _clock() >= deadline:
            if warn is not None:
                warn("the guard %s runs but wrote no status within %d s" % (req.name, START_WAIT_S))
            return {"status": None, "pid": _pid(shown.get("MainPID", "0"))}
        _sleep(POLL_S)


def result(p: GuardPlan, status: Optional[Dict[str, Any]], pid: int, active: Optional[bool] = None) -> Dict[str, Any]:
    out = {
        "changed": p.changed,
        "unit": p.unit,
        "active": p.active_after if active is None else active,
        "action": p.action,
        "pid": pid,
        "config": p.config,
        "fingerprint": p.fingerprint,
        "status_file": p.status_file,
        "status": status,
    }
    if p.request.state == "started":
        out["node_files"] = [f.summary() for f in p.node_files]
    return out


def main() -> None:
    module = strict_module(
        argument_spec=dict(
            state=dict(type="str", default="started", choices=["started", "stopped"]),
            name=dict(type="str", required=True),
            mode=dict(type="str", default="adaptive", choices=["global", "files", "adaptive"]),
            paths=dict(type="list", elements="str", default=[]),
            interval=dict(type="raw", default=0.1),
            threshold_mib=dict(type="raw", default=16),
            min_available_mib=dict(type="raw", default=0),
            drop_level=dict(type="int", default=1, choices=[1, 3]),
            max_duration=dict(type="raw", default=900),
            until_url=dict(type="str"),
            until_pid=dict(type="raw"),
            samples_file=dict(type="str"),
            python=dict(type="str", default="/usr/bin/python3"),
            lib_dir=dict(type="str", default="/usr/local/lib/uma-vllm"),
            run_dir=dict(type="str", default="/run/uma-vllm"),
            proc_root=dict(type="path", default="/proc"),
        ),
        supports_check_mode=True,
    )

    systemd = Systemd.for_module(module)
    request = GuardRequest(**module.params)
    try:
        p = plan(request, systemd)
    except UmaError as err:
        module.fail_json(msg=err.message, option=err.option)
    status = _read_json(p.status_file)
    pid = p.pid_before if p.active_after else 0
    active = None
    if p.changed and not module.check_mode:
        try:
            done = execute(p, systemd, module.warn)
        except UmaError as err:
            module.fail_json(msg=err.message, option=err.option, **result(p, _read_json(p.status_file), 0))
        status, pid = done["status"], done["pid"]
        active = pid > 0
    out = result(p, status, pid, active)
    if module._diff:
        out["diff"] = p.diff()
    module.exit_json(**out)


if __name__ == "__main__":
    main()
