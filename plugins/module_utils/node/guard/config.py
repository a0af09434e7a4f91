# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The page-cache guard's configuration: one type, one validator, one set of defaults and limits.

Node-side (runs on the node with the stdlib only; shipped beside ``uma_guard.py``).

Every place that configures a guard goes through :class:`GuardConfig`:

- the guard's own command line (``uma_guard.py``, options spelled ``--threshold-mib``),
- the launcher (``uma_launch.py``, options spelled ``guard_threshold_mib``),
- the ``drop_cache_loop`` module (options spelled ``threshold_mib``),
- the OOM diagnosis, which names :data:`DEFAULT_MODE` in its advice.

Each caller passes its own spelling of the option names (``spell``) so a refusal
names the option the user actually typed. What is checked here is the value
alone; what depends on the node at the time of the call (does the PID run, is
``drop_caches`` writable, who owns the samples directory) is :func:`check_on_node`.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional
from urllib.parse import urlparse

from ..base import checks as _checks
from ..base.common import UmaError, require_int

MODES = ("global", "files", "adaptive")
# Chosen by benchmarks/page_cache.py (the benchmark reports it as default_mode
# and ranks the modes; see benchmarks/README.md)
# (evidence: docs/BENCHMARKS.md, section 'What the guard's defaults rest on').
DEFAULT_MODE = "adaptive"
DEFAULT_INTERVAL = 0.1
# Below 10 ms a Python tick costs more CPU than it saves; above a minute the guard is blind.
MIN_INTERVAL = 0.01
MAX_INTERVAL = 60.0
# Sequential readers grow the cache in read()-sized steps; 16 lets the guard act
# after one or two steps (evidence: docs/BENCHMARKS.md, section 'What the guard's
# defaults rest on').
DEFAULT_THRESHOLD_MIB = 16
MAX_MIB = 1048576  # 1 TiB: the upper bound of threshold_mib, min_available_mib and act_below_free_mib
DEFAULT_MIN_AVAILABLE_MIB = 0  # 0 = MemAvailable trigger off
# The growth trigger acts only while MemFree is below this (0: at every growth). Cache in free
# memory stands in no allocation's way, and evicting it costs the kernel ~0.15 s of system time per
# GiB freed (docs/VM-LAB.md, "Item 5"): the launcher sets it to the engine's startup request.
DEFAULT_ACT_BELOW_FREE_MIB = 0
DROP_LEVELS = (1, 3)
DEFAULT_DROP_LEVEL = 1
DEFAULT_MAX_DURATION = 900.0
MAX_DURATION = 86400.0
MAX_PID = 4194304  # kernel.pid_max's ceiling
_EXAMPLES = {"status_file": "/run/uma-vllm/guard.json", "samples_file": "/run/uma-vllm/samples.jsonl",
             "proc_root": "/proc", "sysfs_root": "/sys"}  # fmt: skip


def plain(key: str) -> str:
    """Option spelling of the drop_cache_loop module: the field name itself."""
    return key


def cli(key: str) -> str:
    """Option spelling of uma_guard.py's command line: ``--threshold-mib``."""
    return "--" + key.replace("_", "-")


def prefixed(prefix: str) -> Callable[[str], str]:
    """Option spelling of a caller that nests the guard's options, e.g. the launcher's ``guard_mode``."""
    return lambda key: prefix + key


