# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""node-exporter textfile metrics for uma.vllm (guard, launches, sysctls, page cache).

Importable (``render``/``collect`` are pure given their inputs) and runnable on a
node as ``python3 uma_metrics.py --output DIR/uma_vllm.prom`` by the role
``uma.vllm.monitoring``'s timer. The file is written atomically (temporary file
in the same directory, then rename), so node-exporter never reads half a file;
the temporary name does not end in ``.prom``, so node-exporter ignores it.

Inputs: ``<state_dir>/launches/<engine>/latest/launch.json`` (the launcher's
record), ``<run_dir>/guard-<name>.json`` (the guard's status while it runs),
the managed sysctl file and the live values under ``<proc_root>/sys/vm``, and
``<proc_root>/meminfo``. A missing input is not an error: its metrics are left
out and ``uma_vllm_textfile_source_ok{source}`` says so.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import sys
import time
from typing import Any, Dict, Iterable, List, Optional, Tuple

from .common import node_write, parse_fingerprint, read_meminfo, read_others_record, read_text
from .paths import RUN_DIR, STATE_DIR

MIB = 1 << 20
PROG = "uma-vllm-textfile"  # a damaged record or guard status is named once and left in place, never a traceback

# name -> (type, help). Order is the order in the file.
METRICS: Dict[str, Tuple[str, str]] = {
    "uma_vllm_launch_started_timestamp_seconds": ("gauge", "Start of the engine's latest launch (Unix time)."),
    "uma_vllm_launch_duration_seconds": ("gauge", "Seconds from launch start to healthy or failed (latest launch)."),
    "uma_vllm_launch_healthy": ("gauge", "1 if the latest launch became healthy, 0 if it failed or is loading."),
    "uma_vllm_launch_loading": ("gauge", "1 while the latest launch has neither become healthy nor failed."),
    "uma_vllm_launch_exit_code": ("gauge", "Exit code of the latest failed launch (absent when it did not fail)."),
    "uma_vllm_launch_kv_alloc_seconds": ("gauge", "Seconds from launch start to the KV cache allocation (latest)."),
    "uma_vllm_launch_page_cache_peak_bytes": ("gauge", "Peak page cache during the latest launch's load."),
    "uma_vllm_launch_records": ("gauge", "Launch records kept on the node for the engine."),
    "uma_vllm_launch_failed_records": ("gauge", "Kept launch records that ended in failure."),
    "uma_vllm_guard_running": ("gauge", "1 while the page-cache guard runs for the engine."),
    "uma_vllm_guard_evictions_total": ("counter", "Evictions by the page-cache guard in the current/latest launch."),
    "uma_vllm_guard_evicted_bytes_total": ("counter", "Bytes evicted by the guard in the current/latest launch."),
    "uma_vllm_guard_peak_cache_bytes": ("gauge", "Peak page cache the guard saw in the current/latest launch."),
    "uma_vllm_guard_cpu_seconds_total": ("counter", "CPU seconds the guard used in the current/latest launch."),
    "uma_vllm_min_free_kbytes": ("gauge", "vm.min_free_kbytes in force (live)."),
    "uma_vllm_sysctl_value": ("gauge", "Live value of a vm sysctl the collection manages."),
    "uma_vllm_sysctl_drift": ("gauge", "1 if the live value differs from the managed sysctl file."),
    "uma_vllm_sysctl_file_edited": ("gauge", "1 if the managed sysctl file was edited by hand (fingerprint)."),
    "uma_vllm_node_mem_total_bytes": ("gauge", "MemTotal of the node."),
    "uma_vllm_node_mem_available_bytes": ("gauge", "MemAvailable of the node."),
    "uma_vllm_node_page_cache_bytes": ("gauge", "Cached (page cache) of the node."),
    "uma_vllm_node_page_cache_unmapped_bytes": ("gauge", "Cached minus Mapped: page cache the guard can evict."),
    "uma_vllm_textfile_source_ok": ("gauge", "1 if the source could be read (0: missing or unreadable)."),
    "uma_vllm_textfile_timestamp_seconds": ("gauge", "When this file was written (Unix time)."),
}

DEFAULT_SYSCTL_KEYS = ("vm.min_free_kbytes", "vm.vfs_cache_pressure", "vm.dirty_ratio", "vm.dirty_background_ratio")


def escape_label(value: Any) -> str:
    """Label value escaping of the Prometheus text format (backslash, quote, newline)."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_value(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def render(
    samples: Iterable[Tuple[str, Dict[str, Any], float]], catalog: Optional[Dict[str, Tuple[str, str]]] = None
) -> str:
    """Prometheus text exposition: HELP/TYPE once per metric, in catalog order (METRICS), then by labels.

    Other node programs (the watchdog) pass their own ``catalog`` of name -> (type, help).
    """
    catalog = METRICS if catalog is None else catalog
    grouped: Dict[str, List[Tuple[Dict[str, Any], float]]] = {}
    for name, labels, value in samples:
        if name not in catalog:
            raise ValueError("unknown metric %s" % name)
        grouped.setdefault(name, []).append((labels, value))
    out: List[str] = []
    for name, (kind, text) in catalog.items():
        if name not in grouped:
            continue
        out.append("# HELP %s %s" % (name, text))
        out.append("# TYPE %s %s" % (name, kind))
        for labels, value in sorted(grouped[name], key=lambda lv: sorted(lv[0].items())):
            label_text = ",".join('%s="%s"' % (k, escape_label(v)) for k, v in sorted(labels.items()))
            out.append("%s%s %s" % (name, "{%s}" % label_text if label_text else "", format_value(value)))
    return "\n".join(out) + "\n"


def _epoch(value: Any) -> Optional[float]:
    if not isinstance(value, str) or not value:
        return None
    text = value.strip().replace("Z", "+00:00")
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp()


def _at(record: Dict[str, Any], key: str, started: Optional[float]) -> Optional[float]:
    """healthy_at / failed_at: seconds since the start (the launcher's form) or an ISO time."""
    value = record.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = _number(value)
        return None if started is None or seconds is None else started + float(seconds)
    return _epoch(value)


# a record's number that no launch can hold (a damaged record: 1e308 MiB) is no sample; the bound
# keeps every product below (MiB to bytes) a finite float
_NUMBER_MAX = 1e15


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    # an int is compared as it is (a float() of a 400-digit int would raise)
    return value if abs(value) <= _NUMBER_MAX and math.isfinite(value) else None


def launch_samples(
    engine: str, record: Dict[str, Any], kept: List[Dict[str, Any]]
) -> List[Tuple[str, Dict[str, Any], float]]:
    labels = {"engine": engine}
    out: List[Tuple[str, Dict[str, Any], float]] = []
    started = _epoch(record.get("started_at"))
    healthy = _at(record, "healthy_at", started)
    failed = _at(record, "failed_at", started)
    if started is not None:
        out.append(("uma_vllm_launch_started_timestamp_seconds", labels, started))
        end = healthy if healthy is not None else failed
        if end is not None:
            out.append(("uma_vllm_launch_duration_seconds", labels, round(max(0.0, end - started), 3)))
    out.append(("uma_vllm_launch_healthy", labels, 1 if healthy is not None else 0))
    out.append(("uma_vllm_launch_loading", labels, 1 if healthy is None and failed is None else 0))
    exit_code = _number(record.get("exit_code"))
    if failed is not None and exit_code is not None:
        out.append(("uma_vllm_launch_exit_code", labels, exit_code))
    kv = _number(record.get("kv_alloc_t"))
    if kv is not None:
        out.append(("uma_vllm_launch_kv_alloc_seconds", labels, kv))
    peak = _number(record.get("page_cache_peak_mib"))
    if peak is not None:
        out.append(("uma_vllm_launch_page_cache_peak_bytes", labels, int(peak * MIB)))
    out.append(("uma_vllm_launch_records", labels, len(kept)))
    out.append(("uma_vllm_launch_failed_records", labels, sum(1 for r in kept if r.get("failed_at") is not None)))
    return out


def guard_samples(engine: str, status: Dict[str, Any]) -> List[Tuple[str, Dict[str, Any], float]]:
    labels = {"engine": engine}
    out: List[Tuple[str, Dict[str, Any], float]] = [
        ("uma_vllm_guard_running", labels, 1 if status.get("state") == "running" else 0)
    ]
    for key, name, scale in (
        ("evictions", "uma_vllm_guard_evictions_total", 1),
        ("evicted_bytes", "uma_vllm_guard_evicted_bytes_total", 1),
        ("peak_cache_mib", "uma_vllm_guard_peak_cache_bytes", MIB),
        ("cpu_seconds", "uma_vllm_guard_cpu_seconds_total", 1),
    ):
        value = _number(status.get(key))
        if value is not None:
            out.append((name, labels, int(value * scale) if scale != 1 else value))
    return out


def parse_sysctl_file(text: str) -> Dict[str, str]:
    values: Dict[str, str] = {}
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped[0] in "#;":
            continue
        key, sep, value = stripped.partition("=")
        if sep:
            values[key.strip().lstrip("-").replace("/", ".")] = " ".join(value.split())
    return values


def sysctl_samples(file_text: Optional[str], live: Dict[str, Optional[str]]) -> List[Tuple[str, Dict[str, Any], float]]:
    out: List[Tuple[str, Dict[str, Any], float]] = []
    for key, value in sorted(live.items()):
        if value is None:
            continue
        try:
            number = float(value.split()[0])
        except (ValueError, IndexError):
            continue
        out.append(("uma_vllm_sysctl_value", {"key": key}, number))
        if key == "vm.min_free_kbytes":
            out.append(("uma_vllm_min_free_kbytes", {}, number))
    if file_text is None:
        return out
    wanted = parse_sysctl_file(file_text)
    for key, value in sorted(wanted.items()):
        actual = live.get(key)
        out.append(("uma_vllm_sysctl_drift", {"key": key}, 0 if actual is not None and actual == value else 1))
    fp = parse_fingerprint(file_text)
    if fp is not None:
        out.append(("uma_vllm_sysctl_file_edited", {}, 0 if fp["intact"] else 1))
    return out


def read_live_sysctls(proc_root: str, keys: Iterable[str]) -> Dict[str, Optional[str]]:
    live: Dict[str, Optional[str]] = {}
    for key in keys:
        try:
            text = read_text(os.path.join(proc_root, "sys", *key.split(".")))
        except OSError:
            text = None
        live[key] = " ".join(text.split()) if text is not None else None
    return live


def _kept_records(engine_dir: str) -> List[Dict[str, Any]]:
    records = []
    try:
        names = sorted(n for n in os.listdir(engine_dir) if n != "latest")
    except OSError:
        return records
    for name in names:
        record = read_others_record(os.path.join(engine_dir, name, "launch.json"), dict, prog=PROG)
        if isinstance(record, dict):
            records.append(record)
    return records


def collect(
    state_dir: str = STATE_DIR,
    run_dir: str = RUN_DIR,
    sysctl_file: str = "/etc/sysctl.d/90-vllm.conf",
    proc_root: str = "/proc",
    sysctl_keys: Iterable[str] = DEFAULT_SYSCTL_KEYS,
    now: Optional[float] = None,
) -> List[Tuple[str, Dict[str, Any], float]]:
    """Every sample of the textfile, read from the node's files."""
    out: List[Tuple[str, Dict[str, Any], float]] = []
    ok: Dict[str, int] = {}
    launches = os.path.join(state_dir, "launches")
    engines: List[str] = []
    try:
        engines = sorted(e for e in os.listdir(launches) if os.path.isdir(os.path.join(launches, e)))
        ok["launches"] = 1
    except OSError:
        ok["launches"] = 0
    guards_seen = set()
    for engine in engines:
        engine_dir = os.path.join(launches, engine)
        record = read_others_record(os.path.join(engine_dir, "latest", "launch.json"), dict, prog=PROG)
        kept = _kept_records(engine_dir)
        if not isinstance(record, dict):
            record = kept[-1] if kept else None
        if record is None:
            continue
        out += launch_samples(engine, record, kept)
        status = read_others_record(os.path.join(run_dir, "guard-%s.json" % engine), dict, prog=PROG)
        if not isinstance(status, dict):
            status = record.get("guard_status") if isinstance(record.get("guard_status"), dict) else None
        if status:
            out += guard_samples(engine, status)
            guards_seen.add(engine)
    try:
        names = sorted(os.listdir(run_dir))
    except OSError:
        names = []
    for name in names:  # a guard running for an engine with no launch record yet
        if name.startswith("guard-") and name.endswith(".json"):
            engine = name[len("guard-") : -len(".json")]
            status = read_others_record(os.path.join(run_dir, name), dict, prog=PROG)
            if engine not in guards_seen and isinstance(status, dict):
                out += guard_samples(engine, status)
    try:
        file_text = read_text(sysctl_file)
        ok["sysctl_file"] = 0 if file_text is None else 1
    except OSError:
        file_text = None
        ok["sysctl_file"] = 0
    keys = list(sysctl_keys)
    if file_text:
        keys += [k for k in parse_sysctl_file(file_text) if k not in keys]
    live = read_live_sysctls(proc_root, keys)
    ok["sysctl_live"] = 1 if any(v is not None for v in live.values()) else 0
    out += sysctl_samples(file_text, live)
    try:
        mem = read_meminfo(proc_root)
        ok["meminfo"] = 1
    except OSError:
        mem = {}
        ok["meminfo"] = 0
    for key, name in (
        ("MemTotal", "uma_vllm_node_mem_total_bytes"),
        ("MemAvailable", "uma_vllm_node_mem_available_bytes"),
    ):
        if key in mem:
            out.append((name, {}, mem[key]))
    if "Cached" in mem:
        out.append(("uma_vllm_node_page_cache_bytes", {}, mem["Cached"]))
        out.append(("uma_vllm_node_page_cache_unmapped_bytes", {}, max(0, mem["Cached"] - mem.get("Mapped", 0))))
    out += [("uma_vllm_textfile_source_ok", {"source": s}, v) for s, v in sorted(ok.items())]
    out.append(("uma_vllm_textfile_timestamp_seconds", {}, round(time.time() if now is None else now, 3)))
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="uma_metrics.py", description="Write uma.vllm metrics for node-exporter's textfile collector."
    )
    p.add_argument(
        "--output", required=True, help="the .prom file, e.g. /var/lib/prometheus/node-exporter/uma_vllm.prom"
    )
    p.add_argument("--state-dir", default=STATE_DIR)
    p.add_argument("--run-dir", default=RUN_DIR)
    p.add_argument("--sysctl-file", default="/etc/sysctl.d/90-vllm.conf")
    p.add_argument("--proc-root", default="/proc")
    p.add_argument("--sysctl-key", action="append", dest="sysctl_keys", help="a vm sysctl to export (repeatable)")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.output.endswith(".prom"):
        sys.stderr.write(
            "uma_metrics.py: --output %s must end in .prom (node-exporter reads only those)\n" % args.output
        )
        return 2
    text = render(
        collect(args.state_dir, args.run_dir, args.sysctl_file, args.proc_root, args.sysctl_keys or DEFAULT_SYSCTL_KEYS)
    )
    try:
        node_write(args.output, text, 0o644)
    except OSError as err:
        sys.stderr.write("uma_metrics.py: cannot write %s: %s\n" % (args.output, err.strerror or err))
        return 1
    return 0
