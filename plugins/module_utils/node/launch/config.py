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
import math
import os
import pwd
import re
import sys
from typing import Any, Callable, Dict, List, Optional

from ..base import checks as _checks
from ..base import paths as _paths
from ..base.common import UmaError
from ..base.plan import StartPlan
from ..cluster import ranks as _ranks
from ..guard import config as _guard_config

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
    # a rank whose peer stopped or was lost has nothing to drain (its tensor-parallel group is
    # broken): its engine gets this long after SIGTERM, then its VLLM:: processes and the engine
    # are killed (vLLM's headless shutdown waits 5 s + 4 s for workers stuck in a collective)
    "peer_stop_grace_s": 2.0,
    "pre_evict": "files",  # files | drop | none
    "evict_after_healthy": True,
    "guard": True,
    "guard_mode": _guard_config.DEFAULT_MODE,
    "guard_interval": _guard_config.DEFAULT_INTERVAL,
    "guard_threshold_mib": _guard_config.DEFAULT_THRESHOLD_MIB,
    # longer than the guard's own 900 s: the launcher stops it at health, which may take health_timeout_s
    "guard_max_duration": 1800.0,
    # the guard locks its own pages (mlockall ONFAULT): under pressure the kernel would reclaim them and
    # the guard would spend its CPU reading itself back (docs/VM-LAB.md: 15.7 s vs 28.0 s to healthy)
    "guard_lock_memory": True,
    # MiB of MemFree below which the guard evicts the load's cache; auto: the engine's startup request
    # on a unified-memory node (admission.guard_free_line), 0: at every 16 MiB of growth (as before)
    "guard_act_below_free_mib": "auto",
    "readahead_kb": None,  # None: no window (the benchmark found it not worth its cost)
    "state_dir": _paths.STATE_DIR,
    # the directory the node package is installed in (lib_dir/uma_vllm_node/launch/config.py): its entry
    # scripts, uma_guard.py among them, are there
    "lib_dir": os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "python": sys.executable or _paths.PYTHON,
    "plan": None,
    "cluster": None,  # a rank of a multi-node engine: rank, nnodes, head_addr, link_port (see node/cluster/ranks.py)
    "watch_ranks": True,  # once healthy, a dead VLLM:: process of this engine is a failure
    # admission: MemAvailable >= the plan's startup request (budget requested_memory_bytes) before the engine
    "admission": True,
    # the memory admission compares: auto (gpu where the plan says unified_memory false, else host), host
    # (MemAvailable, a unified-memory node) or gpu (each of the engine's GPUs' free memory, from nvidia-smi)
    "admission_memory": "auto",
    # host: the node's whole need (default plan.requested_memory_bytes x plan.ranks_per_node);
    # gpu: what each of the engine's GPUs must have free (default plan.requested_memory_bytes + cuda_context_bytes)
    "admission_request_bytes": None,
    "admission_wait_s": 60.0,
    "proc_root": "/proc",
    "sysfs_root": "/sys",
    # the engine's POSIX shared-memory segments (vLLM's psm_* queues, sem.mp-* locks) that it left in
    # this directory when it stopped are removed once its processes are gone (node/launch/shm.py)
    "shm_dir": "/dev/shm",
    "shm_sweep": True,
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


_SECONDS_FIX = "Give e.g. %s (seconds)."
# (key, minimum, maximum, above): durations of the launch, finite and bounded (a week at most)
_DURATIONS = (
    ("lock_timeout_s", 0, _checks.WEEK_S, True),
    ("health_timeout_s", 0, _checks.WEEK_S, True),
    ("health_interval_s", 0.01, 3600, False),
    ("stop_timeout_s", 0, 86400, True),
    ("peer_stop_grace_s", 0, 86400, False),
    ("admission_wait_s", 0, 86400, False),
)
_BOOLEANS = ("evict_after_healthy", "guard", "guard_lock_memory", "watch_ranks", "admission", "shm_sweep")
_PATHS = ("lock_path", "state_dir", "lib_dir", "python", "proc_root", "sysfs_root", "shm_dir")
READAHEAD_MAX_KB = 4294967295  # the kernel's ceiling for read_ahead_kb (_blockdev.KERNEL_MAX_KB)
ADMISSION_MEMORY = ("auto", "host", "gpu")  # what admission compares (node/launch/admission.py)
MAX_REQUEST_BYTES = 1 << 50  # 1 PiB: far above any node's memory, far below a float's precision


