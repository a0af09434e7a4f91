# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""uma_watchdog: keep one vLLM engine serving on this node, within bounds (uma.vllm).

One watchdog per engine per node, run by ``uma-vllm-watchdog@<engine>.service``
with the node's python3 and no Ansible::

    python3 /usr/local/lib/uma-vllm/uma_watchdog.py --config /etc/uma-vllm/watchdog/main.json

Every ``interval_s`` it observes (the engine unit's state through systemctl;
this node's rank processes in the unit's cgroup; on rank 0 ``/health``,
vLLM's ``/metrics`` and, when idle, a real 1-token completion; the peers'
published status; ``/proc/meminfo``), lets ``_watchdog_logic.decide`` choose,
and carries the actions out: evict the model's page cache, restart the whole
engine (every rank, in order), or stop every rank and stay stopped. Each
action goes to the journal (stdout) and to ``<state_dir>/watchdog/<engine>/``
(``state.json``, ``events.json``; atomic writes), its state to systemd
(``sd_notify STATUS=``) and to a node-exporter textfile.

Multi-node engines: every node's watchdog serves its status as JSON on
``status_bind:status_port`` (GET /status, read-only). Rank 0 reads each peer's
status every tick; a peer whose rank processes are gone, whose unit is down or
whose status is older than ``peer_timeout_s`` is a dead rank. Peers read rank
0's status and carry out its restarts on their own unit (see docs/WATCHDOG.md).

Exit codes: 0 stopped by a signal, 2 bad arguments, 78 bad configuration (one line naming the
file, the key and the fix; ``--check-config`` validates the config and exits 0 or 78).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from ..base import checks as _checks
from ..base.common import UmaError, node_write, node_write_json, read_meminfo, read_state
from ..base.metrics import render
from ..base.stopper import Stopper
from ..base.systemd import Systemd
from ..guard import memory as _guard_memory
from ..guard.residency import evict_paths, iter_files
from . import logic, probes

PROG = "uma-vllm-watchdog"
EXIT_CONFIG = 78
EVENTS_KEPT = 200
SHOW = ("ActiveState", "SubState", "MainPID", "ControlGroup", "NRestarts", "Result", "ExecMainStatus", "InvocationID")

METRICS: Dict[str, Tuple[str, str]] = {
    "uma_vllm_watchdog_state": ("gauge", "1 for the watchdog's current phase of the engine (label phase)."),
    "uma_vllm_watchdog_gave_up": ("gauge", "1 when the restart limit was hit and every rank is left stopped."),
    "uma_vllm_watchdog_probe_latency_seconds": ("gauge", "Latency of the last probe (label probe)."),
    "uma_vllm_watchdog_probe_ok": ("gauge", "1 if the last probe succeeded (label probe)."),
    "uma_vllm_watchdog_wedges_total": ("counter", "Wedged or half-dead engines detected."),
    "uma_vllm_watchdog_restarts_total": ("counter", "Engine restarts (the watchdog's and systemd's)."),
    "uma_vllm_watchdog_probes_total": (
        "counter",
        "1-token completions the watchdog sent (vLLM counts them in its own request metrics too).",
    ),
    "uma_vllm_watchdog_restarts_in_window": ("gauge", "Restarts inside the current limit window."),
    "uma_vllm_watchdog_floor_events_total": ("counter", "Memory floor events (label level: warn, critical)."),
    "uma_vllm_watchdog_mem_available_bytes": ("gauge", "MemAvailable the floors compare."),
    "uma_vllm_watchdog_floor_bytes": ("gauge", "The memory floors in force (label level)."),
    "uma_vllm_watchdog_peer_ok": ("gauge", "1 if the peer rank is alive as rank 0 sees it (label peer)."),
    "uma_vllm_watchdog_timestamp_seconds": ("gauge", "When the watchdog wrote this file (Unix time)."),
}


def log(engine: str, text: str) -> None:
    sys.stdout.write("[%s %s] %s\n" % (PROG, engine, text))
    sys.stdout.flush()


