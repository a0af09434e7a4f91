# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What uma.vllm.oom_diagnose does on the node: read the evidence, diagnose each engine, write the report.

The module ``oom_diagnose`` is the Ansible wrapper (options, check mode, the result); this file
holds its logic: the checks of the options (:func:`checked_request`), the readers of the node's
files and commands (kernel log, engine journals, launch records and samples, the watchdog's
records, the guard's status, /proc, /metrics) and :func:`diagnose_node`, which feeds each
engine's evidence to ``_diagnose.diagnose`` and renders the Markdown report and the SVG
timeline. A source that cannot be read is noted in ``sources``, never a failure.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess

from ansible.module_utils.urls import open_url

from ansible_collections.uma.vllm.plugins.module_utils.diagnose import core as _diagnose
from ansible_collections.uma.vllm.plugins.module_utils.diagnose import timeline as _timeline
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import (
    UmaError,
    read_meminfo,
    read_record_file,
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
    """A JSON object from a node record, or None when it is missing or damaged (not a regular file,
    a FIFO, not UTF-8 or JSON, NaN/Infinity, a number beyond 64 bits, not an object): read through
    the node programs' one record reader, the problem named in ``sources`` (the record stays where
    it is: diagnosis reads, it does not set aside)."""
    data, problem = read_record_file(path, dict)
    if problem is not None and sources is not None:
        sources[key] = "%s: %s" % (path, problem)
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


def checked_request(p):
    """Check the options (raises UmaError naming the bad one); returns (lines, metrics timeout, settings).

    Fills ``p["report_host"]`` from the node's name when it is not given.
    """
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
    return lines, timeout, settings


def _kernel_log(p, lines, sources):
    """The kernel log: the given file, else the first command that prints something."""
    if p["kernel_log_file"]:
        return _read_file(p["kernel_log_file"], sources, "kernel")
    for argv in p["kernel_commands"]:
        text = _run(_fill(argv, lines=lines), sources, "kernel")
        if text and text.strip():
            return text
    return None


def _meminfo(proc_root, sources):
    try:
        return read_meminfo(proc_root)
    except OSError as exc:
        sources["meminfo"] = "%s/meminfo: %s" % (proc_root, exc.strerror)
        return {}


def _engines(p):
    """The engines asked for, else every engine with launch or watchdog records, else [None] (the node only)."""
    found = sorted(set(_engine_dirs(p["state_dir"], "launches")) | set(_engine_dirs(p["state_dir"], "watchdog")))
    return list(p["engines"]) or found or [None]


def _engine_evidence(p, engine, evidence, lines, timeout, sources):
    """Add one engine's journal, launch record, samples, other launches, watchdog, guard and metrics."""
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
    return evidence


def _timeline_of(p, host, engine, evidence, mem_total, settings):
    """The memory timeline of the engine's launch: {engine, file, svg}."""
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
    svg_file = p["timeline_name"].replace("{host}", host).replace("{engine}", engine)
    svg = _timeline.render_svg(
        samples,
        kv_alloc_t=launch.get("kv_alloc_t") if isinstance(launch.get("kv_alloc_t"), (int, float)) else None,
        title="%s / %s - launch %s" % (host, engine, launch.get("started_at", "(no launch record)")),
        marks=marks,
        threshold_bytes=settings["cache_fraction"] * mem_total if mem_total else None,
        threshold_label="page cache %d%% of MemTotal" % round(100 * settings["cache_fraction"]),
    )
    return {"engine": engine, "file": svg_file, "svg": svg}


def diagnose_node(p, lines, timeout, settings):
    """Every engine's diagnosis, the report, the timelines and what was read (the module's result)."""
    sources = {}
    host = p["report_host"]
    kernel = _kernel_log(p, lines, sources)
    meminfo = _meminfo(p["proc_root"], sources)
    sysctl = _sysctls(p["proc_root"], p["sysctl_keys"])
    boot_time = _boot_time(p["proc_root"])
    diagnoses, timelines, sections = [], [], []
    for engine in _engines(p):
        evidence = {"dmesg": kernel or "", "meminfo": meminfo, "sysctl": sysctl, "engine": engine}
        if boot_time is not None:
            evidence["boot_time"] = boot_time  # places plain dmesg's seconds-since-boot lines in time
        if engine:
            _engine_evidence(p, engine, evidence, lines, timeout, sources)
        result = _diagnose.diagnose(evidence, settings)
        result["engine"] = engine
        diagnoses.append(result)
        svg_file = None
        if engine:
            timeline = _timeline_of(p, host, engine, evidence, meminfo.get("MemTotal"), settings)
            timelines.append(timeline)
            svg_file = timeline["file"]
        sections.append(_diagnose.render_markdown(host, result, timeline_file=svg_file))
    ranked = sorted((d for d in diagnoses if d["class"] != "none"), key=lambda d: -d["confidence"])
    return {
        "class": ranked[0]["class"] if ranked else "none",
        "diagnoses": diagnoses,
        "report": "\n---\n\n".join(sections),
        "timelines": timelines,
        "sources": sources,
        "host": host,
    }
