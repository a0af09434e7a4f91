#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: oom_diagnose
short_description: Tell why a vLLM engine ran out of memory on a unified-memory node, and what fixes it
version_added: 0.1.0
description:
  - Reads the evidence on the node - the kernel log (C(NV_ERR_NO_MEMORY), C(oom-killer) traces through
    C(nvidia_uvm) / C(sysmemAllocResources)), each engine's journal (launcher, vLLM and systemd lines),
    the launcher's C(launch.json) and the guard's C(samples.jsonl), the engine's C(/metrics), the
    guard's status file, C(/proc/meminfo) and the C(vm.*) sysctls in force.
  - Classifies each engine as one of C(admission_refused) (the launcher refused the start, MemAvailable
    below the plan's startup request, exit 75), C(startup_oom) (weights + KV cache over the budget),
    C(page_cache_starvation) (UMA page cache held the memory at load), C(profiling_race) (another
    engine started at the same time), C(runtime_burst) (long prompts / batched tokens),
    C(fragmentation) (allocator fragmentation, chronic OOMs), C(prefix_cache_pressure) (full KV cache,
    queue and preemptions) or C(none), with the evidence lines that decided it, a confidence and the
    concrete change (a flag, a sysctl, a guard mode, a re-plan with M(uma.vllm.vllm_flags)).
  - Returns a Markdown report and, per engine, an SVG of the memory timeline of the launch with the
    KV-cache allocation moment marked. It only reads; writing the reports is the caller's (see the
    playbook C(uma.vllm.diagnose)).
  - Reads the engine watchdog's records (C(<state_dir>/watchdog/<engine>/state.json) and C(events.json),
    written by C(uma_watchdog.py)) and reports what it saw and did - wedges, memory floor events and
    evictions, restarts (with their kind and the observations that decided them), a give-up - under
    RV(diagnoses[].watchdog) and in the report's "Engine watchdog" section.
  - Sources that are missing or unreadable are reported under RV(sources), never a failure.
author:
  - uma.vllm developers (@uma-vllm)
extends_documentation_fragment:
  - uma.vllm.attributes
attributes:
  check_mode:
    support: full
    details: The module only reads; it runs the same in check mode and never reports a change.
  diff_mode:
    support: none
  platform:
    platforms: posix
