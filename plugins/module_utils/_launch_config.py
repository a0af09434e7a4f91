# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node-side launcher's configuration (uma_launch.py, vllm-uma-launch).

Its exit codes, its defaults, the command line, the files it reads (node-wide
``launch.json``, the engine's ``--config``) merged in that order, and the validator that
refuses what cannot work, naming the option, the value and the fix (exit 78). Stdlib
only; shipped beside ``uma_launch.py`` into the node's lib_dir by roles/launch_wrapper.
"""

from __future__ import annotations

import argparse
import grp
import os
import pwd
import re
import sys
from typing import Any, Dict, List, Optional

try:
    from ansible_collections.uma.vllm.plugins.module_utils import _guard_config, _paths, _ranks
    from ansible_collections.uma.vllm.plugins.module_utils._common import UmaError, read_json
except ImportError:  # pragma: no cover - node-side use without Ansible
    import _guard_config  # type: ignore[no-redef]
    import _paths  # type: ignore[no-redef]
    import _ranks  # type: ignore[no-redef]
    from _common import UmaError, read_json  # type: ignore[no-redef]

PROG = "vllm-uma-launch"
NODE_CONFIG = _paths.CONFIG_DIR + "/launch.json"
EXIT_LOCK_TIMEOUT = 75  # EX_TEMPFAIL: try again later
EXIT_CONFIG = 78  # EX_CONFIG
EXIT_HEALTH_TIMEOUT = 124  # like timeout(1)
EXIT_PEER = 69  # EX_UNAVAILABLE: a rank or rank process of this engine failed; systemd restarts it
# EX_TEMPFAIL, like a lock timeout: the node has not the memory the plan's start needs now
EXIT_ADMISSION = 75

DEFAULTS: Dict[str, Any] = {
    "engine": None,
    "command": [],
    "env": {},
    "health_url": None,
    "model_path": None,
    "lock_path": "/run/uma-vllm/launch.lock",
    "lock_timeout_s": 3600.0,
    "health_timeout_s": 1800.0,
    "health_interval_s": 1.0,
    "stop_timeout_s": 30.0,
    "pre_evict": "files",  # files | drop | none
    "evict_after_healthy": True,
    "guard": True,
    "guard_mode": _guard_config.DEFAULT_MODE,
    "guard_interval": _guard_config.DEFAULT_INTERVAL,
    "guard_threshold_mib": _guard_config.DEFAULT_THRESHOLD_MIB,
    # longer than the guard's own 900 s: the launcher stops it at health, which may take health_timeout_s
    "guard_max_duration": 1800.0,
    "readahead_kb": None,  # None: no window (the benchmark found it not worth its cost)
    "state_dir": _paths.STATE_DIR,
    "lib_dir": os.path.dirname(os.path.abspath(__file__)),
    "python": sys.executable or _paths.PYTHON,
    "plan": None,
    "cluster": None,  # a rank of a multi-node engine: rank, nnodes, head_addr, link_port (see _ranks.py)
    "watch_ranks": True,  # once healthy, a dead VLLM:: process of this engine is a failure
    # admission: MemAvailable >= the plan's startup request (budget requested_memory_bytes) before the engine
    "admission": True,
    "admission_request_bytes": None,  # default: plan.requested_memory_bytes x plan.ranks_per_node
    "admission_wait_s": 60.0,
    "proc_root": "/proc",
    "sysfs_root": "/sys",
    # least privilege: the launcher keeps root for the node's work (lock, eviction, guard,
    # readahead); the engine process runs as this user (None or root: as the launcher)
    "engine_user": None,
    "engine_group": None,  # default: the user's primary group
    "engine_groups": [],  # supplementary groups, e.g. video and render for /dev/nvidia* and /dev/dri
    "engine_home": None,  # default: the user's home from the passwd database
    "engine_umask": "0027",
}
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")


def merge_config(*layers: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """Defaults, then the node's file, the engine's file, the command line."""
    config = dict(DEFAULTS)
    for layer in layers:
        for key, value in (layer or {}).items():
            if value is not None:
                config[key] = value
    return config


def validate(config: Dict[str, Any]) -> Dict[str, Any]:
    """Refuse a configuration that cannot work, naming the option and the fix."""
    engine = config.get("engine")
    if not isinstance(engine, str) or not _NAME_RE.match(engine):
        raise UmaError("engine", engine, "is not a valid engine name", "Use letters, digits, '.', '_', '-' or '@'.")
    command = config.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
        raise UmaError("command", command, "is not a non-empty list of strings", "Give the engine's argv after --.")
    url = config.get("health_url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise UmaError("health_url", url, "is not an http(s) URL", "Use e.g. http://127.0.0.1:8000/health.")
    if config["pre_evict"] not in ("files", "drop", "none"):
        raise UmaError("pre_evict", config["pre_evict"], "is not files, drop or none", "Use files (no root needed).")
    model = config.get("model_path")
    if model is not None and not os.path.exists(model):
        raise UmaError("model_path", model, "does not exist on this node", "Give the local model directory.")
    if model is None and config["pre_evict"] == "files":
        # nothing to evict by file before the load (the default pre_evict): no pre-load eviction
        config["pre_evict"] = "none"
    guard_config(config)
    for key in ("lock_timeout_s", "health_timeout_s", "health_interval_s", "stop_timeout_s"):
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise UmaError(key, value, "must be a positive number of seconds", "Give e.g. 600.")
    ra = config.get("readahead_kb")
    if ra is not None and (isinstance(ra, bool) or not isinstance(ra, int) or ra < 0):
        raise UmaError("readahead_kb", ra, "must be a whole number of kB >= 0", "Give e.g. 8, or null for no window.")
    if ra is not None and model is None:
        raise UmaError(
            "readahead_kb", ra, "needs model_path to find the device", "Give model_path or drop readahead_kb."
        )
    wait = config.get("admission_wait_s")
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or wait < 0:
        raise UmaError("admission_wait_s", wait, "must be a number of seconds >= 0", "Give e.g. 60, or 0 not to wait.")
    need = config.get("admission_request_bytes")
    if need is not None and (isinstance(need, bool) or not isinstance(need, int) or need <= 0):
        raise UmaError(
            "admission_request_bytes", need, "must be a whole number of bytes > 0", "Give e.g. 34359738368, or null."
        )
    if not isinstance(config.get("admission"), bool):
        raise UmaError("admission", config.get("admission"), "is not a boolean", "Give true or false.")
    if not isinstance(config.get("env"), dict):
        raise UmaError("env", config.get("env"), "is not a mapping", "Give a dict of variable names to values.")
    config["cluster"] = _ranks.validate_cluster(config.get("cluster"))
    config["_identity"] = engine_identity(config)
    if not isinstance(config.get("watch_ranks"), bool):
        raise UmaError(
            "watch_ranks", config.get("watch_ranks"), "is not true or false", "Give true (default) or false."
        )
    return config


def _group_id(option: str, value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if not isinstance(value, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$", value):
        raise UmaError(option, value, "is not a group name", "Give a group name of this node, e.g. video.")
    try:
        return grp.getgrnam(value).gr_gid
    except KeyError:
        raise UmaError(
            option, value, "is not a group on this node", "Create it (groupadd %s) or leave it out." % value
        ) from None


def engine_identity(config: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """Who the engine process runs as: None (as the launcher), or uid, gid, groups, home, umask.

    The launcher needs root for the node's work; the engine does not, so it
    runs as ``engine_user`` when one is set (uma.vllm.vllm_service: vllm_service_user).
    """
    user = config.get("engine_user")
    if user in (None, "", "root", 0):
        for key in ("engine_group", "engine_home"):
            if config.get(key) not in (None, ""):
                raise UmaError(key, config.get(key), "is set without engine_user", "Set engine_user, or drop %s." % key)
        return None
    if not isinstance(user, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$", user):
        raise UmaError("engine_user", user, "is not a user name", "Give a user name of this node, e.g. uma-vllm.")
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise UmaError(
            "engine_user", user, "is not a user on this node",
            "Create it (uma.vllm.vllm_service does with vllm_service_user_create: true) or use root.",
        ) from None  # fmt: skip
    group = config.get("engine_group")
    gid = entry.pw_gid if group in (None, "") else _group_id("engine_group", group)
    groups = config.get("engine_groups")
    if groups is None:
        groups = []
    if not isinstance(groups, list):
        raise UmaError("engine_groups", groups, "is not a list of group names", "Give e.g. [video, render] or [].")
    gids = sorted({_group_id("engine_groups", g) for g in groups})
    home = config.get("engine_home") or entry.pw_dir
    if not isinstance(home, str) or not home.startswith("/") or "\n" in home:
        raise UmaError(
            "engine_home", home, "is not an absolute path", "Give the engine user's home, e.g. /var/lib/uma-vllm/home."
        )
    umask = config.get("engine_umask")
    if isinstance(umask, str) and re.match(r"^0?[0-7]{3}$", umask):
        umask = int(umask, 8)
    if isinstance(umask, bool) or not isinstance(umask, int) or not 0 <= umask <= 0o777:
        raise UmaError("engine_umask", config.get("engine_umask"), "is not an octal umask", 'Give e.g. "0027".')
    return {"user": user, "uid": entry.pw_uid, "gid": gid, "groups": gids, "home": home, "umask": umask}


def guard_config(config: Dict[str, Any]) -> Any:
    """The guard this launch starts, validated by the guard's own validator (options named guard_*).

    guard_mode files without model_path is refused, not turned into adaptive: without paths
    the adaptive guard drops every workload's cache globally, which is not what files promised.
    """
    model = config.get("model_path")
    mode = config.get("guard_mode")
    if mode == "files" and model is None:
        raise UmaError(
            "guard_mode",
            mode,
            "evicts the model's files but model_path is not set",
            "Give model_path, or guard_mode adaptive (it then drops the page cache globally, as root).",
        )
    guard = _guard_config.GuardConfig(
        name="launch-%s" % config.get("engine"),
        mode=mode,
        paths=[model] if model is not None and mode != "global" else [],
        interval=config.get("guard_interval"),
        threshold_mib=config.get("guard_threshold_mib"),
        max_duration=config.get("guard_max_duration"),
    ).validated(spell=_guard_config.prefixed("guard_"))
    config["guard_interval"] = guard.interval
    config["guard_threshold_mib"] = guard.threshold_mib
    config["guard_max_duration"] = guard.max_duration
    return guard


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Start a vLLM engine without page-cache pressure (uma.vllm).")
    p.add_argument("--engine", help="engine name (logs, records, the lock's holder)")
    p.add_argument("--config", help="engine config JSON (command, env, health_url, model_path, plan ...)")
    p.add_argument("--node-config", default=NODE_CONFIG, help="node-wide defaults, default %(default)s")
    p.add_argument("--health-url")
    p.add_argument("--model-path")
    p.add_argument("--guard-mode", choices=_guard_config.MODES)
    p.add_argument("--readahead-kb", type=int)
    p.add_argument("--lock-path")
    p.add_argument("--lock-timeout", type=float, dest="lock_timeout_s")
    p.add_argument("--health-timeout", type=float, dest="health_timeout_s")
    p.add_argument("--state-dir")
    p.add_argument("--admission-request-bytes", type=int, help="MemAvailable the start needs (default: the plan's)")
    p.add_argument("--admission-wait", type=float, dest="admission_wait_s", help="seconds to wait for it")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- ENGINE ARGV (when not in --config)")
    return p


def load_config(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    ns = build_parser().parse_args(argv)
    command = list(ns.command)
    if command and command[0] == "--":
        command = command[1:]
    node = read_json(ns.node_config) if ns.node_config and os.path.exists(ns.node_config) else None
    engine_file = None
    if ns.config:
        engine_file = read_json(ns.config)
        if not isinstance(engine_file, dict):
            raise UmaError("--config", ns.config, "is missing or not a JSON object", "Give the engine's config file.")
    cli = {
        "engine": ns.engine,
        "health_url": ns.health_url,
        "model_path": ns.model_path,
        "guard_mode": ns.guard_mode,
        "readahead_kb": ns.readahead_kb,
        "lock_path": ns.lock_path,
        "lock_timeout_s": ns.lock_timeout_s,
        "health_timeout_s": ns.health_timeout_s,
        "state_dir": ns.state_dir,
        "admission_request_bytes": ns.admission_request_bytes,
        "admission_wait_s": ns.admission_wait_s,
        "command": command or None,
    }
    return validate(merge_config(node if isinstance(node, dict) else None, engine_file, cli))