def validate(config: Dict[str, Any]) -> Dict[str, Any]:
    """Refuse a configuration that cannot work, naming the option and the fix.

    Every key has an exact type (a JSON boolean is not the string "false"), every number is
    finite and in a named range, every path absolute without NUL or line break.
    """
    engine = config.get("engine")
    if not isinstance(engine, str) or not _NAME_RE.match(engine):
        raise UmaError("engine", engine, "is not a valid engine name", "Use letters, digits, '.', '_', '-' or '@'.")
    _check_command(config)
    _checks.url("health_url", config.get("health_url"), "Use e.g. http://127.0.0.1:8000/health.")
    _check_node_fields(config)
    model = _checks.path("model_path", config.get("model_path"), "Give the local model directory.", optional=True)
    if model is not None and not os.path.exists(model):
        raise UmaError("model_path", model, "does not exist on this node", "Give the local model directory.")
    if model is None and config["pre_evict"] == "files":
        # nothing to evict by file before the load (the default pre_evict): no pre-load eviction
        config["pre_evict"] = "none"
    _check_limits(config, guard_config)
    if config.get("readahead_kb") is not None and model is None:
        raise UmaError(
            "readahead_kb", config["readahead_kb"], "needs model_path to find the device",
            "Give model_path or drop readahead_kb.",
        )  # fmt: skip
    _check_env(config.get("env"))
    # the plan contract (node/base/plan.py), read once here: a damaged or hand-made plan is refused naming its key
    config["_plan"] = StartPlan.read(config.get("plan"))
    config["cluster"] = _ranks.validate_cluster(config.get("cluster"))
    config["_identity"] = engine_identity(config)
    return config


def _check_node_fields(config: Dict[str, Any]) -> None:
    """pre_evict (one of files, drop, none), admission_memory (auto, host, gpu) and the node's paths
    (absolute, normalised in place)."""
    if not isinstance(config["pre_evict"], str) or config["pre_evict"] not in ("files", "drop", "none"):
        raise UmaError("pre_evict", config["pre_evict"], "is not files, drop or none", "Use files (no root needed).")
    memory = config.get("admission_memory")
    if not isinstance(memory, str) or memory not in ADMISSION_MEMORY:
        raise UmaError(
            "admission_memory", memory, "is not auto, host or gpu",
            "Use auto (gpu where the plan says unified_memory false, else host), host (the node's MemAvailable, "
            "unified memory) or gpu (each GPU's free memory from nvidia-smi, a discrete GPU).",
        )  # fmt: skip
    for key in _PATHS:
        config[key] = _checks.path(key, config.get(key), "Give an absolute path, e.g. %s." % DEFAULTS[key])


def _check_limits(config: Dict[str, Any], guard: Callable[[Dict[str, Any]], Any]) -> None:
    """The booleans, the guard (``guard(config)``), the durations and the sizes: exact types, named ranges."""
    for key in _BOOLEANS:
        _checks.boolean(key, config.get(key), "Give true or false (a JSON boolean, not a string).")
    guard(config)
    for key, low, high, above in _DURATIONS:
        config[key] = _checks.seconds(key, config.get(key), high, _SECONDS_FIX % DEFAULTS[key], low, above)
    if config.get("readahead_kb") is not None:
        config["readahead_kb"] = _checks.number(
            "readahead_kb", config["readahead_kb"], 0, READAHEAD_MAX_KB, "Give e.g. 8, or null for no window.",
            integer=True,
        )  # fmt: skip
    need = config.get("admission_request_bytes")
    if need is not None:
        _checks.number("admission_request_bytes", need, 0, MAX_REQUEST_BYTES, "Give e.g. 34359738368, or null.",
                       integer=True, above=True)  # fmt: skip


