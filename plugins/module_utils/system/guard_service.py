# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The page-cache guard as a transient systemd service: the logic of the ``drop_cache_loop`` module.

Runs inside the module (on the node, under Ansible), not as a node program. The flow is
:func:`plan` (validate, read the unit and the installed program, decide the action; touches
nothing) -> check mode / diff -> :func:`execute` (install the program, start or stop the unit,
wait for the guard's first status) -> :func:`result`. The guard's own options are validated by
:class:`GuardConfig`, the validator the guard's command line and the launcher use too.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ansible_collections.uma.vllm.plugins.module_utils.node.base import paths as _paths
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import (
    UmaError,
    atomic_write_json,
    check_path,
    read_record_file,
)
from ansible_collections.uma.vllm.plugins.module_utils.node.base.systemd import (
    Systemd,
    check_name,
    description_fingerprint,
)
from ansible_collections.uma.vllm.plugins.module_utils.node.guard.config import GuardConfig, check_on_node
from ansible_collections.uma.vllm.plugins.module_utils.plumbing.diff import DifferenceTracker
from ansible_collections.uma.vllm.plugins.module_utils.plumbing.node_install import (
    NodeFile,
    files_fingerprint,
    install_node_files,
    plan_node_files,
)

# The guard's configuration as the module passes it (and fingerprints it).
CONFIG_KEYS = (
    "mode",
    "paths",
    "interval",
    "threshold_mib",
    "min_available_mib",
    "act_below_free_mib",
    "drop_level",
    "max_duration",
    "until_url",
    "until_pid",
    "samples_file",
)
UNIT_PREFIX = "uma-guard-"
RUNTIME_MARGIN_S = 60
START_WAIT_S = 10.0
UNLOAD_WAIT_S = 30.0
POLL_S = 0.25
ACTIVE_STATES = ("active", "activating", "reloading")

_sleep = time.sleep
_clock = time.monotonic


@dataclass
class GuardRequest(GuardConfig):
    """The module's options: the guard's own (GuardConfig) and where and how it runs on the node."""

    state: str = "started"
    python: str = _paths.PYTHON
    lib_dir: str = _paths.LIB_DIR
    run_dir: str = _paths.RUN_DIR


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
        tracker = DifferenceTracker()
        tracker.add("active", self.active_before, self.active_after)
        tracker.add("config", self.config_before, self.config if self.active_after else None)
        return tracker.before_after()


def validate(req: GuardRequest) -> Dict[str, Any]:
    """The guard's configuration, or UmaError naming the bad option. Reads the node, changes nothing.

    The guard's own options go through GuardConfig (the one validator the guard's command line and
    the launcher use too); what is checked here is the module's own: the unit name, the paths it
    installs and writes to.
    """
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
    if req.samples_file is not None:
        check_path("samples_file", req.samples_file, fix="Give e.g. /var/tmp/guard-samples.jsonl.")
    config = req.validated(absolute_paths=True)
    check_on_node(config)
    if not os.access(req.python, os.X_OK):
        raise UmaError("python", req.python, "is not an executable on the node", "Give the node's python3.")
    return {key: getattr(config, key) for key in CONFIG_KEYS}


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
        "--act-below-free-mib",
        str(config["act_below_free_mib"]),
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


def read_status(path: str) -> Optional[Dict[str, Any]]:
    """The guard's status (or the unit's sidecar) as a JSON object, or None when it is missing or
    damaged: read through the node programs' one record reader (never an exception, never a hang
    on a FIFO, no symlink followed, no NaN/Infinity or number beyond 64 bits taken)."""
    value, _problem = read_record_file(path, dict)
    return value


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
        node_files = plan_node_files(req.lib_dir)  # the node package: uma_guard.py runs from it
        digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode("utf-8"))
        digest.update(files_fingerprint(node_files).encode("ascii"))
        fingerprint = digest.hexdigest()[:16]
    systemd.require("state", req.state)
    shown = systemd.show(unit)
    active = shown.get("ActiveState") in ACTIVE_STATES
    running_fp = description_fingerprint(shown.get("Description", "")) if active else None
    sidecar_data = read_status(sidecar)
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
        return {"status": read_status(p.status_file), "pid": 0}

    install_node_files(p.node_files)
    if p.action == "unchanged":
        shown = systemd.show(p.unit)
        return {"status": read_status(p.status_file), "pid": _pid(shown.get("MainPID", "0"))}
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
            return {"status": read_status(p.status_file), "pid": _pid(shown.get("MainPID", "0"))}
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
        # issue 22: the system calls of an ordinary service only (python3, fadvise, the status writes)
        "SystemCallFilter=@system-service",
        "SystemCallErrorNumber=EPERM",
    ]
    if not drops:
        props.append("ProtectKernelTunables=yes")
    if not config.get("until_url"):
        props.append("IPAddressDeny=any")  # no network at all (PrivateNetwork too)
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
        status = read_status(p.status_file)
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