options:
  engines:
    description:
      - Engines to diagnose (the C(<engine>) of C(uma-vllm@<engine>.service)).
      - Empty means every engine that has a launch directory under O(state_dir)C(/launches) or watchdog
        records under O(state_dir)C(/watchdog); with none, one node-level diagnosis from the kernel log alone.
    type: list
    elements: str
    default: []
  launch:
    description: Which launch directory of each engine to read; V(latest) follows the C(latest) symlink.
    type: str
    default: latest
  state_dir:
    description: The collection's state directory (launch records under C(launches/<engine>/)).
    type: path
    default: /var/lib/uma-vllm
  run_dir:
    description: Where the guard keeps C(guard-<engine>.json) while it runs.
    type: path
    default: /run/uma-vllm
  proc_root:
    description: Root of procfs (C(meminfo), C(sys/vm/*)); tests point it at a temporary directory.
    type: path
    default: /proc
  sysctl_keys:
    description: Sysctls whose live values the report shows as settings in force.
    type: list
    elements: str
    default: [vm.min_free_kbytes, vm.vfs_cache_pressure, vm.dirty_ratio, vm.dirty_background_ratio, vm.swappiness,
              vm.watermark_scale_factor, vm.overcommit_memory]
  journal_command:
    description:
      - Command that prints an engine's journal; C({engine}) and C({lines}) are replaced.
      - Its lines should carry ISO timestamps (C(-o short-iso)) so kernel and engine events line up.
    type: list
    elements: str
    default: [journalctl, -u, "uma-vllm@{engine}.service", -o, short-iso, --no-pager, -q, -n, "{lines}"]
  journal_dir:
    description:
      - Read C(<engine>.log) from this directory instead of running O(journal_command) (tests, or
        journals exported elsewhere).
    type: path
  kernel_commands:
    description:
      - Commands tried in order until one prints something, for the kernel log; C({lines}) is replaced.
    type: list
    elements: list
    default:
      - [journalctl, -k, -o, short-iso, --no-pager, -q, -n, "{lines}"]
      - [dmesg, --time-format, iso]
  kernel_log_file:
    description: Read the kernel log from this file instead of running O(kernel_commands).
    type: path
  lines:
    description: How many journal / kernel log lines to read at most (a whole number, 100 or more).
    type: raw
    default: 20000
  metrics_urls:
    description:
      - Per engine, the URL of its C(/metrics) (mapping engine to URL). Engines without one are
        diagnosed without metrics.
    type: dict
    default: {}
  metrics_timeout:
    description: Seconds to wait for a C(/metrics) answer (a number above 0).
    type: raw
    default: 5
  cache_fraction:
    description:
      - Reclaimable page cache (C(Cached) minus C(Mapped)) at the failure, as a fraction of C(MemTotal),
        from which page cache counts as the cause of a failed load (a number between 0 and 1).
    type: raw
    default: 0.15
  kv_usage_high:
    description: KV cache usage (0-1) from which the cache counts as full.
    type: raw
    default: 0.9
  report_host:
    description: Host name in the report's title; the node's own name when not set.
    type: str
  timeline_name:
    description: File name the report links for an engine's timeline; C({host}) and C({engine}) are replaced.
    type: str
    default: "{host}-{engine}.svg"
notes:
  - C(NV_ERR_NO_MEMORY) alone is not taken as an OOM; published GB10 logs show it during loads that went
    healthy. It counts next to a failed start or a kill.
seealso:
  - module: uma.vllm.vllm_flags
  - module: uma.vllm.uma_sysctl
"""

EXAMPLES = r"""
- name: Diagnose every engine on the node
  uma.vllm.oom_diagnose:
  register: diag

- name: One engine, with its metrics endpoint
  uma.vllm.oom_diagnose:
    engines: [qwen]
    metrics_urls:
      qwen: http://127.0.0.1:8000/metrics

- name: From exported logs (no journal on this host)
  uma.vllm.oom_diagnose:
    engines: [qwen]
    journal_dir: /srv/support/case-42/journal
    kernel_log_file: /srv/support/case-42/dmesg.txt
    state_dir: /srv/support/case-42/uma-vllm

- name: Show the verdict
  ansible.builtin.debug:
    msg: "{{ diag.class }}: {{ diag.diagnoses[0].fix | first }}"
"""

RETURN = r"""
class:
  description: The node's verdict - the most confident class over its engines, C(none) when none found.
  returned: always
  type: str
  sample: page_cache_starvation
diagnoses:
  description: One entry per engine (or one node-level entry when there are no engines).
  returned: always
  type: list
  elements: dict
  contains:
    engine:
      description: Engine name, or null for the node-level entry.
      type: str
    class:
      description: The class id.
      type: str
    title:
      description: The class in words.
      type: str
    confidence:
      description: 0-1; how strongly the evidence points to the class.
      type: float
    evidence:
      description: The lines (log lines, computed facts) that decided it.
      type: list
      elements: str
    fix:
      description: The concrete changes to make, most effective first.
      type: list
      elements: str
    others:
      description: Other classes that matched with less confidence, with their evidence and fix.
      type: list
      elements: dict
    settings:
      description: The settings in force (engine flags, plan, sysctls, guard).
      type: dict
    summary:
      description: What was read (launch, runs in the journal, restarts, samples, KV allocation time).
      type: dict
    metrics:
      description: The values read from C(/metrics) (KV usage and which metric name, running, waiting...).
      type: dict
    watchdog:
      description:
        - What the engine watchdog saw and did, from its C(state.json) and C(events.json); null when it
          left no records. Unreadable records are counted under C(unreadable), never a failure.
        - C(phase), C(reason), C(gave_up), C(counts) (wedges, restarts, floor_warn, floor_critical, gave_up),
          C(restarts), C(floor_restarts), C(evictions), and C(events) (the last 20 actions, each with C(at),
          C(action), C(reason) and C(evidence) phrases such as C(kind floor) or C(MemAvailable 600.0 MiB ...)).
      type: dict
  sample:
    - engine: dsv4
      class: page_cache_starvation
      title: UMA page-cache starvation at load
      confidence: 0.9
      evidence: ["ai2 kernel: NVRM: ... NV_ERR_NO_MEMORY ...", "samples.jsonl t=110.0s: Cached-Mapped 36.70 GiB ..."]
      fix: ["Run the load with the page-cache guard in 'evict' mode ..."]
report:
  description: The node's report in Markdown (one section per engine).
  returned: always
  type: str
timelines:
  description: Per engine, the SVG of the last launch's memory samples, and the file name the report links.
  returned: always
  type: list
  elements: dict
  contains:
    engine:
      description: Engine name.
      type: str
    file:
      description: File name used in the report (O(timeline_name)).
      type: str
    svg:
      description: The SVG document.
      type: str
sources:
  description: Per source, what was read or why not (missing file, command not found, HTTP error).
  returned: always
  type: dict
  sample: {kernel: "journalctl -k: 2211 lines", "journal:qwen": "command not found: journalctl"}
changed:
  description: Always false; the module only reads.
  returned: always
  type: bool
"""

import json
import os
import platform
import re
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

from ansible_collections.uma.vllm.plugins.module_utils import _diagnose, _paths, _timeline
from ansible_collections.uma.vllm.plugins.module_utils._common import (
    UmaError,
    read_json,
    read_meminfo,
    read_text,
    require_int,
)


def _number(option, value, low, high):
    if isinstance(value, str) and not re.fullmatch(
        r"\s*[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?\s*", value, re.ASCII
    ):
        raise UmaError(option, value, "is not a plain decimal number", "Give a number between %g and %g." % (low, high))
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UmaError(option, value, "is not a number", "Give a number between %g and %g." % (low, high)) from None
    if isinstance(value, bool) or not low <= number <= high:
        raise UmaError(option, value, "is out of range", "Give a number between %g and %g." % (low, high))
    return number


def _run(argv, sources, key):
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=60, check=False)
    except FileNotFoundError:
        sources[key] = "command not found: %s" % argv[0]
        return None
    except (OSError, subprocess.TimeoutExpired) as exc:
        sources[key] = "%s: %s" % (argv[0], exc)
        return None
    text = proc.stdout.decode("utf-8", "replace")
    if proc.returncode != 0 and not text.strip():
        sources[key] = "%s exited %d: %s" % (
            " ".join(argv[:2]),
            proc.returncode,
            proc.stderr.decode("utf-8", "replace")[:200],
        )
        return None
    sources[key] = "%s: %d lines" % (" ".join(argv[:2]), len(text.splitlines()))
    return text


def _fill(argv, **values):
    out = []
    for raw in argv:
        arg = str(raw)
        for name, value in values.items():
            arg = arg.replace("{%s}" % name, str(value))
        out.append(arg)
    return out


def _read_file(path, sources, key):
    try:
        text = read_text(path)
    except (OSError, ValueError) as exc:
        sources[key] = "%s: %s" % (path, getattr(exc, "strerror", None) or exc)
        return None
    sources[key] = "%s: %s" % (path, "missing" if text is None else "%d lines" % len(text.splitlines()))
    return text


ENGINE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", re.ASCII)
HOST_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,252}", re.ASCII)
SYSCTL_KEY_RE = re.compile(r"[a-z0-9_]+(\.[a-z0-9_]+){1,4}", re.ASCII)
TIMELINE_RE = re.compile(r"[A-Za-z0-9_{][A-Za-z0-9._{}-]{0,200}", re.ASCII)


def _json_source(path, sources=None, key=None):
    """JSON from a file, or None when it is missing, unreadable, not JSON or not a mapping."""
    try:
        data = read_json(path)
    except (OSError, ValueError) as exc:
        if sources is not None:
            sources[key] = "%s: %s" % (path, getattr(exc, "strerror", None) or exc)
        return None
    if data is not None and not isinstance(data, dict):
        if sources is not None:
            sources[key] = "%s: not a JSON object (%s)" % (path, type(data).__name__)
        return None
    return data


def _check_inputs(p):
    """Names that become file names or paths: refused when they could leave their directory."""
    for engine in p["engines"]:
        if not isinstance(engine, str) or not ENGINE_RE.fullmatch(engine):
            raise UmaError(
                "engines",
                engine,
                "is not an engine name (1-64 of A-Z a-z 0-9 . _ -, not starting with . _ -)",
                "Give the <engine> of uma-vllm@<engine>.service.",
            )
    if not isinstance(p["launch"], str) or not (p["launch"] == "latest" or ENGINE_RE.fullmatch(p["launch"])):
        raise UmaError(
            "launch", p["launch"], "is not a launch stamp", "Give 'latest' or a stamp such as 20260101T000000Z."
        )
    for key in p["sysctl_keys"]:
        if not isinstance(key, str) or not SYSCTL_KEY_RE.fullmatch(key):
            raise UmaError(
                "sysctl_keys",
                key,
                "is not a sysctl name (dotted lower-case words such as vm.min_free_kbytes)",
                "Give sysctl names only; they are read under proc_root/sys.",
            )
    if p["report_host"] is not None and (
        not isinstance(p["report_host"], str) or not HOST_RE.fullmatch(p["report_host"])
    ):
        raise UmaError(
            "report_host",
            p["report_host"],
            "is not a host name (it becomes part of report file names: no / .. or spaces)",
            "Give the inventory host name, e.g. ai1.",
        )
    name = p["timeline_name"]
    if not isinstance(name, str) or not TIMELINE_RE.fullmatch(name) or ".." in name:
        raise UmaError(
            "timeline_name",
            name,
            "is not a plain file name (no /, .., spaces; {host} and {engine} are filled in)",
            "Give e.g. '{host}-{engine}.svg'.",
        )
    commands = [("journal_command", p["journal_command"])]
    commands += [("kernel_commands", argv) for argv in (p["kernel_commands"] or [])]
    for option, argv in commands:
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv) or not argv[0]:
            raise UmaError(
                option,
                argv,
                "is not a command (a non-empty list of strings, program first)",
                "Give e.g. ['journalctl', '-k', '-o', 'short-iso'].",
            )
        if any("\x00" in a for a in argv):
            raise UmaError(option, argv, "contains a NUL character", "Give plain words.")
    for option in ("state_dir", "run_dir", "proc_root", "journal_dir", "kernel_log_file"):
        value = p.get(option)
        if value is not None and (not isinstance(value, str) or "\x00" in value):
            raise UmaError(option, value, "is not a path", "Give an absolute path.")


def _watchdog_record(path, want):
    """One of the watchdog's JSON records: (data, note). Missing, unreadable or garbled -> (None, why)."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(16 * 1024 * 1024)
    except FileNotFoundError:
        return None, "missing"
    except OSError as exc:
        return None, exc.strerror or str(exc)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return None, "not valid JSON (%s)" % str(exc)[:80]
    if not isinstance(data, want):
        return None, "not a JSON %s (%s)" % ("object" if want is dict else "list", type(data).__name__)
    return data, "%d entries" % len(data) if want is list else "phase %s" % data.get("phase")


def _read_watchdog(state_dir, engine, sources):
    """The watchdog's state.json and events.json for ``engine`` (never a failure)."""
    base = os.path.join(state_dir, "watchdog", engine)
    state, state_note = _watchdog_record(os.path.join(base, "state.json"), dict)
    events, events_note = _watchdog_record(os.path.join(base, "events.json"), list)
    sources["watchdog:%s" % engine] = "%s: state.json %s, events.json %s" % (base, state_note, events_note)
    return _diagnose.summarize_watchdog(state, events)


def _engine_dirs(state_dir, kind):
    """Engine names with a directory under <state_dir>/<kind> (launches, watchdog)."""
    root = os.path.join(state_dir, kind)
    try:
        return sorted(d for d in os.listdir(root) if ENGINE_RE.fullmatch(d) and os.path.isdir(os.path.join(root, d)))
    except OSError:
        return []


def _read_launch(state_dir, engine, launch, sources):
    base = os.path.join(state_dir, "launches", engine)
    path = os.path.realpath(os.path.join(base, launch))
    record = _json_source(os.path.join(path, "launch.json"), sources, "launch:%s" % engine)
    samples_text = None
    if record is None:
        sources.setdefault("launch:%s" % engine, "%s: no launch.json" % path)
    else:
        sources["launch:%s" % engine] = "%s/launch.json" % path
        samples_text = _read_file(os.path.join(path, "samples.jsonl"), sources, "samples:%s" % engine)
    return record, samples_text


def _other_launches(state_dir, engine, limit=20):
    out = []
    for other in _engine_dirs(state_dir, "launches"):
        if other == engine:
            continue
        base = os.path.join(state_dir, "launches", other)
        try:
            stamps = sorted(d for d in os.listdir(base) if d != "latest")[-limit:]
        except OSError:
            continue
        for stamp in stamps:
            record = _json_source(os.path.join(base, stamp, "launch.json"))
            if isinstance(record, dict):
                record.setdefault("engine", other)
                out.append(record)
    return out


def _boot_time(proc_root):
    """Boot time (Unix seconds) from /proc/stat's btime, or None."""
    try:
        text = read_text(os.path.join(proc_root, "stat")) or ""
    except (OSError, ValueError):
        return None
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0] == "btime" and fields[1].isdigit() and fields[1].isascii():
            return float(fields[1])
    return None


def _sysctls(proc_root, keys):
    values = {}
    for key in keys:
        path = os.path.join(proc_root, "sys", *key.split("."))
        try:
            text = read_text(path)
        except OSError:
            text = None
        if text is not None:
            values[key] = " ".join(text.split())
    return values


def _metrics(url, timeout, sources, key):
    try:
        answer = open_url(url, timeout=timeout)
        text = answer.read().decode("utf-8", "replace")
    except Exception as exc:  # any network error only means "no metrics"
        sources[key] = "%s: %s" % (url, exc)
        return None
    sources[key] = "%s: %d lines" % (url, len(text.splitlines()))
    return text


def run_module():
    module = AnsibleModule(
        argument_spec=dict(
            engines=dict(type="list", elements="str", default=[]),
            launch=dict(type="str", default="latest"),
            state_dir=dict(type="path", default=_paths.STATE_DIR),
            run_dir=dict(type="path", default=_paths.RUN_DIR),
            proc_root=dict(type="path", default="/proc"),
            sysctl_keys=dict(
                type="list",
                elements="str",
                no_log=False,
                default=[
                    "vm.min_free_kbytes",
                    "vm.vfs_cache_pressure",
                    "vm.dirty_ratio",
                    "vm.dirty_background_ratio",
                    "vm.swappiness",
                    "vm.watermark_scale_factor",
                    "vm.overcommit_memory",
                ],
            ),
            journal_command=dict(
                type="list",
                elements="str",
                default=[
                    "journalctl",
                    "-u",
                    "uma-vllm@{engine}.service",
                    "-o",
                    "short-iso",
                    "--no-pager",
                    "-q",
                    "-n",
                    "{lines}",
                ],
            ),
            journal_dir=dict(type="path"),
            kernel_commands=dict(
                type="list",
                elements="list",
                default=[
                    ["journalctl", "-k", "-o", "short-iso", "--no-pager", "-q", "-n", "{lines}"],
                    ["dmesg", "--time-format", "iso"],
                ],
            ),
            kernel_log_file=dict(type="path"),
            lines=dict(type="raw", default=20000),
            metrics_urls=dict(type="dict", default={}),
            metrics_timeout=dict(type="raw", default=5),
            cache_fraction=dict(type="raw", default=0.15),
            kv_usage_high=dict(type="raw", default=0.9),
            report_host=dict(type="str"),
            timeline_name=dict(type="str", default="{host}-{engine}.svg"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        lines = require_int("lines", p["lines"], minimum=100, maximum=10_000_000)
        timeout = _number("metrics_timeout", p["metrics_timeout"], 0.1, 300)
        settings = {
            "cache_fraction": _number("cache_fraction", p["cache_fraction"], 0.0, 1.0),
            "kv_usage_high": _number("kv_usage_high", p["kv_usage_high"], 0.0, 1.0),
        }
        _check_inputs(p)
        for engine, url in p["metrics_urls"].items():
            if not str(url).startswith(("http://", "https://")):
                raise UmaError(
                    "metrics_urls", {engine: url}, "is not an http(s) URL", "Give e.g. http://127.0.0.1:8000/metrics."
                )
        if p["report_host"] is None:
            p["report_host"] = re.sub(r"[^A-Za-z0-9._-]", "_", platform.node()).lstrip(".") or "host"
        result = diagnose_node(p, lines, timeout, settings)
    except UmaError as err:
        module.fail_json(msg=err.message)
    module.exit_json(changed=False, **result)


def diagnose_node(p, lines, timeout, settings):
    sources = {}
    host = p["report_host"]
    if p["kernel_log_file"]:
        kernel = _read_file(p["kernel_log_file"], sources, "kernel")
    else:
        kernel = None
        for argv in p["kernel_commands"]:
            text = _run(_fill(argv, lines=lines), sources, "kernel")
            if text and text.strip():
                kernel = text
                break
    try:
        meminfo = read_meminfo(p["proc_root"])
    except OSError as exc:
        meminfo = {}
        sources["meminfo"] = "%s/meminfo: %s" % (p["proc_root"], exc.strerror)
    sysctl = _sysctls(p["proc_root"], p["sysctl_keys"])
    boot_time = _boot_time(p["proc_root"])
    found = sorted(set(_engine_dirs(p["state_dir"], "launches")) | set(_engine_dirs(p["state_dir"], "watchdog")))
    engines = list(p["engines"]) or found or [None]
    diagnoses, timelines, sections = [], [], []
    for engine in engines:
        evidence = {"dmesg": kernel or "", "meminfo": meminfo, "sysctl": sysctl, "engine": engine}
        if boot_time is not None:
            evidence["boot_time"] = boot_time  # places plain dmesg's seconds-since-boot lines in time
        if engine:
            if p["journal_dir"]:
                evidence["journal"] = _read_file(
                    os.path.join(p["journal_dir"], "%s.log" % engine), sources, "journal:%s" % engine
                )
            else:
                argv = _fill(p["journal_command"], engine=engine, lines=lines)
                evidence["journal"] = _run(argv, sources, "journal:%s" % engine)
            launch, samples_text = _read_launch(p["state_dir"], engine, p["launch"], sources)
            evidence["launch"] = launch
            evidence["samples"] = samples_text or ""
            evidence["other_launches"] = _other_launches(p["state_dir"], engine)
            watchdog = _read_watchdog(p["state_dir"], engine, sources)
            if watchdog is not None:
                evidence["watchdog"] = watchdog
            guard = _json_source(os.path.join(p["run_dir"], "guard-%s.json" % engine))
            if isinstance(guard, dict):
                evidence["guard"] = guard
            url = p["metrics_urls"].get(engine)
            if url:
                evidence["metrics"] = _metrics(url, timeout, sources, "metrics:%s" % engine)
        result = _diagnose.diagnose(evidence, settings)
        result["engine"] = engine
        diagnoses.append(result)
        svg_file = None
        if engine:
            launch = evidence.get("launch") or {}
            samples = _diagnose.align_samples(
                _diagnose.parse_samples(evidence.get("samples") or ""), _diagnose.launch_epoch(launch)
            )
            marks = []
            started = _diagnose.record_time(launch, "started_at")
            for key, label in (("healthy_at", "healthy"), ("failed_at", "failed")):
                when = _diagnose.record_time(launch, key)
                if started is not None and when is not None:
                    marks.append((round(when - started, 1), label))
            total = meminfo.get("MemTotal")
            svg_file = p["timeline_name"].replace("{host}", host).replace("{engine}", engine)
            svg = _timeline.render_svg(
                samples,
                kv_alloc_t=launch.get("kv_alloc_t") if isinstance(launch.get("kv_alloc_t"), (int, float)) else None,
                title="%s / %s - launch %s" % (host, engine, launch.get("started_at", "(no launch record)")),
                marks=marks,
                threshold_bytes=settings["cache_fraction"] * total if total else None,
                threshold_label="page cache %d%% of MemTotal" % round(100 * settings["cache_fraction"]),
            )
            timelines.append({"engine": engine, "file": svg_file, "svg": svg})
        sections.append(_diagnose.render_markdown(host, result, timeline_file=svg_file if engine else None))
    ranked = sorted((d for d in diagnoses if d["class"] != "none"), key=lambda d: -d["confidence"])
    return {
        "class": ranked[0]["class"] if ranked else "none",
        "diagnoses": diagnoses,
        "report": "\n---\n\n".join(sections),
        "timelines": timelines,
        "sources": sources,
        "host": host,
    }


def main():
    run_module()


if __name__ == "__main__":
    main()