@dataclass
class GuardConfig:
    """One guard: what it acts on, how often, and when it stops."""

    name: str
    mode: str = DEFAULT_MODE
    paths: List[str] = field(default_factory=list)
    interval: Any = DEFAULT_INTERVAL
    threshold_mib: Any = DEFAULT_THRESHOLD_MIB
    min_available_mib: Any = DEFAULT_MIN_AVAILABLE_MIB
    act_below_free_mib: Any = DEFAULT_ACT_BELOW_FREE_MIB
    drop_level: Any = DEFAULT_DROP_LEVEL
    max_duration: Any = DEFAULT_MAX_DURATION
    until_url: Optional[str] = None
    until_pid: Any = None
    status_file: Optional[str] = None
    samples_file: Optional[str] = None
    proc_root: str = "/proc"
    sysfs_root: str = "/sys"

    def validated(self, spell: Callable[[str], str] = plain, absolute_paths: bool = False) -> GuardConfig:
        """A normalised copy, or UmaError naming the option (as ``spell`` writes it), the value and the fix.

        Reads the node only to see that ``paths`` exist. ``absolute_paths`` refuses relative
        paths (a module's working directory means nothing to the user); otherwise they are
        made absolute against the current directory (the command line).
        """
        if not isinstance(self.name, str) or not self.name.strip():
            raise UmaError(spell("name"), self.name, "is empty", "Give the guard a name, e.g. llama-70b.")
        if self.mode not in MODES:
            raise UmaError(spell("mode"), self.mode, "is not a guard mode", "Use one of %s." % ", ".join(MODES))
        paths = _paths(self.paths, self.mode, spell, absolute_paths)
        interval = _seconds(spell("interval"), self.interval, MAX_INTERVAL, "Give seconds between ticks, e.g. 0.1.")
        if interval < MIN_INTERVAL:
            raise UmaError(
                spell("interval"), self.interval, "is below %g s" % MIN_INTERVAL, "Give at least 0.01 (0.1 is cheap)."
            )
        max_duration = _seconds(
            spell("max_duration"), self.max_duration, MAX_DURATION, "Give the longest a load may take, e.g. 900."
        )
        threshold = require_int(spell("threshold_mib"), self.threshold_mib, 1, MAX_MIB, "Give MiB, e.g. 16.")
        min_available = require_int(spell("min_available_mib"), self.min_available_mib, 0, MAX_MIB, "Use 0 for off.")
        act_below_free = require_int(
            spell("act_below_free_mib"), self.act_below_free_mib, 0, MAX_MIB,
            "Give MiB of MemFree below which growth is evicted (e.g. the engine's request), or 0 to act always.",
        )  # fmt: skip
        if act_below_free and self.mode != "adaptive":
            raise UmaError(
                spell("act_below_free_mib"), self.act_below_free_mib,
                "has no effect with mode=%s (only the adaptive mode waits for growth)" % self.mode,
                "Use mode adaptive, or leave it 0.",
            )  # fmt: skip
        drop_level = require_int(spell("drop_level"), self.drop_level, 1, 3, "Give 1 or 3.")
        if drop_level not in DROP_LEVELS:
            raise UmaError(spell("drop_level"), self.drop_level, "is not 1 or 3", "Give 1 (page cache) or 3 (+slab).")
        url = self.until_url
        if url is not None:
            parsed = urlparse(url) if isinstance(url, str) else None
            if parsed is None or parsed.scheme not in ("http", "https") or not parsed.netloc or _space(url):
                raise UmaError(
                    spell("until_url"), url, "is not an http(s) URL", "Use e.g. http://127.0.0.1:8000/health."
                )
        pid = None
        if self.until_pid is not None and self.until_pid != "":
            pid = require_int(spell("until_pid"), self.until_pid, 1, MAX_PID, "Give the loader's positive process id.")
        files = {}
        for key in ("status_file", "samples_file", "proc_root", "sysfs_root"):
            # no NUL or line break (a status file named across two lines), absolute for a module
            value = _checks.path(spell(key), getattr(self, key), "Give e.g. %s." % _EXAMPLES[key], absolute_paths,
                                 optional=key.endswith("_file"))  # fmt: skip
            files[key] = os.path.abspath(value) if value else None
        return replace(
            self,
            paths=paths,
            interval=interval,
            threshold_mib=threshold,
            min_available_mib=min_available,
            act_below_free_mib=act_below_free,
            drop_level=drop_level,
            max_duration=max_duration,
            until_url=url,
            until_pid=pid,
            **files,
        )

    @property
    def drops_globally(self) -> bool:
        """True when the guard writes /proc/sys/vm/drop_caches (root, every workload's cache)."""
        return self.mode == "global" or (self.mode == "adaptive" and not self.paths)

    @property
    def drop_path(self) -> str:
        return os.path.join(self.proc_root, "sys", "vm", "drop_caches")

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


def check_on_node(config: GuardConfig, spell: Callable[[str], str] = plain) -> None:
    """What only the node at this moment can tell: the PID runs, drop_caches is writable,
    the samples file cannot be turned against another file. Raises UmaError."""
    if config.until_pid is not None and not os.path.exists(os.path.join(config.proc_root, str(config.until_pid))):
        raise UmaError(
            spell("until_pid"),
            config.until_pid,
            "is not a running process on the node (no %s under proc_root)"
            % os.path.join(config.proc_root, str(config.until_pid)),
            "Start the loader first, then the guard.",
        )
    samples = config.samples_file
    if samples is not None:
        fix = "Give a new file in a directory only root can write, e.g. /run/uma-vllm/samples-NAME.jsonl."
        if os.path.lexists(samples) and (os.path.islink(samples) or not os.path.isfile(samples)):
            raise UmaError(
                spell("samples_file"),
                samples,
                "exists and is a symlink or not a regular file (the root guard never follows links)",
                fix,
            )
        if not os.path.isdir(os.path.dirname(samples)):
            raise UmaError(
                spell("samples_file"),
                samples,
                "is not in an existing directory",
                "Give a file in an existing directory.",
            )
        info = os.stat(os.path.dirname(samples))
        if info.st_uid != os.geteuid() or info.st_mode & 0o022:
            raise UmaError(
                spell("samples_file"),
                samples,
                "is in a directory another user can write (the root guard would write where they point it)",
                fix,
            )
    if config.drops_globally and not os.access(config.drop_path, os.W_OK):
        raise UmaError(
            spell("mode"),
            config.mode,
            "drops caches globally here and %s is not writable" % config.drop_path,
            "Run with become: true, or give paths (mode files/adaptive) to evict only the model's files.",
        )


def _space(text: str) -> bool:
    return any(c.isspace() for c in text)


def _seconds(option: str, value: Any, maximum: float, fix: str) -> float:
    """A number of seconds in (0, maximum]: ints, floats and decimal strings (the command line); no bool, no NaN."""
    return float(_checks.number(option, value, 0, maximum, fix, above=True, strings=True))


def _paths(paths: Any, mode: str, spell: Callable[[str], str], absolute: bool) -> List[str]:
    if paths is None:
        paths = []
    if not isinstance(paths, list):
        raise UmaError(spell("paths"), paths, "is not a list", "Give a list of absolute paths.")
    if mode == "files" and not paths:
        raise UmaError(
            spell("paths"),
            paths,
            "is empty but mode=files evicts only these",
            "Give the model directory (or use mode adaptive, which drops globally without paths).",
        )
    if mode == "global" and paths:
        raise UmaError(
            spell("paths"),
            paths,
            "has no effect with mode=global (it drops every file's cache)",
            "Use mode files or adaptive to act on these paths only.",
        )
    clean = []
    for path in paths:
        if not isinstance(path, str) or not path or (absolute and not os.path.isabs(path)):
            raise UmaError(
                spell("paths"), path, "is not an absolute path", "Give absolute paths such as /models/llama."
            )
        if not os.path.exists(path):
            raise UmaError(spell("paths"), path, "does not exist on the node", "Give existing files or directories.")
        clean.append(os.path.abspath(path))
    return clean
