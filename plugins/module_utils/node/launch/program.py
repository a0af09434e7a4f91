# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node-local vLLM launcher (installed as /usr/local/bin/vllm-uma-launch).

Runs on the node, beside the page-cache guard, with no Ansible installed::

    vllm-uma-launch --engine main --config /etc/uma-vllm/engines/main.json
    vllm-uma-launch --engine lab --health-url http://127.0.0.1:8000/health \\
        --model-path /models/tiny -- python3 -m vllm.entrypoints.openai.api_server --model /models/tiny

In order, each step logged with its timing:

1. take the node's launch lock (engines on one node start one at a time; a
   waiting engine says for whom it waits). The lock is an ``flock`` on a file:
   the kernel frees it when the holder exits or dies, so it never leaks; the
   holder frees it as soon as its engine is healthy or has failed;
2. evict the model's files from the page cache once (``pre_evict: files``;
   no ``sync``: the shards are read, not written, and a node-wide sync can
   block for seconds behind other writers), or ``sync`` and drop the whole
   cache (``pre_evict: drop``, the published behaviour);
   then admission: ``MemAvailable`` must cover the plan's startup request (``plan.requested_memory_bytes``
   x ranks on the node: what vLLM's startup check will ask for; on a discrete GPU, ``admission_memory`` gpu
   or the plan's ``unified_memory: false``, each GPU's free memory in nvidia-smi: ``node/launch/admission.py``);
   short, the model's files are evicted again and the launcher waits up to ``admission_wait_s`` for memory
   a stopping engine or another load still holds; still short, it refuses with the numbers (exit 75,
   ``admission`` in launch.json) before any weight is read;
3. optionally open a readahead window on the model's device(s), recorded
   where the node's boot unit restores it should the node go down mid-load;
4. start the guard (``uma_guard.py``, default mode from the benchmark) as its
   own process, watching this launcher's PID;
5. start the engine with the planned flags and pass its output through;
6. when the health URL answers 200: stop the guard, evict the shard files,
   restore readahead, release the lock, write the launch record; then wait
   for the engine and leave with its exit code;
7. on any failure or signal: the same clean-up, the engine stopped, its exit
   code propagated (128+N for a signal).

A rank of a multi-node engine (``cluster`` in its config) first meets the other
ranks on the rank link (``node/cluster/ranks.py``): same configuration everywhere, or no
start (exit 78); a rank that starts first waits for the others. While it runs,
a rank that stops tells the others: a deliberate stop stops every rank (exit 0),
a failure stops every rank with exit 69 so systemd restarts the whole engine.
Once healthy, the launcher also watches this node's ``VLLM::`` processes (the
engine core, the workers): one of them dying while the engine's main process
lives (the engine would go on answering /health 200) is a failure, exit 69.

Each launch leaves ``<state_dir>/launches/<engine>/<UTC stamp>/`` with
``launch.json``, the guard's ``guard.json`` and ``samples.jsonl`` (memory
timeline), and a ``latest`` link, for uma.vllm.oom_diagnose.

This file is the launch itself (``Launch``: the steps above, the clean-up) and ``main``.
Its other parts are node-side files of their own, shipped with it into the node's lib_dir:

- ``node/launch/config.py`` exit codes, defaults, the command line, load_config and the validator
- ``node/launch/node.py``   the log, the launch lock, model files and eviction, child set-up
- ``node/launch/admission.py`` the memory admission (host MemAvailable or each GPU's free memory) and the guard's line

The names other code uses (``validate``, ``merge_config``, ``Log``, ``LaunchLock``,
``DEFAULTS``, the ``EXIT_*`` codes) stay importable from ``uma_launch``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..base import blockdev as _blockdev
from ..base.common import UmaError, node_write_json, read_state
from ..cluster import ranks as _ranks
from ..guard import watch as _guard_watch
from . import admission as _admission
from . import shm as _shm
from .config import (
    DEFAULTS,
    EXIT_ADMISSION,
    EXIT_CONFIG,
    EXIT_HEALTH_TIMEOUT,
    EXIT_LOCK_TIMEOUT,
    EXIT_PEER,
    PROG,
    load_config,
    merge_config,
    validate,
)
from .node import (
    LaunchLock,
    Log,
    _engine_child,
    _fmt,
    _set_pdeathsig,
    acquire_lock,
    drop_caches,
    evict_files,
    exit_code,
    model_files,
    node_shutting_down,
    own_unit,
    point_latest,
    set_oom_score_adj,
    stamp,
    unit_restarting,
)

# Names other code imports from uma_launch (tests, the integration runs), kept after the split.
__all__ = [
    "DEFAULTS", "EXIT_ADMISSION", "EXIT_CONFIG", "EXIT_HEALTH_TIMEOUT", "EXIT_LOCK_TIMEOUT", "EXIT_PEER", "PROG",
    "Launch", "LaunchLock", "Log", "load_config", "main", "merge_config", "validate",
]  # fmt: skip

GUARD_OOM_SCORE_ADJ = -900  # the guard: never the kernel's pick (the engine unit's score is positive)
GUARD_READY_TIMEOUT_S = 10.0
# A rank that stops on purpose breaks the collective under a request that runs on the other
# ranks (e.g. the watchdog's 1-token probe) before its word reaches them: a local death this
# soon may be explained by a peer's stop, so the link is given this long to say so.
PEER_EXPLAINS_S = 2.0
SERVE_POLL_S = 0.25  # a stop signal reaches the peers within this
RANKS_LOOK_AGAIN_S = (2.0, 60.0)  # while no rank process was found to watch: look again after 2 s, 4 s ... 60 s
SHM_LOOK_SERVING_S = 60.0  # once healthy, the engine's shared-memory segments are looked for this often
SHM_LOOK_WAIT_S = 2.0  # at health and before a stop the launcher waits this long for a look, no longer
KV_MARKERS = re.compile(
    r"(GPU|CPU) KV cache size|Available KV cache memory|# (GPU|CPU|cpu) blocks|KV cache memory|"
    r"Maximum concurrency for",
)


# The launch


class Launch:
    def __init__(self, config: Dict[str, Any], log: Optional[Log] = None) -> None:
        self.config = config
        self.engine_name = config["engine"]
        self.log = log or Log(self.engine_name)
        self.lock = LaunchLock(config["lock_path"], self.engine_name)
        self.record_dir = os.path.join(config["state_dir"], "launches", self.engine_name, stamp())
        self.record: Dict[str, Any] = {
            "engine": self.engine_name,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "healthy_at": None,
            "failed_at": None,
            "exit_code": None,
            "started_at_epoch": round(time.time(), 3),
            "kv_alloc_t": None,
            "kv_alloc_at": None,
            "page_cache_peak_mib": None,
            "guard_status": None,
            "plan": config.get("plan"),
            "argv": config["command"],
            "steps": self.log.steps,
            "model_path": config.get("model_path"),
        }
        # the guard's URL check: never through a proxy, any failure means "not yet"
        self.health = _guard_watch.UrlWatch(config["health_url"], every=2.0)
        self.engine: Optional[subprocess.Popen] = None
        self.guard: Optional[subprocess.Popen] = None
        self.readahead_record: Optional[str] = None
        self.stop_signal: Optional[int] = None
        self.cleaned = False
        self.peers_told = False
        self.tail: List[str] = []
        self._files: Optional[List[str]] = None
        self.link: Optional[_ranks.RankLink] = _ranks.RankLink(config, self.log.line) if config.get("cluster") else None
        # why this rank stops when it is not its own engine's exit: (reason, exit code)
        self.failure: Optional[Tuple[str, int]] = None
        self.health_timed_out = False  # wait_healthy gave up at health_timeout_s (exit 124)
        # the engine's shared-memory segments (node/launch/shm.py), removed when its processes are gone
        self.shm: Optional[_shm.Segments] = None
        if config.get("shm_sweep", True):
            self.shm = _shm.Segments(
                os.path.join(config["state_dir"], "launches", self.engine_name, _shm.RECORD),
                config.get("shm_dir", _shm.SHM_DIR), config["proc_root"], config.get("_identity"),
                config["python"], self.log.line,
            )  # fmt: skip
        self._container_root: Optional[int] = None
        self._shm_look: Optional[threading.Thread] = None

    # ---- helpers
    def files(self) -> List[str]:
        if self._files is None:
            self._files = model_files(self.config.get("model_path"))
        return self._files

    def write_record(self) -> None:
        try:
            node_write_json(os.path.join(self.record_dir, "launch.json"), self.record)
            point_latest(self.record_dir)
        except OSError as err:
            self.log.line("cannot write the launch record in %s: %s" % (self.record_dir, err))

    def on_signal(self, signum: int, _frame: Any) -> None:
        self.stop_signal = signum
        if self.engine is not None and self.engine.poll() is None:
            try:
                self.engine.send_signal(signum)
            except OSError:
                pass

    # ---- steps
    def pre_evict(self) -> None:
        started = time.monotonic()
        mode = self.config["pre_evict"]
        if mode == "files":
            asked = evict_files(self.files())
            self.log.step(
                "pre-evict", duration=time.monotonic() - started, mode="files", files=len(self.files()), bytes=asked
            )
        elif mode == "drop":
            try:
                os.sync()  # drop_caches frees clean pages only
                drop_caches(self.config["proc_root"], 1)
                self.log.step("pre-evict", duration=time.monotonic() - started, mode="drop")
            except OSError as err:
                self.log.step("pre-evict", duration=time.monotonic() - started, mode="drop", error=str(err))
        else:
            self.log.step("pre-evict", duration=time.monotonic() - started, mode="none")

    def admit(self, sleep: Callable[[float], None] = time.sleep) -> bool:
        """Before the engine starts: the memory admission (node/launch/admission.py), host or GPU."""
        return _admission.admit(self, sleep)

    def open_readahead(self) -> None:
        kb = self.config.get("readahead_kb")
        if kb is None:
            return
        started = time.monotonic()
        try:
            devices = _blockdev.resolve_path(
                self.config["model_path"], self.config["sysfs_root"], self.config["proc_root"]
            )
            originals = {d.name: _blockdev.read_ra(d) for d in devices}
            name = "launch-" + self.engine_name
            path = _blockdev.record_path(self.config["state_dir"], name)
            if os.path.exists(path):  # a window left open by a dead launch: keep its originals
                _blockdev.restore_record(path, self.config["sysfs_root"])
                originals = {d.name: _blockdev.read_ra(d) for d in devices}
            record = _blockdev.new_record(
                name, devices, originals, kb, int(self.config["health_timeout_s"]), time.time()
            )
            _blockdev.write_record(path, record)
            self.readahead_record = path
            for dev in devices:
                _blockdev.write_ra(dev.ra_path, kb)
            self.log.step("readahead-window", duration=time.monotonic() - started, read_ahead_kb=kb, devices=originals)
        except UmaError as err:
            self.log.step("readahead-window", duration=time.monotonic() - started, error=err.message)

    def restore_readahead(self) -> None:
        if not self.readahead_record:
            return
        started = time.monotonic()
        result = _blockdev.restore_record(self.readahead_record, self.config["sysfs_root"])
        self.readahead_record = None
        self.log.step(
            "readahead-restored",
            duration=time.monotonic() - started,
            restored=[r["device"] for r in result["restored"]],
            errors=result["errors"],
        )

    def start_guard(self) -> None:
        if not self.config.get("guard"):
            return
        mode = self.config["guard_mode"]
        argv = [
            self.config["python"], os.path.join(self.config["lib_dir"], "uma_guard.py"),
            "--name", "launch-" + self.engine_name, "--mode", mode,
            "--interval", str(self.config["guard_interval"]),
            "--threshold-mib", str(self.config["guard_threshold_mib"]),
            "--max-duration", str(self.config["guard_max_duration"]),
            "--until-pid", str(os.getpid()),
            "--status-file", os.path.join(self.record_dir, "guard.json"),
            "--samples-file", os.path.join(self.record_dir, "samples.jsonl"),
        ]  # fmt: skip
        if mode != "global" and self.config.get("model_path"):
            argv += ["--paths", self.config["model_path"]]
        if self.config.get("guard_lock_memory"):
            argv.append("--lock-memory")
        free_line, why = 0, "mode %s has no line" % mode
        if mode == "adaptive":
            free_line, why = _admission.guard_free_line(self.config, _admission.host_need(self.config)[0])
            argv += ["--act-below-free-mib", str(free_line)]
        os.makedirs(self.record_dir, exist_ok=True)
        started = time.monotonic()
        self.guard = subprocess.Popen(argv, preexec_fn=_set_pdeathsig, stdin=subprocess.DEVNULL)  # noqa: PLW1509
        # who dies first: the engine's unit has a positive OOMScoreAdjust the guard inherits;
        # the guard that protects the load must not be the kernel's pick (root may lower it)
        oom = set_oom_score_adj(self.guard.pid, GUARD_OOM_SCORE_ADJ, self.config["proc_root"])
        # The load must not begin before the guard watches: its first status
        # file says it has taken its baseline and runs its loop.
        status_file = os.path.join(self.record_dir, "guard.json")
        while not os.path.exists(status_file) and self.guard.poll() is None:
            if time.monotonic() - started > GUARD_READY_TIMEOUT_S:
                break
            time.sleep(0.02)
        ready = os.path.exists(status_file)
        self.log.step("guard-started", duration=time.monotonic() - started, mode=mode, pid=self.guard.pid, ready=ready,
                      oom_score_adj=oom, act_below_free_mib=free_line, why=why)  # fmt: skip
        if not ready:
            self.log.line("the guard did not report within %ss (exit %s); loading without it" % (
                GUARD_READY_TIMEOUT_S, self.guard.poll()))  # fmt: skip

    def stop_guard(self) -> None:
        if self.guard is None:
            return
        started = time.monotonic()
        if self.guard.poll() is None:
            self.guard.terminate()
            try:
                self.guard.wait(10)
            except subprocess.TimeoutExpired:
                self.guard.kill()
                self.guard.wait()
        status = read_state(os.path.join(self.record_dir, "guard.json"), dict, prog=PROG)
        self.record["guard_status"] = status
        if isinstance(status, dict):
            self.record["page_cache_peak_mib"] = status.get("peak_cache_mib")
        self.log.step(
            "guard-stopped",
            duration=time.monotonic() - started,
            exit=self.guard.returncode,
            page_cache_peak_mib=(status or {}).get("peak_cache_mib"),
            peak_growth_mib=(status or {}).get("peak_growth_mib"),
            evictions=(status or {}).get("evictions"),
            guard_cpu_s=(status or {}).get("cpu_seconds"),
            guard_locked_kib=(status or {}).get("locked_kib"),
            # only where the node refused the lock (the guard went on unlocked)
            **({"guard_lock_error": (status or {})["lock_error"]} if (status or {}).get("lock_error") else {}),
        )
        self.guard = None

    def start_engine(self) -> None:
        env = dict(os.environ)
        env.update({str(k): str(v) for k, v in self.config["env"].items()})
        ident = self.config.get("_identity")
        drop: Dict[str, Any] = {}
        if ident:
            # least privilege: the engine runs as the engine user (the kernel clears the
            # parent-death signal on a uid change; subprocess sets it again after the change)
            env.update({"HOME": ident["home"], "USER": ident["user"], "LOGNAME": ident["user"]})
            home = ident["home"]
            drop = {
                "user": ident["uid"], "group": ident["gid"], "extra_groups": ident["groups"], "umask": ident["umask"],
                # chdir as the engine user (after the uid change): a launcher without CAP_DAC_OVERRIDE
                # (the unit's CapabilityBoundingSet) cannot enter the user's 0750 home itself
                "preexec_fn": lambda: _engine_child(home),
            }  # fmt: skip
            self.record["engine_user"] = ident["user"]
        if self.shm is not None:
            self.shm.started()
        self.engine = subprocess.Popen(
            self.config["command"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=drop.pop("preexec_fn", _set_pdeathsig),  # noqa: PLW1509 - prctl/chdir only, before any thread
            **drop,
        )
        self.log.step(
            "engine-started", pid=self.engine.pid, user=ident["user"] if ident else "root", argv=self.config["command"]
        )
        threading.Thread(target=self._pump, name="engine-output", daemon=True).start()

    def _pump(self) -> None:
        if self.engine is None or self.engine.stdout is None:
            return
        for raw in iter(self.engine.stdout.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
            self.tail = [*self.tail, line][-50:]
            if self.record["kv_alloc_t"] is None and KV_MARKERS.search(line):
                self.record["kv_alloc_t"] = self.log.elapsed()
                self.record["kv_alloc_at"] = round(time.time(), 3)
                self.log.line("kv-cache-allocated t=%s (%s)" % (_fmt(self.record["kv_alloc_t"]), line.strip()[-160:]))

    def track_shm(self, force: bool = False, every: Optional[float] = None) -> None:
        """Note the shared-memory segments the engine's processes map (below the container's init
        for a container); at most every ``every`` seconds (shm.TRACK_EVERY_S) unless ``force``.

        The look runs in its own thread and the caller waits for it at most SHM_LOOK_WAIT_S (only
        when ``force``): reading a process's maps waits for its memory map lock, and ``docker
        inspect`` for the daemon; neither may hold up the launcher's health, peer or stop handling."""
        if self.shm is None or self.engine is None:
            return
        self._shm_into_record()
        look = self._shm_look
        if look is not None and look.is_alive():
            if force:
                look.join(SHM_LOOK_WAIT_S)
                self._shm_into_record()
            return
        if not force and time.monotonic() - self.shm.last_look < (every or _shm.TRACK_EVERY_S):
            return
        self.shm.last_look = time.monotonic()
        look = threading.Thread(target=self._look_shm, args=(self.engine.pid,), name="shm-look", daemon=True)
        self._shm_look = look
        look.start()
        if force:
            look.join(SHM_LOOK_WAIT_S)
            self._shm_into_record()

    def _shm_into_record(self) -> None:
        """The names the looks found, into the launch record (only the launcher's thread writes it)."""
        seen = list(self.shm.seen) if self.shm is not None else []
        if seen and seen[:64] != self.record.get("shm_tracked"):
            self.record["shm_tracked"] = seen[:64]

    def _look_shm(self, engine_pid: int) -> None:
        if self.shm is None:
            return
        try:
            if self._container_root is None:  # docker/podman inspect: only when a look is due
                self._container_root = _ranks.container_root_pid(self.config["command"])
            new = self.shm.look([engine_pid, self._container_root or 0])
        except Exception as err:  # a look that fails never stops the launch
            self.log.line("shared-memory look failed: %s" % err)
            return
        if new:  # the record takes the names at the next track_shm (the launcher's thread)
            self.log.step("shm-tracked", new=new, segments=len(self.shm.seen))

    def sweep_shm(self, left: bool = False) -> None:
        """Remove what the engine left in shm_dir once its processes are gone (``left``: what a
        previous launch of this engine, killed before its own sweep, left)."""
        if self.shm is None or (left and not self.shm.load_left()):
            return
        self._shm_into_record()
        done = self.shm.sweep(wait_s=0.0 if left else 5.0)
        if done["removed"] or done["kept"] or done["running"]:
            fields = {"removed": len(done["removed"]), "mib": round(done["bytes"] / 1048576.0, 1)}
            if done["kept"]:
                fields["kept"] = ",".join("%s (%s)" % item for item in sorted(done["kept"].items())[:5])
            if done["running"]:
                fields["waiting_for_pids"] = ",".join(str(pid) for pid in done["running"][:5])
            self.log.step("shm-swept-left" if left else "shm-swept", **fields)
            self.record.setdefault("shm_swept", []).append(dict(fields, names=done["removed"][:50], left=left))

    def wait_healthy(self) -> Tuple[bool, str]:
        deadline = time.monotonic() + self.config["health_timeout_s"]
        started = time.monotonic()
        if self.engine is None:
            return False, "the engine was not started"
        while True:
            if self.stop_signal is not None:
                return False, "signal %d" % self.stop_signal
            if self.link is not None and self.link.lost is not None:
                return False, self.take_peer_failure()[0]
            if self.engine.poll() is not None:
                return False, "engine exited with %d before it was healthy" % self.engine.returncode
            if self.health.check():
                self.log.step("engine-healthy", duration=time.monotonic() - started, url=self.config["health_url"])
                self.track_shm(force=True)
                return True, "healthy"
            self.track_shm()
            if time.monotonic() >= deadline:
                self.health_timed_out = True
                return False, "no 200 from %s within %ss" % (self.config["health_url"], self.config["health_timeout_s"])
            time.sleep(self.config["health_interval_s"])

    def peer_gone(self) -> bool:
        """A peer stopped or was lost: this rank's tensor-parallel group is broken."""
        return self.link is not None and self.link.lost is not None

    def stop_engine(self) -> None:
        if self.engine is None or self.engine.poll() is not None:
            return
        self.track_shm(force=True)
        started = time.monotonic()
        self.engine.terminate()
        deadline = started + self.config["stop_timeout_s"]
        grace_end = started + min(self.config["peer_stop_grace_s"], self.config["stop_timeout_s"])
        killed: Optional[int] = None
        while self.engine.poll() is None and time.monotonic() < deadline:
            if killed is None and self.peer_gone() and time.monotonic() >= grace_end:
                # nothing to drain: vLLM's own shutdown would wait for workers blocked on the peer
                killed = self.kill_engine_processes()
            time.sleep(0.05)
        if self.engine.poll() is None:
            self.engine.kill()
            self.engine.wait()
        extra = {} if killed is None else {"killed_after_peer": killed}
        self.log.step("engine-stopped", duration=time.monotonic() - started, returncode=self.engine.returncode, **extra)

    def kill_engine_processes(self) -> int:
        """SIGKILL the engine's VLLM:: processes (below its container's init for a container) and
        the engine process itself; returns how many were signalled."""
        if self.engine is None:
            return 0
        pids = list(_ranks.vllm_processes(self.engine.pid, self.config["proc_root"], self.config["command"]))
        count = 0
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                count += 1
            except OSError:  # gone already
                pass
        try:
            self.engine.kill()
            count += 1
        except OSError:
            pass
        return count

    def load_done(self) -> None:
        """What follows a load, healthy or not: nothing of the window stays."""
        self.stop_guard()
        if self.config.get("evict_after_healthy") and self.files():
            started = time.monotonic()
            asked = evict_files(self.files())
            self.log.step("post-evict", duration=time.monotonic() - started, files=len(self.files()), bytes=asked)
        self.restore_readahead()
        if self.lock.held:
            self.lock.release()
            self.log.step("lock-released")

    def tell_peers(self) -> None:
        """Tell the other ranks that this one stops: deliberately (a signal, or a peer's
        deliberate stop passed on) or because something failed."""
        if self.link is None or self.peers_told:
            return
        self.peers_told = True
        if self.failure is not None:
            reason, deliberate = self.failure[0], self.failure[1] == 0
        elif self.stop_signal is not None:
            # a node going down is not an operator stopping the engine: the other ranks must
            # restart and wait for this one to come back
            down = node_shutting_down()
            # `systemctl restart` of one rank: that rank comes back and waits for the others, so they
            # must restart too (exit 69, Restart=), not stop for good as after `systemctl stop`
            restarting = not down and unit_restarting(own_unit())
            why = " (this node is shutting down)" if down else " (its unit restarts)" if restarting else ""
            reason = "signal %d%s" % (self.stop_signal, why)
            deliberate = not down and not restarting
        else:
            code = self.engine.returncode if self.engine is not None else None
            reason, deliberate = "its engine exited with %s" % code, False
        self.link.notify("rank %d: %s" % (self.link.rank, reason), deliberate)
        self.log.step("peers-told", reason=reason, deliberate=deliberate)

    def meet_ranks(self) -> Optional[int]:
        """The rank link's rendezvous; an exit code when this rank must not start."""
        if self.link is None:
            return None
        cluster = self.config["cluster"]
        self.log.step("ranks-wait", rank=cluster["rank"], nnodes=cluster["nnodes"], fingerprint=self.link.digest,
                      link="%s:%s" % (cluster["head_addr"], cluster["link_port"]))  # fmt: skip
        try:
            waited = self.link.rendezvous(lambda: self.stop_signal is not None)
        except _ranks.PeerRefused as err:
            self.log.step("ranks-refused", reason=str(err))
            self.failure = (str(err), EXIT_CONFIG)
            return EXIT_CONFIG
        except _ranks.PeerTimeout as err:
            self.log.step("ranks-missing", reason=str(err))
            if self.stop_signal is not None:
                return 128 + self.stop_signal
            self.failure = (str(err), EXIT_PEER)
            return EXIT_PEER
        self.log.step("ranks-met", duration=waited)
        return None

    def serve(self) -> int:
        """After the load: wait for the engine, the peers and this node's rank processes."""
        watch = bool(self.config.get("watch_ranks")) and self.engine is not None
        watched = self.watch_rank_processes(late=False) if watch else {}
        look_every = RANKS_LOOK_AGAIN_S[0]
        next_look = time.monotonic() + look_every
        while self.engine is not None and self.engine.poll() is None:
            try:
                self.engine.wait(SERVE_POLL_S)
            except subprocess.TimeoutExpired:
                pass
            self.track_shm(every=SHM_LOOK_SERVING_S)
            if watch and not watched and time.monotonic() >= next_look:
                # none found yet (a rank's engine can be healthy before this node's processes took their
                # VLLM:: names, or the container runtime did not answer): look again until some are found
                look_every = min(look_every * 2, RANKS_LOOK_AGAIN_S[1])
                next_look = time.monotonic() + look_every
                watched = self.watch_rank_processes(late=True)
            if self.stop_signal is not None:
                # the peers hear of a deliberate stop before this rank's processes go away
                self.tell_peers()
                continue
            if self.link is not None and self.link.lost is not None:
                self.failure_from_peer()
                break
            dead = _ranks.gone(watched, self.config["proc_root"]) if watched else []
            if dead and self.engine.poll() is None:
                if self.explained_by_peer():
                    break
                reason = "rank process %s" % ", ".join("%s (pid %d) died" % (name, pid) for pid, name in dead)
                self.failure = (reason, EXIT_PEER)
                self.log.step("rank-process-died", reason=reason)
                break
        if self.failure is None and self.stop_signal is None and self.engine is not None and self.engine.returncode:
            self.explained_by_peer()
        if self.failure is not None:
            self.cleanup()
            self.record["exit_code"] = self.failure[1]
            self.record["stopped_because"] = self.failure[0]
            return self.failure[1]
        code = exit_code(self.engine.returncode if self.engine is not None else None)
        self.record["exit_code"] = code
        self.log.step("engine-exited", returncode=self.engine.returncode if self.engine is not None else None)
        return code

    def watch_rank_processes(self, late: bool) -> Dict[int, str]:
        """This engine's VLLM:: processes, said and written into the running engine's record: at the
        first look always (also when none were found), at a later look only when some were."""
        if self.engine is None:
            return {}
        found = _ranks.vllm_processes(self.engine.pid, self.config["proc_root"], self.engine.args)
        if found or not late:
            self.log.step("ranks-watched", processes=sorted(set(found.values())), count=len(found),
                          **({"late": True} if late else {}))  # fmt: skip
            self.write_record()
        return found

    def take_peer_failure(self) -> Tuple[str, bool]:
        """A peer's stop is this rank's reason too: exit 0 when it was deliberate, else 69."""
        reason, deliberate = self.link.lost  # type: ignore[union-attr,misc]
        self.failure = (reason, 0 if deliberate else EXIT_PEER)
        return reason, deliberate

    def failure_from_peer(self) -> None:
        reason, deliberate = self.take_peer_failure()
        self.log.step("peer-stopped" if deliberate else "peer-lost", reason=reason)

    def explained_by_peer(self) -> bool:
        """This rank's processes died or its engine failed while the link was up: when a peer
        says within PEER_EXPLAINS_S that it stopped, that is the reason (a deliberate stop
        stops this rank too instead of a restart that waits for a peer that will not come)."""
        if self.link is None:
            return False
        end = time.monotonic() + PEER_EXPLAINS_S
        while self.link.lost is None and self.stop_signal is None and time.monotonic() < end:
            time.sleep(0.1)
        if self.link.lost is None:
            return False
        self.failure_from_peer()
        return True

    def cleanup(self) -> None:
        if self.cleaned:
            return
        self.cleaned = True
        for action in (self.tell_peers, self.stop_engine, self.sweep_shm, self.load_done):
            try:
                action()
            except Exception as err:
                self.log.line("clean-up step %s failed: %s" % (action.__name__, err))

    # ---- the whole thing
    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self.on_signal)
        self.log.step("launch", engine=self.engine_name, record=self.record_dir, config=self.config.get("_sources"))
        try:
            # the ranks meet before the lock: a node's lock never waits on another node
            refused = self.meet_ranks()
            if refused is not None:
                self.record["failed_at"] = self.log.elapsed()
                self.record["exit_code"] = refused
                self.record["stopped_because"] = (self.failure or ("signal", refused))[0]
                return refused
            if not acquire_lock(self.lock, self.config["lock_timeout_s"], self.log):
                self.record["failed_at"] = self.log.elapsed()
                self.record["exit_code"] = EXIT_LOCK_TIMEOUT
                return EXIT_LOCK_TIMEOUT
            if self.stop_signal is not None:
                self.record["exit_code"] = 128 + self.stop_signal
                return 128 + self.stop_signal
            self.sweep_shm(left=True)
            self.pre_evict()
            try:
                admitted = self.admit()
            except UmaError as err:  # the node's memory cannot be read: refused with the file, not a traceback
                # exit 78, not the admission's 75: no retry by systemd reads the file back (a loop of refusals)
                self.failure = (err.message, EXIT_CONFIG)
                self.log.step("admission-refused", checked=False, reason=err.message)
                self.log.line("%s: %s" % (PROG, err.message))
                self.record["failed_at"] = self.log.elapsed()
                self.record["exit_code"] = EXIT_CONFIG
                self.record["stopped_because"] = err.message
                return EXIT_CONFIG
            if not admitted:
                self.failure = ("admission refused on this node (free memory below the plan's start)", EXIT_ADMISSION)
                self.record["failed_at"] = self.log.elapsed()
                self.record["exit_code"] = EXIT_ADMISSION
                return EXIT_ADMISSION
            self.open_readahead()
            self.start_guard()
            try:
                self.start_engine()
            except OSError as err:
                # e.g. the engine user may not execute the command or enter its home
                who = (self.config.get("_identity") or {}).get("user", "root")
                self.log.step("launch-failed", reason="the engine did not start as %s: %s" % (who, err))
                self.log.line(
                    "%s: option 'command' = %r: cannot be started as user %s (%s). Give that user read and execute "
                    "access to the command, its venv and the model (e.g. chmod o+rX), or set engine_user "
                    "(vllm_service_user) to root." % (PROG, self.config["command"][0], who, err.strerror or err)
                )
                self.record["failed_at"] = self.log.elapsed()
                self.record["exit_code"] = EXIT_CONFIG
                return EXIT_CONFIG
            healthy, why = self.wait_healthy()
            if not healthy:
                self.record["failed_at"] = self.log.elapsed()
                self.log.step("launch-failed", reason=why, engine_tail=self.tail[-5:])
                self.cleanup()
                code = exit_code(self.engine.returncode if self.engine else None)
                if self.stop_signal is not None and (self.engine is None or self.engine.returncode is None):
                    code = 128 + self.stop_signal
                if self.health_timed_out:
                    code = EXIT_HEALTH_TIMEOUT
                if self.failure is not None:
                    code = self.failure[1]
                    self.record["stopped_because"] = self.failure[0]
                self.record["exit_code"] = code
                return code
            self.record["healthy_at"] = self.log.elapsed()
            self.load_done()
            self.write_record()
            return self.serve()
        finally:
            self.cleanup()
            self.write_record()


def main(argv: Optional[List[str]] = None) -> int:
    try:  # a UmaError from the run is a node path that cannot be used (e.g. an unsafe lock directory)
        return Launch(load_config(argv)).run()
    except UmaError as err:
        sys.stderr.write("%s: %s\n" % (PROG, err.message))
        return EXIT_CONFIG