def _event_problem(events: List[Any]) -> Optional[str]:
    """events.json is a list of objects (the ones record() writes)."""
    bad = [i for i, e in enumerate(events) if not isinstance(e, dict)]
    return "holds an entry that is not an object (index %d)" % bad[0] if bad else None


STAMP_RE = re.compile(r"^[0-9]{8}T[0-9]{6}Z-[0-9]+$")  # a launch record's directory (uma_launch's stamp())
LAUNCH_RECORD_CAP = 1 << 20


def _restarted_since(seen: Optional[int], now: Optional[int]) -> bool:
    return isinstance(seen, int) and isinstance(now, int) and now > seen


def _launch_record(path: str) -> Optional[Dict[str, Any]]:
    """A launcher's launch.json, read-only (never renamed: it is the launcher's file), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as fh:
            record = json.loads(fh.read(LAUNCH_RECORD_CAP + 1).decode("utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def last_launch_exit(state_dir: str, engine: str) -> Optional[int]:
    """The exit code the launcher recorded for this engine's run that ended last, or None.

    ``<state_dir>/launches/<engine>/<stamp>/launch.json``: the running launch's record has no exit
    code yet (``exit_code`` null), the one before it has the code its launcher exited with. Only the
    two newest records (by their start time) are read: a run killed before it wrote its code (SIGKILL
    of the launcher) must not be reported with an older run's code."""
    base = os.path.join(state_dir, "launches", engine)
    try:
        names = sorted((n for n in os.listdir(base) if STAMP_RE.match(n)), reverse=True)[:4]
    except OSError:
        return None
    records = [r for r in (_launch_record(os.path.join(base, n, "launch.json")) for n in names) if r is not None]

    def started(record: Dict[str, Any]) -> float:
        t = record.get("started_at_epoch")
        return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else 0.0

    for record in sorted(records, key=started, reverse=True)[:2]:
        code = record.get("exit_code")
        if isinstance(code, int) and not isinstance(code, bool):
            return code
    return None


STATE_EPOCHS = ("epoch", "acked_stop", "acked_start", "acked_gave_up")
WHOLE = "a whole number >= 0"


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def read_back(old: Dict[str, Any]) -> Tuple[Dict[str, Any], List[str]]:
    """What a (re)started watchdog takes from its own state.json (what publish() wrote), field by field,
    and each field it cannot use, named with its value (``epoch = "3" is not a whole number >= 0``).

    phase: one of logic.PUBLISHED_PHASES; reason: text; the epochs (STATE_EPOCHS): whole numbers >= 0;
    counts: an object whose known counters are whole numbers >= 0 (other keys are not read). A field that
    cannot be used is left out: the watchdog keeps a fresh one's value for it."""
    good: Dict[str, Any] = {}
    problems: List[str] = []

    def take(field: str, value: Any, usable: bool, want: str) -> None:
        if usable:
            good[field] = value
        else:
            shown = json.dumps(value, sort_keys=True)
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            problems.append("%s = %s is not %s" % (field, shown, want))

    if "phase" in old:
        phases = "one of %s" % ", ".join(logic.PUBLISHED_PHASES)
        take("phase", old["phase"], isinstance(old["phase"], str) and old["phase"] in logic.PUBLISHED_PHASES, phases)
    if "reason" in old:
        take("reason", old["reason"], isinstance(old["reason"], str), "text")
    for key in STATE_EPOCHS:
        if key in old:
            take(key, old[key], _whole(old[key]), WHOLE)
    if "counts" in old and not isinstance(old["counts"], dict):
        take("counts", old["counts"], False, "an object of counters")
    elif "counts" in old:
        known = logic.new_state(0.0)["counts"]
        good["counts"] = {}
        for key in sorted(set(old["counts"]) & set(known)):
            if _whole(old["counts"][key]):
                good["counts"][key] = old["counts"][key]
            else:
                take("counts.%s" % key, old["counts"][key], False, WHOLE)
    return good, problems


# --------------------------------------------------------------------------
# The watchdog