def check_node_values(layer: Dict[str, Any]) -> None:
    """The node-wide ``launch.json`` (as the launch_wrapper role renders it) against the launcher's own
    checks that need nothing from the node; UmaError names the first key that fails.

    The role runs this on the controller (filter ``uma.vllm.launch_wrapper_node_config_errors``)
    before anything changes on a node, instead of the launcher refusing every start (exit 78).
    Left to the node: the engine user and groups (they must exist there) and the model path.
    """
    raw = {k: v for k, v in (layer or {}).items() if k != "_comment"}
    _checks.known_keys(raw, KNOWN_KEYS, "a launcher")
    config = merge_config(raw)
    _check_node_fields(config)
    if config.get("guard_mode") not in _guard_config.MODES:
        raise UmaError("guard_mode", config.get("guard_mode"), "is not a guard mode",
                       "Use one of %s." % ", ".join(_guard_config.MODES))  # fmt: skip
    # the guard's numbers by its own validator; its paths (the engine's model) are the node's
    _check_limits(config, lambda values: guard_config(dict(values, engine="check", guard_mode="global")))
    _umask(config.get("engine_umask"))  # the launcher reads it once an engine runs as a user


def _check_command(config: Dict[str, Any]) -> None:
    command = config.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
        raise UmaError("command", command, "is not a non-empty list of strings", "Give the engine's argv after --.")
    if not command[0] or any("\x00" in c for c in command):
        raise UmaError("command", command, "has an empty program or a NUL character", "Give the engine's argv.")


def _check_env(env: Any) -> None:
    if not isinstance(env, dict):
        raise UmaError("env", env, "is not a mapping", "Give a dict of variable names to values.")
    for key, value in env.items():
        if not _checks.ENV_NAME_RE.match(key):
            raise UmaError("env", key, "is not an environment variable name", "Use letters, digits and '_'.")
        if isinstance(value, float) and not math.isfinite(value):
            raise UmaError("env.%s" % key, value, "is not a finite number", "Give the value as a string.")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)) or "\x00" in str(value):
            raise UmaError("env.%s" % key, value, "is not a string or a number", "Give the value as a string.")


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
    if user is not None and not isinstance(user, str):
        # false or 0 is not "root": a type the role never writes is a damaged file
        raise UmaError("engine_user", user, "is not a user name", "Give a user name of this node, or null for root.")
    if not isinstance(config.get("engine_groups") or [], list):  # checked with or without a user: never ignored
        raise UmaError("engine_groups", config.get("engine_groups"), "is not a list of group names", "Give e.g. [].")
    if user in (None, "", "root"):
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
    home = config.get("engine_home")
    home = entry.pw_dir if home in (None, "") else home
    home = _checks.path("engine_home", home, "Give the engine user's home, e.g. /var/lib/uma-vllm/home.")
    umask = _umask(config.get("engine_umask"))
    return {"user": user, "uid": entry.pw_uid, "gid": gid, "groups": gids, "home": home, "umask": umask}


