# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The watchdog's decisions as pure functions over observations (private to the collection).

Nothing here reads a file, opens a socket or looks at a clock: every function
takes the configuration, the observations of one tick and ``now`` (seconds,
monotonic) and returns a verdict or the next state plus the actions to take.
``uma_watchdog.py`` gathers the observations and carries the actions out; the
unit tests drive every branch with made-up observations and made-up time.

Observations of one tick (keys of ``obs``; missing = not observed):

``unit``        ActiveState of the engine's unit on this node (active, activating, inactive, failed ...)
``n_restarts``  systemd's NRestarts of the unit (restarts systemd made by itself)
``local``       ``{"ok": bool, "reason": str}`` this node's rank processes
``health``      ``{"ok": bool, "latency_s": float, "error": str}`` GET /health (rank 0)
``metrics``     ``{"running": n, "waiting": n, "progress": {counter: value}}`` from vLLM's /metrics (rank 0)
``probe``       ``{"ok": bool, "latency_s": float, "error": str}`` a 1-token completion (rank 0, idle only)
``peers``       ``{name: {"ok": bool, "reason": str, "critical_floor": bool}}`` peer ranks (rank 0)
``mem``         ``{"available": bytes, "gpu_headroom": bytes or None}``
"""

from __future__ import annotations

import copy
import re
from typing import Any, Dict, List, Optional, Tuple

from ..base import checks as _checks
from ..base.common import UmaError
from ..base.memavail import size_min_free_kbytes
from ..base.paths import ENGINE_NAME_PATTERN, STATE_DIR
from . import counters

_D = Dict[str, Any]  # short names for the signatures of validate()'s checks and decide()'s steps
_Acts = List[Dict[str, Any]]
MIB = 1 << 20
GIB = 1 << 30

# vLLM's counters (their names, parsing, busy/progress, the idle probe's pacing): _watchdog_counters
METRIC_RUNNING, METRIC_WAITING = counters.METRIC_RUNNING, counters.METRIC_WAITING
PROGRESS_METRICS = counters.PROGRESS_METRICS
is_busy, needs_probe, progressed = counters.is_busy, counters.needs_probe, counters.progressed
probe_due, parse_prometheus, metrics_view = counters.probe_due, counters.parse_prometheus, counters.metrics_view

PHASES = ("starting", "healthy", "suspect", "backoff", "stopped", "gave_up")
# What rank 0 publishes while a whole-engine restart runs (its status, state.json, the
# textfile): not decision phases, but the engine is in them, so the metrics need them too.
HANDSHAKE_PHASES = ("restart_stop", "restart_start")
PUBLISHED_PHASES = PHASES + HANDSHAKE_PHASES

# Floors: critical = the reserve rule of _sysctl (uma-3pct-v1) on the host's RAM;
# warning = twice that. Both overridable.
WARN_FACTOR = 2

DEFAULTS: Dict[str, Any] = {
    "engine": None,
    "unit": None,  # default uma-vllm@<engine>.service
    "rank": 0,
    "base_url": "http://127.0.0.1:8000",
    "model": None,  # completion model id; None = the first of GET /v1/models
    "model_path": None,  # the shards evicted on a warning floor and after a stop
    "interval_s": 5.0,
    "health_timeout_s": 5.0,
    "probe_timeout_s": 20.0,  # the 1-token completion must finish within this deadline
    # the idle probe: only after vLLM's counters showed the engine idle this long, at most once per this
    "probe_idle_s": 60.0,
    "fail_threshold": 2,  # consecutive failed ticks before a wedge is declared
    "busy_stall_s": 600.0,  # busy with no counter progress this long = wedged (long prefills stay below)
    "start_timeout_s": 1800.0,  # a start that is not healthy after this counts as failed
    "processes": [],  # [{"match": regex on the cmdline, "min": n}] expected in the unit
    "container": None,  # container runtime: the container's name (its processes are not in the unit's cgroup)
    "container_bin": "docker",
    "peers": [],  # rank 0: [{"name": "ai2", "url": "http://10.0.0.2:9411/status"}]
    "leader_url": None,  # peers: rank 0's watchdog status URL
    "peer_timeout_s": 15.0,  # a peer status older than this (or unreachable this long) = peer gone
    "peer_ack_timeout_s": 120.0,
    # multi-node: a dead rank process or a lost peer is first the launchers' rank link's to heal
    # (every rank exits 69, systemd restarts the whole engine); the watchdog counts such a
    # failure only when it outlasts this grace (0 = count at once). Stopped processes (SIGSTOP,
    # a wedge) are never the rank link's: it sees only processes that are gone.
    "rank_link_grace_s": 30.0,
    "status_bind": "127.0.0.1",
    "status_port": 0,  # 0 = no status endpoint (single-node engines)
    "key_file": None,  # the engine's link key (0600 root): the status is signed with it (_link_auth)
    "backoff_initial_s": 30.0,
    "backoff_max_s": 600.0,
    "max_restarts": 3,
    "window_s": 3600.0,
    # a restart followed by this long healthy leaves the restart budget: a healed fault, not a crash loop
    "healthy_reset_s": 600.0,
    "ram_gib": None,  # None = MemTotal
    "warn_floor_mib": None,  # None = sized from RAM
    "critical_floor_mib": None,
    "floor_samples": 2,
    "evict_every_s": 30.0,
    "evict_scope": "model",  # model | global (drop_caches: every workload's cache)
    "unified_memory": False,
    "state_dir": STATE_DIR,
    "textfile_dir": None,  # None = no metrics file
    "proc_root": "/proc",  # processes of the local rank
    "meminfo_root": None,  # meminfo and vm sysctls; None = proc_root
    "cgroup_root": "/sys/fs/cgroup",
    "systemctl": "systemctl",
    "api_key_env": "VLLM_API_KEY",
    # the node programs' fingerprint when the role wrote this config (uma.vllm.node_files' rule): new
    # programs change the config, so the role restarts the watchdog (a running one keeps its old code)
    "programs": None,
    # mlockall(MCL_CURRENT | MCL_ONFAULT) at start (the guard's --lock-memory): under memory pressure the
    # kernel would reclaim the watchdog's own pages and it would read them back just when it must act
    "lock_memory": True,
}

_POSITIVE = ("interval_s", "health_timeout_s", "probe_timeout_s", "busy_stall_s", "start_timeout_s", "peer_timeout_s",
             "peer_ack_timeout_s", "backoff_initial_s", "backoff_max_s", "window_s", "evict_every_s", "probe_idle_s",
             "healthy_reset_s")  # fmt: skip


def _number(key: str, value: Any, fix: str) -> float:
    return _checks.seconds(key, value, _checks.WEEK_S, fix)  # finite, > 0, at most a week


def _check_names(cfg: _D) -> None:
    """engine (and the unit named after it) and rank."""
    engine = cfg["engine"]
    if not isinstance(engine, str) or not re.fullmatch(ENGINE_NAME_PATTERN, engine):
        raise UmaError("engine", engine, "is not an engine name", "Give the engine's name, e.g. 'main'.")
    if cfg["unit"] is None:
        cfg["unit"] = "uma-vllm@%s.service" % engine
    rank = cfg["rank"]
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise UmaError("rank", rank, "is not a node rank", "Give 0 on the node that serves the API, 1.. on the others.")


def _check_numbers(cfg: _D) -> None:
    """Durations, whole numbers, the port and the bounds between them."""
    for key in _POSITIVE:
        cfg[key] = _number(key, cfg[key], "Give e.g. %s." % DEFAULTS[key])
    cfg["rank_link_grace_s"] = _checks.seconds("rank_link_grace_s", cfg["rank_link_grace_s"], _checks.WEEK_S,
                                               "Give e.g. 30 (0 = no grace).", above=False)  # fmt: skip
    for key, low, high in (("fail_threshold", 1, 1000), ("max_restarts", 1, 1000), ("floor_samples", 1, 1000),
                           ("status_port", 0, 65535)):  # fmt: skip
        cfg[key] = _checks.number(key, cfg[key], low, high, "Give e.g. %s." % DEFAULTS[key], integer=True)
    if cfg["backoff_max_s"] < cfg["backoff_initial_s"]:
        raise UmaError("backoff_max_s", cfg["backoff_max_s"], "is below backoff_initial_s",
                       "Give a cap >= backoff_initial_s.")  # fmt: skip
    if cfg["probe_timeout_s"] >= cfg["busy_stall_s"]:
        raise UmaError("busy_stall_s", cfg["busy_stall_s"], "must exceed probe_timeout_s",
                       "Give a stall bound of minutes.")  # fmt: skip
    cfg["base_url"] = _checks.url("base_url", cfg["base_url"], "Give e.g. http://127.0.0.1:8000.").rstrip("/")
    if cfg["evict_scope"] not in ("model", "global"):
        raise UmaError("evict_scope", cfg["evict_scope"], "is not model or global",
                       "Use model (only the engine's shards).")  # fmt: skip


def _check_ranks(cfg: _D) -> None:
    """peers (rank 0) or leader_url (the others), and the status port both need."""
    peers = cfg["peers"]
    if not isinstance(peers, list):
        raise UmaError("peers", peers, "is not a list", "Give [{'name': 'ai2', 'url': 'http://ai2:9411/status'}].")
    names = set()
    for peer in peers:
        if not isinstance(peer, dict) or not isinstance(peer.get("name"), str) or not isinstance(
                peer.get("url"), str) or not peer["url"].startswith("http://") or " " in peer["url"]:  # fmt: skip
            raise UmaError("peers", peer, "is not {name, url} with an http:// URL", "Give each peer's watchdog URL.")
        if peer["name"] in names:
            raise UmaError("peers", peer, "names a peer twice", "Give each peer once.")
        names.add(peer["name"])
    if peers and cfg["rank"] != 0:
        raise UmaError("peers", peers, "is only for rank 0", "Give peers on rank 0 and leader_url on the others.")
    if cfg["rank"] != 0 or cfg["leader_url"] is not None:  # rank 0 follows no one: a leader_url there is a mistake
        url = cfg["leader_url"]
        if not isinstance(url, str) or not url.startswith("http://") or cfg["rank"] == 0 or " " in url:
            raise UmaError("leader_url", url, "is needed on a rank > 0 (and only there)",
                           "Give rank 0's watchdog URL, e.g. http://ai1:9411/status.")  # fmt: skip
        if cfg["status_port"] == 0:
            raise UmaError("status_port", 0, "must be set on a rank > 0 (rank 0 reads it)",
                           "Give e.g. 9411 on every node.")  # fmt: skip
    if peers and cfg["status_port"] == 0:
        raise UmaError("status_port", 0, "must be set when peers are given", "Give e.g. 9411 on every node.")
    fix = "Give the absolute path of the engine's link key (a 0600 root file), or null for an unauthenticated status."
    cfg["key_file"] = _checks.path("key_file", cfg["key_file"], fix, optional=True)


def _check_rest(cfg: _D) -> None:
    """processes, the floors, container and unified_memory."""
    processes = cfg["processes"]
    if not isinstance(processes, list) or not all(
            isinstance(p, dict) and isinstance(p.get("match"), str) and isinstance(p.get("min", 1), int)
            and not isinstance(p.get("min", 1), bool) and p.get("min", 1) >= 1 for p in processes):  # fmt: skip
        raise UmaError("processes", processes, "is not a list of {match, min}",
                       "Give e.g. [{'match': 'VLLM::Worker', 'min': 1}].")  # fmt: skip
    for p in processes:
        try:
            re.compile(p["match"])
        except re.error as err:
            raise UmaError("processes", p["match"], "is not a regular expression (%s)" % err,
                           "Fix the pattern.") from None  # fmt: skip
    for key in ("warn_floor_mib", "critical_floor_mib", "ram_gib"):
        value = cfg[key]
        if value is not None:  # finite, at most 2^30 (MiB: 1 PiB)
            _checks.number(key, value, 0, 1 << 30, "Give e.g. 4096, or null to size it.", above=True)
    container = cfg["container"]
    if container is not None and (
        not isinstance(container, str) or not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", container)
    ):
        raise UmaError("container", container, "is not a container name", "Give the engine's container name.")
    if cfg["meminfo_root"] is None:
        cfg["meminfo_root"] = cfg["proc_root"]
    _checks.boolean("unified_memory", cfg["unified_memory"])
    _checks.boolean("lock_memory", cfg["lock_memory"])
    for key in ("state_dir", "proc_root", "cgroup_root", "meminfo_root", "textfile_dir", "model_path"):
        example = ", e.g. %s" % DEFAULTS[key] if DEFAULTS[key] else " or null"
        _checks.path(key, cfg[key], "Give an absolute path%s." % example, optional=True)
    for key, form in (
        ("unit", r"[A-Za-z0-9:_.@\\-]+\.service"),
        ("systemctl", r"\S+"),
        ("container_bin", r"\S+"),
        ("api_key_env", _checks.ENV_NAME_RE.pattern),
        ("status_bind", r"\S+"),
        ("model", None),
        ("programs", r"[0-9a-f]{16}"),
    ):
        _checks.text(key, cfg[key], "Give e.g. %s." % (DEFAULTS[key] or "none"), form,
                     optional=key in ("model", "programs"))  # fmt: skip


def validate(raw: Any, source: str = "config") -> Dict[str, Any]:
    """Defaults plus ``raw`` (the JSON config), refused with one clear error naming key, value, fix."""
    if not isinstance(raw, dict):
        raise UmaError(source, raw, "is not a JSON object", "Write the watchdog's config as a JSON object.")
    raw = {k: v for k, v in raw.items() if k != "_comment"}  # the role's ansible_managed note
    unknown = sorted(k for k in raw if k not in DEFAULTS)
    if unknown:
        raise UmaError(unknown[0], raw[unknown[0]], "is not a watchdog option", "Use one of: %s." % ", ".join(DEFAULTS))
    cfg = dict(DEFAULTS)
    cfg.update({k: v for k, v in raw.items() if v is not None})
    for check in (_check_names, _check_numbers, _check_ranks, _check_rest):  # in this order: first error wins
        check(cfg)
    return cfg


# --------------------------------------------------------------------------
# Memory floors


def size_floors(ram_bytes: int, warn_mib: Optional[float] = None, critical_mib: Optional[float] = None) -> _D:
    """Warning and critical floors for MemAvailable, from RAM like the reserve (uma-3pct-v1)."""
    reserve = size_min_free_kbytes(int(ram_bytes))["min_free_kbytes"] * 1024
    critical = int(critical_mib * MIB) if critical_mib is not None else reserve
    warn = int(warn_mib * MIB) if warn_mib is not None else max(critical * WARN_FACTOR, reserve * WARN_FACTOR)
    if warn <= critical:
        raise UmaError("warn_floor_mib", warn // MIB, "is not above critical_floor_mib (%d)" % (critical // MIB),
                       "Give a warning floor above the critical one.")  # fmt: skip
    if warn >= ram_bytes:
        raise UmaError("warn_floor_mib", warn // MIB, "is not below the host's RAM", "Give a smaller floor.")
    return {
        "rule": "uma-3pct-v1" if critical_mib is None else "explicit",
        "ram_bytes": int(ram_bytes),
        "reserve_bytes": reserve,
        "warn_bytes": warn,
        "critical_bytes": critical,
    }


def memory_view(meminfo: Dict[str, int], unified_memory: bool, min_free_bytes: int = 0) -> Dict[str, Any]:
    """What the floors compare: MemAvailable; on unified memory also the GPU headroom.

    MemAvailable is the kernel's estimate for new CPU allocations (free pages
    above the watermarks plus reclaimable page cache and slab). On a
    unified-memory node the GPU driver allocates from the same pages but does
    not wait for reclaim: page cache is not there for it in time
    (NV_ERR_NO_MEMORY while MemAvailable looks fine). gpu_headroom = MemFree
    minus the reserve (vm.min_free_kbytes) is what can back a GPU allocation
    now. It drives only the warning action (evict the model's cache), never a
    restart: a node full of cache is healthy, it only needs the cache gone.
    """
    available = meminfo.get("MemAvailable")
    view: Dict[str, Any] = {"available": available, "gpu_headroom": None}
    if unified_memory and "MemFree" in meminfo:
        view["gpu_headroom"] = max(0, meminfo["MemFree"] - min_free_bytes)
    return view


def floor_level(mem: Optional[Dict[str, Any]], floors: Dict[str, Any]) -> Tuple[str, str]:
    """("ok" | "warn" | "critical", why)."""
    if not mem or mem.get("available") is None:
        return "ok", "no meminfo"
    available = mem["available"]
    if available < floors["critical_bytes"]:
        return "critical", "MemAvailable %d MiB < critical floor %d MiB" % (
            available // MIB,
            floors["critical_bytes"] // MIB,
        )
    if available < floors["warn_bytes"]:
        return "warn", "MemAvailable %d MiB < warning floor %d MiB" % (available // MIB, floors["warn_bytes"] // MIB)
    headroom = mem.get("gpu_headroom")
    if headroom is not None and headroom < floors["warn_bytes"]:
        return "warn", "GPU headroom (MemFree - reserve) %d MiB < warning floor %d MiB" % (
            headroom // MIB,
            floors["warn_bytes"] // MIB,
        )
    return "ok", "MemAvailable %d MiB" % (available // MIB)


# --------------------------------------------------------------------------
# Liveness


def liveness(cfg: Dict[str, Any], obs: Dict[str, Any], state: Dict[str, Any], now: float) -> Dict[str, Any]:
    """One tick's verdict: ``{"ok": bool, "reason": str, "kind": ...}``.

    kind: local (this node's rank processes), peer (another rank is gone or at
    its critical floor), health, busy_stall, probe, or ok/busy/idle.
    """
    local = obs.get("local")
    if local is not None and not local.get("ok"):
        # a process that is gone is what the launchers' rank link also sees; a stopped one is not
        return {"ok": False, "kind": "local", "reason": "local rank: %s" % local.get("reason"),
                "rank_link": not local.get("stopped")}  # fmt: skip
    for name, peer in sorted((obs.get("peers") or {}).items()):
        if not peer.get("ok"):
            return {"ok": False, "kind": "peer", "reason": "peer %s: %s" % (name, peer.get("reason")),
                    "rank_link": not peer.get("stopped")}  # fmt: skip
        if peer.get("critical_floor"):
            return {"ok": False, "kind": "peer_floor", "reason": "peer %s: below its critical memory floor" % name}
    if cfg["rank"] != 0:
        return {"ok": True, "kind": "ok", "reason": "local rank alive"}
    health = obs.get("health")
    if health is not None and not health.get("ok"):
        return {"ok": False, "kind": "health", "reason": "/health: %s" % health.get("error")}
    metrics = obs.get("metrics")
    if is_busy(metrics):
        since = state.get("progress_at")
        if since is None or progressed(state.get("progress"), metrics.get("progress")):
            return {"ok": True, "kind": "busy", "reason": "busy, counters moving"}
        stalled = now - since
        if stalled >= cfg["busy_stall_s"]:
            return {"ok": False, "kind": "busy_stall",
                    "reason": "busy (running %d, waiting %d) with no counter progress for %.0f s" % (
                        metrics.get("running", 0), metrics.get("waiting", 0), stalled)}  # fmt: skip
        return {"ok": True, "kind": "busy", "reason": "busy, no progress for %.0f s (bound %.0f s)" % (
            stalled, cfg["busy_stall_s"])}  # fmt: skip
    probe = obs.get("probe")
    if probe is not None and not probe.get("ok"):
        return {"ok": False, "kind": "probe", "reason": "1-token completion: %s" % probe.get("error")}
    if probe is None:  # not due: the counters moved within probe_idle_s, or the last probe is that recent
        return {"ok": True, "kind": "idle", "reason": "idle, /health 200 (no completion due)"}
    return {"ok": True, "kind": "idle", "reason": "idle, completion answered"}


# --------------------------------------------------------------------------
# Bounded healing


def new_state(now: float) -> Dict[str, Any]:
    return {
        "phase": "starting",
        "phase_since": now,
        "fails": 0,
        "critical_ticks": 0,
        "restarts": [],  # monotonic times of restarts inside the window (ours and systemd's)
        "next_restart_at": None,
        "n_restarts_seen": None,
        "progress": None,
        "progress_at": None,
        "last_evict_at": None,
        "reason": "watchdog started",
        "epoch": 0,
        "counts": {"wedges": 0, "restarts": 0, "floor_warn": 0, "floor_critical": 0, "gave_up": 0, "probes": 0},
        # the idle probe's pacing (_watchdog_counters.track_idle / probe_due)
        "idle_since": None,
        "idle_counters": None,
        "probes_pending": 0,
        "last_probe_at": None,
        "probe_failed": False,
    }


def backoff_s(cfg: Dict[str, Any], restarts_in_window: int) -> float:
    """Wait before the next restart: initial * 2^(k-1) after k restarts, capped."""
    if restarts_in_window <= 0:
        return 0.0
    return min(cfg["backoff_max_s"], cfg["backoff_initial_s"] * (2 ** (restarts_in_window - 1)))


def _set_phase(state: Dict[str, Any], phase: str, now: float, reason: str) -> None:
    if state["phase"] != phase:
        state["phase"] = phase
        state["phase_since"] = now
    state["reason"] = reason


def _systemd_restarts(cfg: _D, s: _D, obs: _D, now: float, evidence: _D, actions: _Acts) -> int:
    """Age the window; count the restarts systemd made by itself (Restart=on-failure) in it."""
    s["restarts"] = [t for t in s["restarts"] if now - t < cfg["window_s"]]
    seen = obs.get("n_restarts")
    by_systemd = 0
    if isinstance(seen, int):
        if s["n_restarts_seen"] is not None and seen > s["n_restarts_seen"]:
            by_systemd = seen - s["n_restarts_seen"]
            s["restarts"] += [now] * by_systemd
            s["counts"]["restarts"] += by_systemd
        s["n_restarts_seen"] = seen
    if by_systemd:
        # the launcher exited (69: a rank, a rank process or a peer failed; the rank link stopped
        # every rank) and systemd's Restart= brings it back: not the watchdog's restart to
        # repeat, but one more in the same bounded window
        actions.append({"do": "record", "action": "systemd-restart", "reason": (
            "systemd restarted the engine (exit status %s): %d restart(s) in the last %.0f s, limit %d" % (
                obs.get("exit_status"), len(s["restarts"]), cfg["window_s"], cfg["max_restarts"])),
            "evidence": evidence})  # fmt: skip
    return by_systemd


def _floors_step(cfg: _D, floors: _D, s: _D, obs: _D, now: float, actions: _Acts) -> Tuple[str, str]:
    """Memory floors: evict at the warning floor (every node); count critical ticks (rank 0 restarts)."""
    level, why = floor_level(obs.get("mem"), floors)
    s["floor"] = level
    s["critical_ticks"] = s["critical_ticks"] + 1 if level == "critical" else 0
    if level in ("warn", "critical"):
        last = s.get("last_evict_at")
        if last is None or now - last >= cfg["evict_every_s"]:
            s["last_evict_at"] = now
            s["counts"]["floor_warn"] += 1
            actions.append({"do": "evict", "reason": why, "evidence": {"mem": obs.get("mem"), "floors": floors}})
    return level, why


def _gave_up_step(s: _D, obs: _D, now: float, evidence: _D, actions: _Acts) -> None:
    """After a give-up only an operator's start is watched afresh."""
    if obs.get("unit") in ("active", "activating") and s.get("stopped_by_us"):
        s["stopped_by_us"] = False
        s["restarts"] = []  # the operator took over: a fresh window, not an immediate second give-up
        _set_phase(s, "starting", now, "engine started by an operator after the watchdog gave up")
        actions.append({"do": "record", "reason": s["reason"], "evidence": evidence})


def _systemd_bound(cfg: _D, s: _D, obs: _D, by_systemd: int) -> Optional[str]:
    """Rank 0: why the restarts systemd made (Restart= after every rank exited 69, its start limit) are
    over their bound, to give up the same way: every rank stopped and left stopped (None = not over)."""
    unit = obs.get("unit")
    if cfg["rank"] != 0 or s.get("stopped_by_us"):
        return None
    if by_systemd and len(s["restarts"]) > cfg["max_restarts"]:
        return "systemd restarted the engine %d times in %.0f s (limit %d; last exit status %s)" % (
            len(s["restarts"]), cfg["window_s"], cfg["max_restarts"], obs.get("exit_status"))  # fmt: skip
    if unit == "failed" and obs.get("result") == "start-limit-hit":
        return "systemd's start limit hit (StartLimitBurst) after %d restarts in %.0f s; last exit status %s" % (
            len(s["restarts"]), cfg["window_s"], obs.get("exit_status"))  # fmt: skip
    if unit == "failed" and s["restarts"]:
        # systemd restarted it, then stopped restarting (its start limit, an exit it does not
        # restart): the engine is down for good; make that a clear, whole-engine state
        return "the engine unit failed (%s, last exit status %s) after %d restart(s) in %.0f s" % (
            obs.get("result"), obs.get("exit_status"), len(s["restarts"]), cfg["window_s"])  # fmt: skip
    return None


def _give_up(s: _D, now: float, reason: str, evidence: _D, actions: _Acts) -> None:
    s["counts"]["gave_up"] += 1
    s["stopped_by_us"] = True
    _set_phase(s, "gave_up", now, reason)
    actions.append({"do": "stop", "reason": s["reason"], "evidence": evidence})


def _unit_not_active_step(s: _D, unit: Optional[str], now: float, evidence: _D, actions: _Acts) -> bool:
    """Stopped or failed not by us (an operator's stop, systemd's own start limit): never fight it."""
    if unit is None or unit in ("active", "activating", "reloading"):
        return False
    if s["phase"] != "stopped":
        _set_phase(s, "stopped", now, "engine unit is %s (not stopped by the watchdog): watching only" % unit)
        actions.append({"do": "record", "reason": s["reason"], "evidence": evidence})
    s["fails"] = 0
    return True


def _new_start_step(s: _D, obs: _D, unit: Optional[str], now: float) -> None:
    """A unit running again, a new invocation or systemd's own restart: back to "starting"."""
    invocation = obs.get("invocation")
    restarted = bool(invocation) and s.get("invocation") not in (None, invocation)
    if invocation:
        s["invocation"] = invocation
    if s["phase"] == "stopped":
        _set_phase(s, "starting", now, "engine unit is %s again" % unit)
    elif restarted and s["phase"] != "starting":
        # a new run of the unit between two ticks (systemctl restart by a play or an operator:
        # Type=exec is "active" at once, so "activating" may never be seen): a new load
        _set_phase(s, "starting", now, "engine unit started again (new invocation)")
        s["fails"] = 0
        s["rank_link_since"] = None
    elif unit == "activating" and s["phase"] != "starting":
        # systemd restarts it by itself (Restart=): a new start, counted through NRestarts
        _set_phase(s, "starting", now, "engine unit is activating (restarted by systemd)")
        s["fails"] = 0


def _verdict_step(cfg: _D, s: _D, obs: _D, now: float, level: str, why: str) -> Tuple[_D, bool]:
    """The liveness verdict, the progress counters remembered, a critical floor overriding the verdict."""
    verdict = liveness(cfg, obs, s, now)
    metrics = obs.get("metrics")
    if metrics and metrics.get("progress") is not None:
        if s["progress"] is None or progressed(s["progress"], metrics["progress"]) or not is_busy(metrics):
            s["progress"] = metrics["progress"]
            s["progress_at"] = now
    s["last_verdict"] = verdict
    critical = level == "critical" and s["critical_ticks"] >= cfg["floor_samples"]
    if critical:
        verdict = {"ok": False, "kind": "floor", "reason": why}
    return verdict, critical


def _rank_link_step(cfg: _D, s: _D, verdict: _D, now: float) -> bool:
    """True = a gone rank process or lost peer is left, within its grace, to the launchers' rank link: it
    stops every rank (exit 69) and systemd restarts the engine; a restart by the watchdog would fight it."""
    multi_node = bool(cfg["peers"]) or cfg["rank"] != 0
    if verdict["ok"] or not verdict.get("rank_link") or not multi_node or cfg["rank_link_grace_s"] <= 0:
        s["rank_link_since"] = None
        return False
    since = s.get("rank_link_since")
    if since is None:
        s["rank_link_since"] = since = now
    if now - since >= cfg["rank_link_grace_s"]:
        return False
    if s["phase"] != "starting":
        _set_phase(s, "suspect", now, "%s; left to the rank link for %.0f of %.0f s" % (
            verdict["reason"], now - since, cfg["rank_link_grace_s"]))  # fmt: skip
    return True


def _starting_step(
    cfg: _D, s: _D, verdict: _D, unit: Optional[str], critical: bool, now: float, evidence: _D, actions: _Acts
) -> Optional[_D]:
    """While starting: healthy ends the start; only the start timeout fails it (None = wait).

    A critical floor while the engine loads is the load's own memory (the mapped shard, the weights
    being pinned): on the VM lab node, launches at the planner's KV size dipped under it while loading
    (MemAvailable 155-224 MiB against 232 MiB) and served when left alone; restarting there killed each
    load in turn until the watchdog gave up (docs/VM-LAB.md). It is recorded once per start and left to the
    start timeout, the kernel (an OOM kill is systemd's restart, counted in the window) and the launcher's
    guard."""
    if s["phase"] != "starting":
        return verdict
    if verdict["ok"] and unit != "activating":
        _set_phase(s, "healthy", now, verdict["reason"])
        s["fails"] = 0
        return None
    waited = now - s["phase_since"]
    if critical and s.get("start_floor_noted_at") != s["phase_since"]:
        s["start_floor_noted_at"] = s["phase_since"]
        actions.append({"do": "record", "action": "floor-while-starting", "reason": (
            "%s while the engine is starting (%.0f s): left to the load (no restart before healthy; the start "
            "timeout %.0f s still applies)" % (verdict["reason"], waited, cfg["start_timeout_s"])),
            "evidence": evidence})  # fmt: skip
    # a load is slow and its ranks appear one by one (a start whose process exits is systemd's)
    if waited < cfg["start_timeout_s"]:
        return None
    s["fails"] = cfg["fail_threshold"]
    return {"ok": False, "kind": "start_timeout", "reason": "not healthy %.0f s after start (%s)" % (
        waited, verdict["reason"])}  # fmt: skip


def _fail_restart_step(cfg: _D, s: _D, verdict: _D, critical: bool, now: float, evidence: _D, actions: _Acts) -> None:
    """Recover, count a failure, back off, give up at the window's limit, or restart the engine (rank 0)."""
    if verdict["ok"]:
        if s["phase"] in ("suspect", "backoff"):
            _set_phase(s, "healthy", now, "recovered: %s" % verdict["reason"])
        s["fails"] = 0
        return
    s["fails"] += 1
    if critical:
        s["fails"] = max(s["fails"], cfg["fail_threshold"])
    if s["fails"] < cfg["fail_threshold"]:
        _set_phase(s, "suspect", now, verdict["reason"])
        return
    if s["phase"] != "backoff":
        s["counts"]["floor_critical" if critical else "wedges"] += 1
    if cfg["rank"] != 0:  # peers report; rank 0 restarts the whole engine
        _set_phase(s, "suspect", now, verdict["reason"])
        return
    if len(s["restarts"]) >= cfg["max_restarts"]:
        _give_up(s, now, "gave up after %d restarts in %.0f s; last: %s" % (
            len(s["restarts"]), cfg["window_s"], verdict["reason"]), evidence, actions)  # fmt: skip
        return
    wait = backoff_s(cfg, len(s["restarts"]))
    not_before = (max(s["restarts"]) + wait) if s["restarts"] else now
    if now < not_before and not critical:
        s["next_restart_at"] = not_before
        _set_phase(s, "backoff", now, "%s; next restart in %.0f s" % (verdict["reason"], not_before - now))
        return
    s["restarts"].append(now)
    s["counts"]["restarts"] += 1
    s["epoch"] += 1
    s.update(
        fails=0,
        critical_ticks=0,
        next_restart_at=None,
        progress=None,
        progress_at=None,
        idle_since=None,
        idle_counters=None,
        probes_pending=0,
    )
    _set_phase(s, "starting", now, "restart %d: %s" % (s["epoch"], verdict["reason"]))
    s["phase_since"] = now  # a restart from "starting" (start timeout, critical floor) gets its own start_timeout_s
    actions.append({"do": "restart", "reason": verdict["reason"], "kind": verdict["kind"], "evidence": evidence})


def _healed_step(cfg: _D, s: _D, now: float, actions: _Acts) -> None:
    """Restarts followed by ``healthy_reset_s`` of healthy serving healed their fault: they leave the budget
    (window limit and backoff), and systemd's own (the unit's StartLimitBurst starts per
    StartLimitIntervalSec, which would refuse the start after a later fault's exit 69 and leave the engine
    down: the program resets it with ``systemctl reset-failed``, which an active unit keeps running
    through). A start that fails again sooner keeps counting: that is a crash loop."""
    since = s["phase_since"]
    if s["phase"] != "healthy" or now - since < cfg["healthy_reset_s"]:
        return
    healed = [t for t in s["restarts"] if t <= since]
    if not healed:
        return
    s["restarts"] = [t for t in s["restarts"] if t > since]
    actions.append({"do": "reset-start-limit", "action": "budget-reset", "reason": (
        "healthy for %.0f s (healthy_reset_s %.0f): %d earlier restart(s) healed, no longer counted against "
        "the limit of %d per %.0f s nor systemd's start limit" % (
            now - since, cfg["healthy_reset_s"], len(healed), cfg["max_restarts"], cfg["window_s"])),
        "evidence": {"healed": len(healed)}})  # fmt: skip


def decide(
    cfg: Dict[str, Any], floors: Dict[str, Any], state: Dict[str, Any], obs: Dict[str, Any], now: float
) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    """The next state and the actions for one tick (rank 0 decides restarts; peers only evict and report).

    Actions: ``{"do": "evict" | "restart" | "stop" | "reset-start-limit" | "record", "reason": ...,
    "evidence": {...}}`` (``reset-start-limit``: ``systemctl reset-failed`` of this node's unit, recorded).
    """
    s = copy.deepcopy(state)
    actions: List[Dict[str, Any]] = []
    evidence = {k: obs.get(k) for k in ("unit", "local", "health", "metrics", "probe", "peers", "mem") if k in obs}
    by_systemd = _systemd_restarts(cfg, s, obs, now, evidence, actions)
    level, why = _floors_step(cfg, floors, s, obs, now, actions)
    counters.track_idle(s, obs, now)
    if s["phase"] == "gave_up":
        _gave_up_step(s, obs, now, evidence, actions)
        return s, actions
    unit = obs.get("unit")
    bound = _systemd_bound(cfg, s, obs, by_systemd)
    if bound is not None:
        _give_up(s, now, "gave up: %s" % bound, evidence, actions)
        return s, actions
    if _unit_not_active_step(s, unit, now, evidence, actions):
        return s, actions
    _new_start_step(s, obs, unit, now)
    verdict, critical = _verdict_step(cfg, s, obs, now, level, why)
    if _rank_link_step(cfg, s, verdict, now):
        return s, actions
    verdict = _starting_step(cfg, s, verdict, unit, critical, now, evidence, actions)
    if verdict is not None:
        _fail_restart_step(cfg, s, verdict, critical, now, evidence, actions)
    _healed_step(cfg, s, now, actions)
    return s, actions


# --------------------------------------------------------------------------
# Peers: what a node publishes and how rank 0 reads it


def peer_view(status: Optional[Dict[str, Any]], age_s: Optional[float], cfg: Dict[str, Any]) -> Dict[str, Any]:
    """A peer's published status as rank 0 sees it: ok / why not."""
    if status is None:
        return {"ok": False, "reason": "watchdog status unreachable for %.0f s" % (age_s or 0), "stale": True}
    if age_s is not None and age_s > cfg["peer_timeout_s"]:
        return {"ok": False, "reason": "status %.0f s old (bound %.0f s)" % (age_s, cfg["peer_timeout_s"])}
    local = status.get("local") or {}
    if status.get("unit") not in ("active", "activating", "reloading"):
        return {"ok": False, "reason": "engine unit is %s" % status.get("unit")}
    if not local.get("ok"):
        return {"ok": False, "reason": local.get("reason") or "rank processes missing",
                "stopped": bool(local.get("stopped"))}  # fmt: skip
    return {"ok": True, "reason": "alive", "critical_floor": status.get("floor") == "critical"}


def peer_reaction(leader: Optional[Dict[str, Any]], mine: Dict[str, Any]) -> Optional[str]:
    """What a peer does after reading rank 0's status: None, "stop", "start" or "stay_stopped".

    ``mine`` holds ``acked_stop``, ``acked_start`` (the epochs this peer has
    carried out) and ``acked_gave_up`` (rank 0's give-ups it has carried out).
    Rank 0 publishes ``epoch`` and, only while it restarts the
    engine, the handshake phases ``restart_stop`` then ``restart_start``
    (held until the peers acknowledge or ``peer_ack_timeout_s``), or
    ``gave_up``. Any other phase is rank 0's own business: a peer that starts
    (or restarts its watchdog) while rank 0 is healthy never touches its engine.
    """
    if not leader:
        return None
    epoch = leader.get("epoch") or 0
    phase = leader.get("phase")
    if phase == "gave_up":
        # each give-up is counted by rank 0 (counts.gave_up); a peer carries each out once
        given_up = (leader.get("counts") or {}).get("gave_up") or 0
        return "stay_stopped" if given_up > (mine.get("acked_gave_up") or 0) else None
    if epoch > (mine.get("acked_stop") or 0) and phase in ("restart_stop", "restart_start"):
        return "stop"
    if epoch > (mine.get("acked_start") or 0) and phase == "restart_start":
        return "start"
    return None
