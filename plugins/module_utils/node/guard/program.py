# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""uma_guard: hold the page cache down while a model loads on a unified-memory node.

On a node where CPU and GPU share RAM, reading a checkpoint larger than free
memory fills the page cache faster than the GPU driver pins pages, and the
KV-cache allocation that follows fails. This program runs beside the loader
(a third-party program it does not control) and evicts the checkpoint's pages
from the page cache once they have been read. It is bounded: it stops by
itself at ``--max-duration``, when ``--until-url`` answers HTTP 200, or when
``--until-pid`` exits, and it writes a JSON status.

Modes:

``global``
    The published fix: write ``--drop-level`` to ``/proc/sys/vm/drop_caches``
    every tick. Needs root and evicts every other workload's cache too.
``files``
    ``posix_fadvise(POSIX_FADV_DONTNEED)`` over the files under ``--paths``
    every tick, but only for files whose residency (``cachestat(2)``, or
    ``mincore(2)`` on kernels before 6.5) grew: no root, no collateral.
``adaptive`` (the default)
    Reads ``/proc/meminfo`` every tick and acts only when the unmapped file
    cache (``Cached - Mapped``) grew more than ``--threshold-mib`` above its
    running minimum, or ``MemAvailable`` fell below ``--min-available-mib``.
    With ``--act-below-free-mib N`` growth is left alone while ``MemFree`` is
    at least N MiB (cache in free memory is in nobody's way; evicting it costs
    the kernel CPU): the launcher gives the engine's startup request.
    It acts with the ``files`` sweep when ``--paths`` are given, else with a
    global drop. It wakes at once when the loader opens or reads a watched
    file (inotify), times its ticks to the next threshold crossing while the
    cache grows, and does nothing but one meminfo read per tick on an idle
    node.