def _umask(value: Any) -> int:
    umask = int(value, 8) if isinstance(value, str) and re.match(r"^0?[0-7]{3}$", value) else value
    if isinstance(umask, bool) or not isinstance(umask, int) or not 0 <= umask <= 0o777:
        raise UmaError("engine_umask", value, "is not an octal umask", 'Give e.g. "0027".')
    return umask


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
    for key, fix in (("guard_interval", "0.1"), ("guard_threshold_mib", "16"), ("guard_max_duration", "1800")):
        # a JSON number (the guard's command line also takes decimal text; a config file does not)
        _checks.number(key, config.get(key), -math.inf, math.inf, "Give e.g. %s." % fix)  # the range: the guard's
    free_line = config.get("guard_act_below_free_mib", "auto")
    if isinstance(free_line, str) and free_line != "auto":
        raise UmaError("guard_act_below_free_mib", free_line, "is not auto or a number of MiB",
                       "Give auto (the engine's request), a whole number of MiB, or 0 (act always).")  # fmt: skip
    guard = _guard_config.GuardConfig(
        name="launch-%s" % config.get("engine"),
        mode=mode,
        paths=[model] if model is not None and mode != "global" else [],
        interval=config.get("guard_interval"),
        threshold_mib=config.get("guard_threshold_mib"),
        act_below_free_mib=0 if free_line == "auto" else free_line,
        max_duration=config.get("guard_max_duration"),
    ).validated(spell=_guard_config.prefixed("guard_"))
    config["guard_act_below_free_mib"] = "auto" if free_line == "auto" else guard.act_below_free_mib
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
    p.add_argument("--admission-memory", help="the memory admission compares: auto (default), host or gpu")
    p.add_argument(
        "--admission-request-bytes",
        type=int,
        help="host: MemAvailable the start needs; gpu: free memory each GPU needs (default: the plan's)",
    )
    p.add_argument("--admission-wait", type=float, dest="admission_wait_s", help="seconds to wait for it")
    p.add_argument(
        "--check-config",
        action="store_true",
        help="validate the command line and both config files, say the result in one line and exit (0 or 78)",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- ENGINE ARGV (when not in --config)")
    return p


NODE_FIX = "Fix or remove the file (the launch_wrapper role writes it; re-run it)."
ENGINE_FIX = "Give the engine's JSON config (the launch_wrapper or vllm_service role writes it; re-run it)."
KNOWN_KEYS = (*DEFAULTS, "_comment")


def _read_layer(file_path: str, option: str, fix: str) -> Dict[str, Any]:
    """One config file: a JSON object of known keys (``_comment``, the role's managed note, dropped)."""
    raw = _checks.read_config(file_path, option, fix)
    try:
        _checks.known_keys(raw, KNOWN_KEYS, "a launcher")
    except UmaError as err:
        raise sourced(err, file_path) from None
    raw.pop("_comment", None)
    return raw


def sourced(err: UmaError, source: Optional[str]) -> UmaError:
    """The same refusal, saying which file (or the command line) set the value."""
    if not source:
        return err
    return UmaError(err.option, err.value, "%s (set in %s)" % (err.problem, source), err.fix)


def _source_of(option: str, layers: List[Any]) -> Optional[str]:
    key = re.split(r"[.\[]", option, maxsplit=1)[0]
    found = None
    for source, layer in layers:
        if layer.get(key) is not None:
            found = source
    return found


def load_config(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    """The command line, the node's file and the engine's file, merged and validated.

    The node config is optional (a node without the launch_wrapper role's launch.json
    runs on the launcher's defaults), but one that exists is read strictly: empty,
    damaged, of another type or with an unknown key, it is refused (exit 78), never
    replaced by the defaults. The engine's ``--config`` must exist.
    """
    ns = build_parser().parse_args(argv)
    command = list(ns.command)
    if command and command[0] == "--":
        command = command[1:]
    layers: List[Any] = []
    if ns.node_config and os.path.lexists(ns.node_config):
        layers.append((ns.node_config, _read_layer(ns.node_config, "--node-config", NODE_FIX)))
    if ns.config is not None:
        layers.append((ns.config, _read_layer(ns.config, "--config", ENGINE_FIX)))
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
        "admission_memory": ns.admission_memory,
        "admission_request_bytes": ns.admission_request_bytes,
        "admission_wait_s": ns.admission_wait_s,
        "command": command or None,
    }
    layers.append(("the command line", cli))
    try:
        config = validate(merge_config(*(layer for _source, layer in layers)))
    except UmaError as err:
        raise sourced(err, _source_of(err.option, layers)) from None
    config["_sources"] = [source for source, _layer in layers[:-1]]
    if ns.check_config:  # like --help: say it and leave
        raise SystemExit(report_valid(config))
    return config


def report_valid(config: Dict[str, Any]) -> int:
    """--check-config: one line on stdout, exit 0 (a refusal has left with 78 before)."""
    sources = ", ".join(config.get("_sources") or []) or "the command line only; no launch.json"
    sys.stdout.write("%s: the configuration of engine %s is valid (%s)\n" % (PROG, config["engine"], sources))
    return 0