class Watchdog:
    def __init__(
        self,
        cfg: Dict[str, Any],
        systemd: Optional[Systemd] = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        lock_memory: Optional[Callable[[], Tuple[Optional[int], Optional[str]]]] = None,
    ) -> None:
        self.cfg = cfg
        self.engine = cfg["engine"]
        self.clock = clock
        self.sleep = sleep
        # mlockall(MCL_CURRENT | MCL_ONFAULT) -> (VmLck KiB, None) or (None, why not); tests inject one
        self.lock_memory = lock_memory or _guard_memory.lock_own_memory
        self.systemd = systemd or Systemd(_run, cfg["systemctl"], None)
        self.dir = os.path.join(cfg["state_dir"], "watchdog", self.engine)
        mem = read_meminfo(cfg["meminfo_root"])
        ram = int(cfg["ram_gib"] * logic.GIB) if cfg.get("ram_gib") else mem.get("MemTotal", 0)
        self.floors = logic.size_floors(ram, cfg.get("warn_floor_mib"), cfg.get("critical_floor_mib"))
        self.min_free = self._min_free()
        self.state = logic.new_state(clock())
        state_path = os.path.join(self.dir, "state.json")
        recorded = read_state(state_path, dict, prog=PROG) or {}
        old, problems = read_back(recorded)
        if problems:  # said once, at start: the next publish() writes every field anew
            log(self.engine, "state file %s: %s; a fresh watchdog's value is used for each, the other fields are "
                "read back, and the next tick rewrites the file" % (state_path, "; ".join(problems)))  # fmt: skip
        # epochs survive a watchdog restart: rank 0 never reuses one, a peer never redoes one
        self.mine: Dict[str, Any] = {key: old.get(key, 0) for key in ("acked_stop", "acked_start", "acked_gave_up")}
        self.state["epoch"] = old.get("epoch", 0)
        self.state["counts"].update(old.get("counts", {}))
        if old.get("phase") == "gave_up":
            self.state["phase"] = "gave_up"
            self.state["stopped_by_us"] = True
            reason = old.get("reason", "gave up before this watchdog started")
            if "reason" in recorded and "reason" not in old:  # a hand-edited or damaged record: the verdict stays
                reason = "gave up before this watchdog started (its recorded reason was not text: %s)" % (
                    json.dumps(recorded["reason"], sort_keys=True)
                )
            self.state["reason"] = reason
        events = read_state(os.path.join(self.dir, "events.json"), list, _event_problem, PROG)
        self.events: List[Dict[str, Any]] = (events or [])[-EVENTS_KEPT:]
        self.peer_seen: Dict[str, Tuple[Optional[Dict[str, Any]], float]] = {}
        self.model: Optional[str] = None
        self.last_obs: Dict[str, Any] = {}
        self.last_probe: Optional[Dict[str, Any]] = None  # the idle probe runs at most once per probe_idle_s
        self.server: Optional[probes.StatusServer] = None
        # the engine's link key: the status this node serves and the peers' it reads are signed with it
        self.key: Optional[bytes] = None
        self.refusals = probes.auth.Refusals(self.say)
        if cfg.get("key_file"):
            self.key = _checks.secret_key("key_file", cfg["key_file"], owners=(0, os.geteuid()))
        elif cfg["status_port"]:
            log(self.engine, "WARNING: the status on port %s is not authenticated (no key_file)" % cfg["status_port"])
        if cfg["status_port"]:
            self.server = probes.StatusServer(cfg["status_bind"], cfg["status_port"], self.key, self.say)
        self.publish_phase: Optional[str] = None
        self.last_exit: Optional[int] = None
        self.n_restarts_seen: Optional[int] = None  # NRestarts at the last tick, to see a restart between ticks
        self._started = clock()
        self.ticks = 0
        self.write_errors: Set[str] = set()

    def _min_free(self) -> int:
        try:
            with open(os.path.join(self.cfg["meminfo_root"], "sys", "vm", "min_free_kbytes"), encoding="ascii") as h:
                return int(h.read().split()[0]) * 1024
        except (OSError, ValueError, IndexError):
            return 0

    def say(self, text: str) -> None:
        log(self.engine, text)

    # ---- records
    def record(self, what: str, reason: str, evidence: Optional[Dict[str, Any]] = None) -> None:
        entry = {
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "epoch_s": round(time.time(), 3),
            "engine": self.engine,
            "rank": self.cfg["rank"],
            "action": what,
            "reason": reason,
            "phase": self.state["phase"],
            "evidence": evidence or {},
        }
        log(self.engine, "%s: %s evidence=%s" % (what, reason, json.dumps(evidence or {}, sort_keys=True)))
        self.events = [*self.events, entry][-EVENTS_KEPT:]
        try:
            node_write_json(os.path.join(self.dir, "events.json"), self.events)
        except OSError as err:
            self.cannot_write(err)

    def cannot_write(self, err: OSError) -> None:
        """A write that failed, said once per file and reason (not on every tick)."""
        text = "cannot write %s: %s" % (err.filename, err.strerror or err)
        if text not in self.write_errors:
            self.write_errors.add(text)
            log(self.engine, text)

    def snapshot(self) -> Dict[str, Any]:
        s = self.state
        now = self.clock()
        return {
            "engine": self.engine,
            "rank": self.cfg["rank"],
            "phase": self.publish_phase or s["phase"],
            "epoch": s["epoch"],
            "reason": s["reason"],
            "floor": s.get("floor", "ok"),
            "floors": self.floors,
            "counts": s["counts"],
            "restarts_in_window": len([t for t in s["restarts"] if now - t < self.cfg["window_s"]]),
            "unit": self.last_obs.get("unit"),
            "local": self.last_obs.get("local"),
            "acked_stop": self.mine["acked_stop"],
            "acked_start": self.mine["acked_start"],
            "acked_gave_up": self.mine["acked_gave_up"],
            "updated_at": round(time.time(), 3),
            "tick": self.ticks,
            "last_verdict": s.get("last_verdict"),
        }

    def publish(self) -> None:
        snap = self.snapshot()
        if self.server is not None:
            self.server.published = snap
        try:
            node_write_json(os.path.join(self.dir, "state.json"), snap)
        except OSError as err:
            self.cannot_write(err)
        probes.sd_notify("STATUS=%s: %s" % (snap["phase"].upper(), snap["reason"][:200]))
        if self.cfg.get("textfile_dir"):
            self.write_metrics(snap)

    def write_metrics(self, snap: Dict[str, Any]) -> None:
        labels = {"engine": self.engine}
        out: List[Tuple[str, Dict[str, Any], float]] = []
        for phase in logic.PUBLISHED_PHASES:
            out.append(("uma_vllm_watchdog_state", dict(labels, phase=phase), 1 if snap["phase"] == phase else 0))
        out.append(("uma_vllm_watchdog_gave_up", labels, 1 if self.state["phase"] == "gave_up" else 0))
        for name in ("health", "probe"):
            probe = self.last_probe if name == "probe" else self.last_obs.get(name)
            if probe:
                out.append(("uma_vllm_watchdog_probe_ok", dict(labels, probe=name), 1 if probe["ok"] else 0))
                if probe.get("latency_s") is not None:
                    out.append(
                        ("uma_vllm_watchdog_probe_latency_seconds", dict(labels, probe=name), probe["latency_s"])
                    )
        counts = snap["counts"]
        out.append(("uma_vllm_watchdog_wedges_total", labels, counts["wedges"]))
        out.append(("uma_vllm_watchdog_restarts_total", labels, counts["restarts"]))
        out.append(("uma_vllm_watchdog_probes_total", labels, counts.get("probes", 0)))
        out.append(("uma_vllm_watchdog_restarts_in_window", labels, snap["restarts_in_window"]))
        out.append(("uma_vllm_watchdog_floor_events_total", dict(labels, level="warn"), counts["floor_warn"]))
        out.append(("uma_vllm_watchdog_floor_events_total", dict(labels, level="critical"), counts["floor_critical"]))
        mem = self.last_obs.get("mem") or {}
        if mem.get("available") is not None:
            out.append(("uma_vllm_watchdog_mem_available_bytes", labels, mem["available"]))
        out.append(("uma_vllm_watchdog_floor_bytes", dict(labels, level="warn"), self.floors["warn_bytes"]))
        out.append(("uma_vllm_watchdog_floor_bytes", dict(labels, level="critical"), self.floors["critical_bytes"]))
        for name, peer in sorted((self.last_obs.get("peers") or {}).items()):
            out.append(("uma_vllm_watchdog_peer_ok", dict(labels, peer=name), 1 if peer["ok"] else 0))
        out.append(("uma_vllm_watchdog_timestamp_seconds", labels, round(time.time(), 3)))
        path = os.path.join(self.cfg["textfile_dir"], "uma_vllm_watchdog_%s.prom" % self.engine)
        try:
            node_write(path, render(out, METRICS))
        except OSError as err:
            self.cannot_write(err)

    # ---- observations
    def observe(self) -> Dict[str, Any]:
        cfg = self.cfg
        obs: Dict[str, Any] = {}
        show: Dict[str, str] = {}
        try:
            show = self.systemd.show(cfg["unit"], SHOW)
            obs["unit"] = show.get("ActiveState") or "unknown"
            n = show.get("NRestarts", "")
            obs["n_restarts"] = int(n) if n.isdigit() else None
            obs["result"] = show.get("Result") or None
            obs["invocation"] = show.get("InvocationID") or None
            status = show.get("ExecMainStatus", "")
            if status.isdigit() and int(status) != 0 and obs["unit"] != "active":
                # the last failed exit (e.g. 69 from the rank link), kept over the restart that follows
                self.last_exit = int(status)
            if _restarted_since(self.n_restarts_seen, obs["n_restarts"]):
                # systemd restarted the unit since the last tick: with a RestartSec shorter than a tick the
                # failed run was never seen inactive, and ExecMainStatus is now the new run's (0); the
                # launcher's own record of the run that ended still says how it ended
                code = last_launch_exit(cfg["state_dir"], self.engine)
                if code:
                    self.last_exit = code
            if obs["n_restarts"] is not None:
                self.n_restarts_seen = obs["n_restarts"]
            obs["exit_status"] = self.last_exit
            obs["local"] = probes.check_local(cfg, show, self.systemd.runner)
        except UmaError as err:
            obs["unit"] = "unknown"
            obs["local"] = {"ok": False, "reason": err.message}
        try:
            obs["mem"] = logic.memory_view(read_meminfo(cfg["meminfo_root"]), cfg["unified_memory"], self.min_free)
        except OSError:
            obs["mem"] = None
        if cfg["peers"]:
            obs["peers"] = self.observe_peers()
        # A dead or stopped rank, here or on a peer, already decides the tick (liveness: first failure
        # wins): no HTTP to wait for, so the next tick comes after interval_s, not after a completion
        # that hangs behind the stopped rank for probe_timeout_s (issue 19: a wedge on rank 1 decided
        # as fast as one on rank 0).
        if cfg["rank"] == 0 and obs["unit"] in ("active", "reloading") and not _decided(obs):
            obs["health"] = probes.probe_health(cfg)
            if obs["health"]["ok"]:
                obs["metrics"] = probes.read_metrics(cfg)
                if logic.probe_due(cfg, self.state, obs["metrics"], self.clock()):
                    self.probe(obs, show)
        return obs

    def probe(self, obs: Dict[str, Any], show: Dict[str, str]) -> None:
        """The idle probe. While it waits, the ranks are looked at again every second: a completion that
        hangs behind a rank stopped meanwhile must not hold the tick for probe_timeout_s; the stopped rank
        decides the tick instead (and the probe's answer, whenever it comes, no longer matters)."""
        cfg = self.cfg
        self.model = self.model or probes.model_id(cfg)
        pending = probes.start_completion(cfg, self.model)
        looked = self.clock()
        while not pending.done():
            self.sleep(0.05)
            if self.clock() - looked < min(1.0, cfg["interval_s"]):
                continue
            looked = self.clock()
            obs["local"] = probes.check_local(cfg, show, self.systemd.runner)
            if cfg["peers"]:
                obs["peers"] = self.observe_peers()
            if _decided(obs):
                return
        obs["probe"] = self.last_probe = pending.result()
        if not obs["probe"]["ok"]:
            self.model = None  # ask again: the engine may have been replaced

    def observe_peers(self) -> Dict[str, Any]:
        now = self.clock()
        views = {}
        timeout = min(self.cfg["health_timeout_s"], self.cfg["peer_timeout_s"])
        for peer in self.cfg["peers"]:
            status = probes.fetch_status(peer["url"], timeout, self.key, self.refusals)
            if status is not None:
                # fresh = the peer's tick counter moved (by this node's clock: no clock sync needed);
                # a peer whose loop hangs while its status thread still answers goes stale
                old = self.peer_seen.get(peer["name"])
                if old is None or old[0] is None or old[0].get("tick") != status.get("tick"):
                    self.peer_seen[peer["name"]] = (status, now)
                else:
                    self.peer_seen[peer["name"]] = (status, old[1])
            seen, at = self.peer_seen.get(peer["name"], (None, self._started))
            views[peer["name"]] = logic.peer_view(seen, now - at, self.cfg)
        return views

    # ---- actions
    def evict(self) -> Dict[str, Any]:
        if self.cfg["evict_scope"] == "global":
            try:
                with open(
                    os.path.join(self.cfg["meminfo_root"], "sys", "vm", "drop_caches"), "w", encoding="ascii"
                ) as h:
                    h.write("1\n")
                return {"scope": "global"}
            except OSError as err:
                return {"scope": "global", "error": str(err)}
        total, files = 0, 0
        if self.cfg.get("model_path"):
            total, files = evict_paths(entry[0] for entry in iter_files([self.cfg["model_path"]]))
        return {"scope": "model", "files": files, "bytes_advised": total}

    def stop_own(self) -> Dict[str, Any]:
        started = self.clock()
        try:
            self.systemd.stop(self.cfg["unit"])
            error = None
        except UmaError as err:
            error = err.message
        evicted = self.evict()  # a stopped engine leaves no cache behind
        return {
            "stopped": self.cfg["unit"],
            "error": error,
            "evicted": evicted,
            "duration_s": round(self.clock() - started, 3),
        }

    def reset_start_limit(self) -> Dict[str, Any]:
        """systemd's start limit of this node's unit cleared (``reset-failed``; the unit keeps running)."""
        try:
            self.systemd.reset_start_limit(self.cfg["unit"])
            return {"start_limit_reset": self.cfg["unit"]}
        except UmaError as err:
            return {"start_limit_reset": None, "error": err.message}

    def start_own(self) -> Dict[str, Any]:
        self.systemd.reset_failed(self.cfg["unit"])
        try:
            self.systemd.start(self.cfg["unit"])
            return {"started": self.cfg["unit"]}
        except UmaError as err:
            return {"started": self.cfg["unit"], "error": err.message}

    def wait_peers(self, key: str, epoch: int) -> Dict[str, Any]:
        """Wait (bounded) until every peer has acked ``epoch`` in ``key``; who did and who did not."""
        deadline = self.clock() + self.cfg["peer_ack_timeout_s"]
        pending = {p["name"]: p["url"] for p in self.cfg["peers"]}
        while pending and self.clock() < deadline:
            for name, url in list(pending.items()):
                status = probes.fetch_status(url, self.cfg["health_timeout_s"], self.key, self.refusals)
                if status and (status.get(key) or 0) >= epoch:
                    del pending[name]
            if pending:
                self.sleep(0.5)
        return {
            "acked": sorted(p["name"] for p in self.cfg["peers"] if p["name"] not in pending),
            "missing": sorted(pending),
        }

    def restart_all(self, action: Dict[str, Any]) -> None:
        """Rank 0: stop this rank, peers stop theirs, then start in order: rank 0, then the peers."""
        epoch = self.state["epoch"]
        evidence = dict(action.get("evidence") or {}, epoch=epoch, kind=action.get("kind"))
        evidence["decided_at_epoch_s"] = round(time.time(), 3)
        self.publish_phase = "restart_stop"
        self.publish()
        evidence["stop"] = self.stop_own()
        if self.cfg["peers"]:
            evidence["peers_stopped"] = self.wait_peers("acked_stop", epoch)
        evidence["start"] = self.start_own()
        self.publish_phase = "restart_start"
        self.publish()
        if self.cfg["peers"]:
            evidence["peers_started"] = self.wait_peers("acked_start", epoch)
        self.publish_phase = None
        self.record("restart", action["reason"], evidence)

    def stop_all(self, action: Dict[str, Any]) -> None:
        evidence = dict(action.get("evidence") or {}, decided_at_epoch_s=round(time.time(), 3))
        self.publish_phase = "gave_up"
        self.publish()
        evidence["stop"] = self.stop_own()
        if self.cfg["peers"]:
            evidence["peers_stopped"] = self.wait_peers("acked_gave_up", self.state["counts"]["gave_up"])
        self.publish_phase = None
        self.record("gave_up", action["reason"], evidence)

    def leader_reaction(self) -> Tuple[Optional[str], Optional[Dict[str, Any]]]:
        """Rank 0's status now and what this peer does about it (logic.peer_reaction)."""
        leader = probes.fetch_status(self.cfg["leader_url"], self.cfg["health_timeout_s"], self.key, self.refusals)
        return logic.peer_reaction(leader, self.mine), leader

    def follow_leader(self) -> None:
        """Peers: carry out rank 0's restart or stop on this node's unit."""
        what, leader = self.leader_reaction()
        if what is None or leader is None:
            return
        self.carry_out(what, leader)
        if what != "stop":
            return
        # rank 0 starts its own rank as soon as every peer has acked the stop: look again within
        # this tick instead of one interval_s later, so this rank's start follows rank 0's at once
        deadline = self.clock() + self.cfg["interval_s"]
        while self.clock() < deadline:
            self.sleep(min(0.5, self.cfg["interval_s"]))
            what, leader = self.leader_reaction()
            if what is not None and leader is not None:
                if what == "start":
                    self.carry_out(what, leader)
                return  # anything else (a new stop, a give-up) is the next tick's

    def carry_out(self, what: str, leader: Dict[str, Any]) -> None:
        epoch = leader.get("epoch") or 0
        if what == "stop":
            self.record("peer-stop", "rank 0 restarts the engine (epoch %d)" % epoch, self.stop_own())
            self.mine["acked_stop"] = epoch
            self.state["phase"] = "stopped"  # by rank 0's order, not an operator's stop
            self.state["reason"] = "stopped for rank 0's restart (epoch %d)" % epoch
        elif what == "start":
            self.record("peer-start", "rank 0 restarts the engine (epoch %d)" % epoch, self.start_own())
            self.mine["acked_start"] = epoch
            self.state = self._fresh(epoch)
        elif what == "stay_stopped":
            self.record("peer-gave-up", "rank 0 gave up: %s" % leader.get("reason"), self.stop_own())
            self.mine["acked_gave_up"] = (leader.get("counts") or {}).get("gave_up") or 0
            self.state["phase"] = "gave_up"
            self.state["stopped_by_us"] = True
            self.state["reason"] = "rank 0 gave up: %s" % leader.get("reason")
        self.publish()

    def _fresh(self, epoch: int) -> Dict[str, Any]:
        state = logic.new_state(self.clock())
        state["epoch"] = epoch
        state["counts"] = self.state["counts"]
        state["restarts"] = self.state["restarts"]
        return state

    # ---- one tick, the loop
    def tick(self) -> List[Dict[str, Any]]:
        self.ticks += 1
        if self.cfg["rank"] != 0:
            self.follow_leader()
        obs = self.observe()
        self.last_obs = obs
        before = self.state["phase"]
        self.state, actions = logic.decide(self.cfg, self.floors, self.state, obs, self.clock())
        for action in actions:
            if action["do"] == "evict":
                self.record("evict", action["reason"], dict(action["evidence"], result=self.evict()))
            elif action["do"] == "restart":
                self.restart_all(action)
            elif action["do"] == "stop":
                self.stop_all(action)
            elif action["do"] == "reset-start-limit":
                self.record(action["action"], action["reason"], dict(action["evidence"], **self.reset_start_limit()))
            else:
                self.record(action.get("action") or action["do"], action["reason"], action.get("evidence"))
        if self.state["phase"] != before and not any(
            a["do"] in ("restart", "stop", "record", "reset-start-limit") for a in actions
        ):
            self.record("phase", "%s -> %s: %s" % (before, self.state["phase"], self.state["reason"]), {
                "verdict": self.state.get("last_verdict")})  # fmt: skip
        self.publish()
        return actions

    def run(self, stop: Stopper, max_ticks: Optional[int] = None) -> int:
        self._started = self.clock()
        evidence: Dict[str, Any] = {"floors": self.floors, "peers": [p["name"] for p in self.cfg["peers"]]}
        if self.cfg.get("lock_memory"):
            # its own pages stay in RAM (as the guard's): a node short of memory is when it must act
            locked, why = self.lock_memory()
            evidence.update({"locked_kib": locked} if why is None else {"lock_error": why})
        self.record("start", "watching %s (rank %d)" % (self.cfg["unit"], self.cfg["rank"]), evidence)
        probes.sd_notify("READY=1")
        while not stop.requested:
            started = self.clock()
            try:
                self.tick()
            except Exception as err:  # a tick must never kill the watchdog
                log(self.engine, "tick failed: %s: %s" % (type(err).__name__, err))
            probes.sd_notify("WATCHDOG=1")
            if max_ticks is not None and self.ticks >= max_ticks:
                break
            stop.wait(max(0.0, self.cfg["interval_s"] - (self.clock() - started)))
        self.record("exit", "watchdog stopped (signal %s)" % stop.signal, {})
        if self.server is not None:
            self.server.close()
        return 0