Pages mapped by a process (safetensors' ``safe_open`` mmaps each shard) cannot
be evicted by either method, so the floor with an mmap loader is the shard
currently mapped; thresholds therefore use ``Cached - Mapped``. For the file
being read, the sweep leaves the last two readahead windows resident so the
reader never reads them twice. Status and samples are written by a thread:
on a disk saturated by the loader a small write can wait for the journal for
hundreds of milliseconds, which the tick loop must not.

This file is the tick loop and the command line. The guard's other parts are
node-side files of their own, shipped with it into the node's lib_dir:

- ``node/guard/config.py``    the configuration type, its defaults, limits and validator
- ``node/guard/memory.py``    /proc/meminfo figures and the adaptive policy
- ``node/guard/residency.py`` files, devices, page-cache residency, eviction
- ``node/guard/sweeper.py``   the files sweep (fadvise where it frees something)
- ``node/guard/watch.py``     inotify on the files, the loader's PID, the health URL
- ``node/guard/status.py``    the status and samples files (written off the loop)

The names other programs use (``evict_paths``, ``iter_files``, ``file_residency``,
``proc_start_time``, ``Stopper``) stay importable from ``uma_guard``. The files are importable
(the pure parts are unit-tested) and runnable as ``python3 uma_guard.py ...``
on a node without Ansible (stdlib; psutil is used when present). Exit codes:
0 normal stop, 1 error stop, 2 bad arguments (one line naming the option, the value and
the fix; ``--check-config`` validates the options and exits 0 or 2).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from ..base.common import UmaError, read_meminfo
from ..base.stopper import Stopper
from . import config as _guard_config
from . import memory as _guard_memory
from . import status as _guard_status
from . import sweeper as _guard_sweeper
from . import watch as _guard_watch
from .residency import evict_paths, file_residency, iter_files
from .watch import proc_start_time

# Names other programs import from uma_guard (the watchdog, the launcher), kept after the split.
__all__ = ["Stopper", "evict_paths", "file_residency", "iter_files", "main", "parse_config", "proc_start_time", "run"]

# The guard's own files beside this one (installed with it on the node, with _common).
STATUS_EVERY_S = 1.0
PID_EVERY_S = 0.2
# Adaptive: how long a kept readahead tail may stay before an idle sweep evicts it.
TAIL_CLEANUP_S = 1.0


# --------------------------------------------------------------------------
# Arguments


class _Parser(argparse.ArgumentParser):
    """argparse that exits 2 with a one-line message on any bad argument."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        # one line (no usage block): the option, the value, the fix (a journal shows it as one entry)
        if not message.rstrip().endswith("."):
            message = message.rstrip() + ". Run uma_guard.py --help for the options."
        self.exit(2, "%s: error: %s\n" % (self.prog, " ".join(message.split("\n"))))


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="uma_guard.py",
        description="Hold the page cache down while a model loads (uma.vllm).",
    )
    p.add_argument("--name", required=True, help="name of this guard (status, logs)")
    p.add_argument(
        "--mode", choices=_guard_config.MODES, default=_guard_config.DEFAULT_MODE, help="default: %(default)s"
    )
    p.add_argument("--paths", nargs="+", default=[], metavar="PATH", help="files or directories (recursive)")
    # numbers stay text here: the validator parses them (ASCII digits only; argparse's int() and
    # float() take any Unicode digit, so U+FF11, a fullwidth 1, was a silent 1)
    p.add_argument("--interval", default=_guard_config.DEFAULT_INTERVAL, metavar="SEC", help="tick, default 0.1")
    p.add_argument("--threshold-mib", default=_guard_config.DEFAULT_THRESHOLD_MIB, metavar="N")
    p.add_argument("--min-available-mib", default=_guard_config.DEFAULT_MIN_AVAILABLE_MIB, metavar="N")
    p.add_argument(
        "--act-below-free-mib",
        default=_guard_config.DEFAULT_ACT_BELOW_FREE_MIB,
        metavar="N",
        help="adaptive: evict growth only while MemFree < N MiB (0: always, the default)",
    )
    p.add_argument("--drop-level", default=_guard_config.DEFAULT_DROP_LEVEL, metavar="{1,3}")
    p.add_argument("--max-duration", default=_guard_config.DEFAULT_MAX_DURATION, metavar="SEC")
    p.add_argument("--until-url", metavar="URL")
    p.add_argument("--until-pid", metavar="PID")
    p.add_argument("--status-file", metavar="PATH")
    p.add_argument("--samples-file", metavar="PATH")
    p.add_argument("--proc-root", default="/proc", metavar="DIR")
    p.add_argument("--sysfs-root", default="/sys", metavar="DIR")
    p.add_argument(
        "--lock-memory",
        action="store_true",
        help="mlockall(MCL_CURRENT|MCL_ONFAULT) at start: the guard's own pages are not reclaimed under pressure",
    )
    p.add_argument("--check-config", action="store_true", help="validate the options on this node, say so, exit 0/2")
    return p


def validate(ns: argparse.Namespace) -> Dict[str, Any]:
    """The effective configuration (GuardConfig's one validator), or UmaError naming the bad option."""
    values = dict(vars(ns))
    check = values.pop("check_config", False)
    lock = bool(values.pop("lock_memory", False))
    if values.get("until_pid") == "":  # the module's "unset"; on a command line, a PID variable that was empty
        raise UmaError("--until-pid", "", "is empty", "Give the loader's process id, or leave the option out.")
    config = _guard_config.GuardConfig(**values).validated(spell=_guard_config.cli)
    if check:  # --check-config: what the node must offer too (the PID, drop_caches, the samples directory)
        _guard_config.check_on_node(config, _guard_config.cli)
    result = dict(config.as_dict(), check_config=True) if check else config.as_dict()
    if lock:
        result["lock_memory"] = True
    return result


def parse_config(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    """Parse and validate; exits 2 with the problem and the fix on bad input."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        return validate(ns)
    except UmaError as err:
        parser.error(err.message)
    raise AssertionError("unreachable")  # pragma: no cover - parser.error exits


# --------------------------------------------------------------------------
# The guard


class Guard:
    """State and one tick of the guard. ``run()`` drives it; tests call ``tick``."""

    def __init__(self, config: Dict[str, Any], clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.mode = config["mode"]
        self.proc_root = config["proc_root"]
        self.drop_path = os.path.join(self.proc_root, "sys", "vm", "drop_caches")
        self.sweeper = _guard_sweeper.FileSweeper(config["paths"], config["sysfs_root"]) if config["paths"] else None
        self.events: Optional[_guard_watch.FileEvents] = None
        # files the loader used since the last sweep (None: unknown, look at all)
        self.touched: Optional[Set[Tuple[int, int]]] = None
        # the samples file wants every timeline key; a tick needs only four
        keys = _guard_memory.MeminfoReader.KEYS if config.get("samples_file") else _guard_memory.MeminfoReader.TICK_KEYS
        self.reader = _guard_memory.MeminfoReader(self.proc_root, keys)
        self.started_mono = clock()
        self.started_at = _guard_status.utc_now()
        self.stopped_at: Optional[str] = None
        self.stop_reason: Optional[str] = None
        self.locked_kib: Optional[int] = None  # --lock-memory: VmLck after mlockall
        self.lock_error: Optional[str] = None
        self.ticks = 0
        self.evictions = 0
        self.evicted_bytes = 0
        self.triggers: Dict[str, int] = {}
        self.writer: Optional[_guard_status.Writer] = None
        self.last_tick = self.started_mono
        meminfo = read_meminfo(self.proc_root)
        view = _guard_memory.cache_view(meminfo)
        self.baseline = view
        self.peak_cached = view["cached"]
        self.peak_unmapped = view["unmapped"]
        self.peak_mapped = view["mapped"]
        self.min_available = view["available"]
        self.prev_unmapped = view["unmapped"]
        self.rate = 0.0
        self.last_sweep = self.started_mono
        self.policy = _guard_memory.AdaptivePolicy(
            config["threshold_mib"], config["min_available_mib"], view["unmapped"], config["act_below_free_mib"]
        )

    # -- checks before running
    def preflight(self) -> None:
        """Raise OSError when the mode cannot work on this node."""
        needs_drop = self.mode == "global" or (self.mode == "adaptive" and self.sweeper is None)
        if needs_drop and not os.access(self.drop_path, os.W_OK):
            raise OSError(
                "%s is not writable: mode %s without --paths drops caches globally and needs root; "
                "give --paths to use fadvise instead" % (self.drop_path, self.mode)
            )
        if self.sweeper is not None:
            self.sweeper.rescan(self.clock())
            self.events = _guard_watch.FileEvents()
            self.events.watch(self.sweeper.files)

    def close(self) -> None:
        self.reader.close()
        if self.events is not None:
            self.events.close()
        if self.sweeper is not None:
            self.sweeper.close()
        if self.writer is not None:
            self.writer.close()

    # -- sampling
    def _sample(self) -> Dict[str, int]:
        meminfo = self.reader.read()
        view = _guard_memory.cache_view(meminfo)
        self.peak_cached = max(self.peak_cached, view["cached"])
        self.peak_unmapped = max(self.peak_unmapped, view["unmapped"])
        self.peak_mapped = max(self.peak_mapped, view["mapped"])
        self.min_available = min(self.min_available, view["available"])
        if self.writer is not None and self.writer.samples_handle is not None:
            self.writer.sample(json.dumps(_guard_memory.sample_record(time.time(), meminfo), sort_keys=True) + "\n")
        return view

    # -- actions
    def drop_global(self) -> None:
        with open(self.drop_path, "w", encoding="ascii") as handle:
            handle.write("%d\n" % self.config["drop_level"])

    def _act(self, now: float, before: Dict[str, int], use_files: bool) -> Dict[str, int]:
        if use_files and self.sweeper is not None:
            actions, freed = self.sweeper.sweep(now, self.touched)
            self.touched = set()
            self.evictions += actions
            self.evicted_bytes += freed
            self.last_sweep = now
            if not freed:
                return before
            # what the sweep freed was unmapped file cache: no second meminfo read
            after = dict(before)
            after["cached"] = max(0, before["cached"] - freed)
            after["unmapped"] = max(0, before["unmapped"] - freed)
            after["available"] = before["available"] + freed
            after["free"] = before["free"] + freed
            return after
        self.drop_global()
        after = self._sample()
        self.evictions += 1
        self.evicted_bytes += max(0, before["cached"] - after["cached"])
        return after

    def tick(self) -> float:
        """Sample, act if the mode says so; returns how long to sleep at most."""
        now = self.clock()
        self.ticks += 1
        if self.events is not None and self.sweeper is not None:
            if self.sweeper.due_rescan(now):
                self.sweeper.rescan(now)  # new files (a download finishing) get watched too
                self.events.watch(self.sweeper.files)
            touched = self.events.drain() if self.events.fd is not None else None
            if touched is None or self.touched is None:
                self.touched = None
            else:
                self.touched |= touched
        view = self._sample()
        dt = max(1e-6, now - self.last_tick)
        self.rate = (view["unmapped"] - self.prev_unmapped) / dt
        self.last_tick = now
        interval = self.config["interval"]
        if self.mode == "global":
            view = self._act(now, view, use_files=False)
        elif self.mode == "files":
            view = self._act(now, view, use_files=True)
        else:
            trigger = self.policy.observe(now, view)
            if trigger is not None:
                self.triggers[trigger] = self.triggers.get(trigger, 0) + 1
                after = self._act(now, view, use_files=self.sweeper is not None)
                self.policy.acted(now, trigger, view, after)
                view = after
            elif self.sweeper is not None and self.sweeper.tails and now - self.last_sweep >= TAIL_CLEANUP_S:
                # a readahead tail kept by the last sweep outlived the read: evict it now
                self.triggers["tail"] = self.triggers.get("tail", 0) + 1
                after = self._act(now, view, use_files=True)
                self.policy.acted(now, "tail", view, after)
                view = after
        self.prev_unmapped = view["unmapped"]
        if self.mode != "adaptive":
            return interval
        if self.policy.held:  # look again when, at this rate, MemFree reaches the line
            return _guard_memory.sleep_until(view["free"] - self.policy.act_below_free, self.rate, interval)
        return _guard_memory.next_sleep(
            view["unmapped"], self.policy.reference, self.policy.threshold, self.rate, interval
        )

    # -- status
    def status(self, state: str) -> Dict[str, Any]:
        base = self.baseline
        result = {
            "name": self.config["name"],
            "mode": self.mode,
            "pid": os.getpid(),
            "state": state,
            "started_at": self.started_at,
            "stopped_at": self.stopped_at,
            "elapsed_s": round(self.clock() - self.started_mono, 3),
            "ticks": self.ticks,
            "evictions": self.evictions,
            "evicted_bytes": self.evicted_bytes,
            "baseline_cache_mib": _mib(base["cached"]),
            "peak_cache_mib": _mib(self.peak_cached),
            "peak_growth_mib": _mib(self.peak_cached - base["cached"]),
            "peak_mapped_mib": _mib(self.peak_mapped),
            "min_available_mib": _mib(self.min_available),
            "baseline_unmapped_mib": _mib(base["unmapped"]),
            "peak_unmapped_growth_mib": _mib(self.peak_unmapped - base["unmapped"]),
            **_guard_status.cpu_usage(),
            "stop_reason": self.stop_reason,
            "triggers": dict(self.triggers),
            "held_ticks": self.policy.held_ticks,
            "config": dict(self.config),
        }
        if self.sweeper is not None:
            result["files"] = len(self.sweeper.files)
            result["sweeps"] = self.sweeper.sweeps
            result["file_checks"] = self.sweeper.checks
            result["residency_method"] = self.sweeper.residency.method
            result["warnings"] = list(self.sweeper.warnings)
        if self.config.get("lock_memory"):
            result["locked_kib"] = self.locked_kib
            result["lock_error"] = self.lock_error
        if self.events is not None:
            result["inotify_watches"] = self.events.watched
            result["inotify_batches"] = self.events.events
        return result


def _mib(value: float) -> float:
    return round(value / _guard_memory.MIB, 1)


def run(config: Dict[str, Any], stop: Optional[Stopper] = None, clock: Callable[[], float] = time.monotonic) -> int:
    """Run the guard until a stop condition; returns the exit code (0 or 1)."""
    stop = stop or Stopper()
    status_file = config.get("status_file")
    try:
        guard = Guard(config, clock)
    except OSError as err:
        _report_early_error(config, "error: cannot read memory figures: %s" % err)
        return 1
    url_watch: Optional[_guard_watch.UrlWatch] = None
    code = 0
    last_status = -1e9
    last_pid = -1e9
    try:
        guard.preflight()
        if config.get("lock_memory"):
            guard.locked_kib, guard.lock_error = _guard_memory.lock_own_memory()
        guard.writer = _guard_status.Writer(status_file, config.get("samples_file"))
        pid_watch = _guard_watch.PidWatch(config["until_pid"], config["proc_root"]) if config.get("until_pid") else None
        if config.get("until_url"):
            url_watch = _guard_watch.UrlWatch(config["until_url"])
            url_watch.start()
        while True:
            now = clock()
            if stop.requested:
                guard.stop_reason = "signal"
            elif now - guard.started_mono >= config["max_duration"]:
                guard.stop_reason = "max_duration"
            elif url_watch is not None and url_watch.ready.is_set():
                guard.stop_reason = "until_url"
            elif pid_watch is not None and now - last_pid >= PID_EVERY_S:
                last_pid = now
                if pid_watch.exited():
                    guard.stop_reason = "until_pid"
            if guard.stop_reason:
                break
            sleep = guard.tick()
            if now - last_status >= STATUS_EVERY_S:
                last_status = now
                guard.writer.status(guard.status("running"))
            sleep = min(sleep, max(0.0, config["max_duration"] - (clock() - guard.started_mono)))
            if pid_watch is not None:
                sleep = min(sleep, PID_EVERY_S)
            # held (MemFree above act_below_free_mib): a timed tick, not a wake-up at every read
            watch = guard.mode == "adaptive" and guard.events is not None and guard.events.fd is not None
            watch = watch and not guard.policy.held
            if watch and sleep >= config["interval"]:
                # no growth in sight: wake at once on file activity (a loader opening
                # the next shard, or starting to read), at most every MIN_TICK_S
                if stop.wait(sleep, guard.events.fd):
                    stop.wait(_guard_memory.MIN_TICK_S - (clock() - now))
            else:
                # the cache grows (or files/global mode): the tick is timed
                stop.wait(sleep)
    except (OSError, ValueError) as err:
        guard.stop_reason = "error: %s" % err
        code = 1
    finally:
        if url_watch is not None:
            url_watch.stop()
        guard.close()
    guard.stopped_at = _guard_status.utc_now()
    final = guard.status("stopped")
    if url_watch is not None:
        final["url_checks"] = url_watch.checks
        final["url_last_error"] = url_watch.last_error
    if guard.writer is not None:
        final["write_errors"] = list(guard.writer.errors)
    written = guard.writer.final(final) if guard.writer is not None else _guard_status.write_status(status_file, final)
    if not written:
        code = code or 1
    if code:
        sys.stderr.write("uma_guard %s: %s\n" % (config["name"], guard.stop_reason))
    return code


def _report_early_error(config: Dict[str, Any], reason: str) -> None:
    sys.stderr.write("uma_guard %s: %s\n" % (config["name"], reason))
    now = _guard_status.utc_now()
    _guard_status.write_status(
        config.get("status_file"),
        {
            "name": config["name"],
            "mode": config["mode"],
            "pid": os.getpid(),
            "state": "stopped",
            "started_at": now,
            "stopped_at": now,
            "elapsed_s": 0.0,
            "ticks": 0,
            "evictions": 0,
            "evicted_bytes": 0,
            "cpu_seconds": _guard_status.cpu_usage()["cpu_seconds"],
            "stop_reason": reason,
            "config": config,
        },
    )


def main(argv: Optional[List[str]] = None) -> int:
    config = parse_config(argv)
    if config.pop("check_config", False):
        sys.stdout.write("uma_guard.py: the options of guard %s are valid on this node\n" % config["name"])
        return 0
    stop = Stopper()
    signal.signal(signal.SIGTERM, stop.handler)
    signal.signal(signal.SIGINT, stop.handler)
    try:
        return run(config, stop)
    finally:
        stop.close()