def _decided(obs: Dict[str, Any]) -> bool:
    """This node's rank or a peer rank is already dead or stopped: liveness's first failure decides the tick."""
    return not (obs.get("local") or {}).get("ok") or not all(p.get("ok") for p in (obs.get("peers") or {}).values())


def _run(argv: List[str]) -> Tuple[int, str, str]:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return 1, "", str(err)
    return proc.returncode, proc.stdout, proc.stderr


def load_config(path: str) -> Dict[str, Any]:
    """The config file read strictly (a regular UTF-8 JSON object) and validated; a refusal names the file."""
    raw = _checks.read_config(path, "--config", "Give the watchdog's JSON config (the vllm_service role writes it).")
    try:
        return logic.validate(raw, "--config %s" % path)
    except UmaError as err:
        raise UmaError(err.option, err.value, "%s (set in %s)" % (err.problem, path), err.fix) from None


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description="Keep a vLLM engine serving, within bounds (uma.vllm).")
    p.add_argument("--config", required=True, help="the watchdog's JSON config")
    p.add_argument("--ticks", type=int, help="stop after N ticks (tests)")
    p.add_argument("--reset", action="store_true", help="forget a previous 'gave up' and watch afresh")
    p.add_argument("--check-config", action="store_true", help="validate the config, say so in one line, exit 0/78")
    args = p.parse_args(argv)
    try:
        cfg = load_config(args.config)
        if args.check_config:
            sys.stdout.write("%s: the configuration in %s is valid (engine %s)\n" % (PROG, args.config, cfg["engine"]))
            return 0
        if args.reset:
            state_file = os.path.join(cfg["state_dir"], "watchdog", cfg["engine"], "state.json")
            if os.path.exists(state_file):
                os.unlink(state_file)
        dog = Watchdog(cfg)
    except UmaError as err:
        sys.stderr.write("%s: %s\n" % (PROG, err.message))
        return EXIT_CONFIG
    except OSError as err:
        sys.stderr.write("%s: %s: %s\n" % (PROG, getattr(err, "filename", "") or "", err.strerror or err))
        return EXIT_CONFIG
    stop = Stopper()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop.handler)
    return dog.run(stop, args.ticks)
