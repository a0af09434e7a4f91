# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""uma.vllm.oom_diagnose as Ansible runs it: reads a node laid out on disk, classifies, refuses bad input."""

from __future__ import annotations

import http.server
import json
import os
import pathlib
import signal
import sys
import threading
import xml.etree.ElementTree as ET

import pytest

from ansible_collections.uma.vllm.plugins.modules import oom_diagnose

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "module_utils"))
from test_diagnose import CASES, build_evidence

GIB = 1024**3


def lay_out(tmp_path, case):
    """Write a case's evidence as the files the module reads on a node; return the module args."""
    evidence = build_evidence(case)
    launch = evidence.get("launch")
    engine = (launch or {}).get("engine") or "engine0"
    proc = tmp_path / "proc"
    (proc / "sys" / "vm").mkdir(parents=True)
    total_kb = int(evidence.get("meminfo", {}).get("MemTotal", 119.7 * GIB)) // 1024
    (proc / "meminfo").write_text("MemTotal:       %d kB\nMemAvailable:   %d kB\n" % (total_kb, total_kb // 2))
    for key, value in (evidence.get("sysctl") or {"vm.min_free_kbytes": "67584"}).items():
        (proc / "sys" / "vm" / key.split(".", 1)[1]).write_text("%s\n" % value)
    state = tmp_path / "state"
    journal_dir = tmp_path / "journal"
    journal_dir.mkdir()
    args = {
        "proc_root": str(proc),
        "state_dir": str(state),
        "run_dir": str(tmp_path / "run"),
        "journal_dir": str(journal_dir),
        "kernel_log_file": str(tmp_path / "dmesg.txt"),
        "report_host": "node1",
    }
    (tmp_path / "dmesg.txt").write_text(evidence.get("dmesg") or "")
    if launch or evidence.get("journal"):
        args["engines"] = [engine]
        (journal_dir / ("%s.log" % engine)).write_text(evidence.get("journal") or "")
    if launch:
        stamp = state / "launches" / engine / "20260101T000000Z"
        stamp.mkdir(parents=True)
        (stamp / "launch.json").write_text(json.dumps(launch))
        (stamp / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in evidence.get("samples") or []))
        os.symlink(stamp.name, str(stamp.parent / "latest"))
    for i, other in enumerate(evidence.get("other_launches") or []):
        d = state / "launches" / other["engine"] / ("2026010%dT000000Z" % i)
        d.mkdir(parents=True)
        (d / "launch.json").write_text(json.dumps(other))
    if evidence.get("metrics"):
        args["metrics_file"] = evidence["metrics"]
    return args, engine


@pytest.fixture(scope="module")
def metrics_server():
    """A local /metrics endpoint serving whatever text the test puts in ``state['text']``."""
    state = {"text": ""}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = state["text"].encode()
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state["url"] = "http://127.0.0.1:%d/metrics" % server.server_address[1]
    yield state
    server.shutdown()


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_every_table_case_read_from_disk(run_module, tmp_path, metrics_server, case):
    args, engine = lay_out(tmp_path, case)
    text = args.pop("metrics_file", None)
    metrics_server["text"] = text or ""
    if text:
        args.setdefault("engines", [engine])
        args["metrics_urls"] = {engine: metrics_server["url"]}
    failed, result = run_module(oom_diagnose, args)
    assert not failed, result.get("msg")
    assert result["changed"] is False
    assert result["class"] == case["expect"], (result["diagnoses"][0]["evidence"], result["sources"])
    assert result["report"].startswith("# OOM diagnosis: node1")


def test_check_mode_gives_the_same_answer(run_module, tmp_path):
    case = next(c for c in CASES if c["name"] == "two_node_sysmem_oom_at_kv_alloc")
    args, _unused = lay_out(tmp_path, case)
    _unused, normal = run_module(oom_diagnose, args)
    failed, checked = run_module(oom_diagnose, args, check_mode=True)
    assert not failed and checked["changed"] is False
    assert checked["diagnoses"] == normal["diagnoses"]


def test_timeline_svg_and_report_link(run_module, tmp_path):
    case = next(c for c in CASES if c["name"] == "prefill_burst_cuda_oom_while_queue_builds")
    args, engine = lay_out(tmp_path, case)
    launch_dir = pathlib.Path(args["state_dir"], "launches", engine, "latest")
    rows = [
        {"t": t, "MemAvailable": (100 - t) * GIB, "Cached": t * GIB / 2, "Mapped": GIB, "AnonPages": t * GIB}
        for t in range(90)
    ]
    (launch_dir / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    failed, result = run_module(oom_diagnose, args)
    assert not failed
    (timeline,) = result["timelines"]
    assert timeline["file"] == "node1-qwen.svg" and "![memory timeline](node1-qwen.svg)" in result["report"]
    root = ET.fromstring(timeline["svg"].encode())
    ns = {"s": "http://www.w3.org/2000/svg"}
    marks = {m.get("data-t") for m in root.findall("s:line[@class='mark']", ns)}
    assert marks == {"62", "100"}  # KV allocation at 62 s, healthy 100 s after the start


def test_missing_sources_are_reported_not_fatal(run_module, tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "meminfo").write_text("MemTotal: 1000 kB\n")
    failed, result = run_module(
        oom_diagnose,
        {
            "proc_root": str(proc),
            "state_dir": str(tmp_path / "nothing"),
            "engines": ["ghost"],
            "journal_command": ["/nonexistent/journalctl", "-u", "uma-vllm@{engine}.service"],
            "kernel_commands": [["/nonexistent/dmesg"], ["sh", "-c", "exit 3"], ["sh", "-c", "echo '[  1.0] hello'"]],
            "metrics_urls": {"ghost": "http://127.0.0.1:9/metrics"},
            "metrics_timeout": 1,
        },
    )
    assert not failed
    assert result["class"] == "none"
    assert result["sources"]["journal:ghost"] == "command not found: /nonexistent/journalctl"
    assert result["sources"]["kernel"] == "sh -c: 1 lines"  # the third command answered
    assert "launch.json" in result["sources"]["launch:ghost"]
    assert result["sources"]["metrics:ghost"].startswith("http://127.0.0.1:9/metrics: ")


def test_no_engine_gives_one_node_level_diagnosis_from_the_kernel_log(run_module, tmp_path):
    case = next(c for c in CASES if c["name"] == "uvm_phys_mem_allocate_with_file_pages_in_oom_report")
    args, _unused = lay_out(tmp_path, dict(case, journal=""))
    args.pop("engines", None)
    failed, result = run_module(oom_diagnose, args)
    assert not failed
    assert [d["engine"] for d in result["diagnoses"]] == [None]
    assert result["timelines"] == []
    assert result["class"] == "page_cache_starvation"


@pytest.mark.parametrize(
    "args,option",
    [
        ({"cache_fraction": "lots"}, "cache_fraction"),
        ({"cache_fraction": 2}, "cache_fraction"),
        ({"kv_usage_high": -0.1}, "kv_usage_high"),
        ({"lines": 5}, "lines"),
        ({"lines": "many"}, "lines"),
        ({"metrics_timeout": 0}, "metrics_timeout"),
        ({"engines": ["../etc"]}, "engines"),
        ({"metrics_urls": {"a": "ftp://x/metrics"}}, "metrics_urls"),
    ],
)
def test_refusals_name_the_option_and_the_fix(run_module, tmp_path, args, option):
    failed, result = run_module(oom_diagnose, dict(args, state_dir=str(tmp_path)))
    assert failed
    assert result["msg"].startswith("option '%s' = " % option)
    assert ". Give" in result["msg"]


# --------------------------------------------------------------------------
# the engine watchdog's records (tests/unit/fixtures/watchdog)

WATCHDOG_FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "watchdog")


def _node_with_watchdog(tmp_path, engine, case=None, state=None, events=None):
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "meminfo").write_text("MemTotal: 25165824 kB\nMemAvailable: 20000000 kB\n")
    base = tmp_path / "state" / "watchdog" / engine
    base.mkdir(parents=True)
    for name, given in (("state.json", state), ("events.json", events)):
        raw = given
        if case is not None:
            with open(os.path.join(WATCHDOG_FIXTURES, case, name), "rb") as handle:
                raw = handle.read()
        if raw is not None:
            (base / name).write_bytes(raw)
    return {
        "proc_root": str(proc),
        "state_dir": str(tmp_path / "state"),
        "run_dir": str(tmp_path / "run"),
        "journal_dir": str(tmp_path),
        "kernel_log_file": str(tmp_path / "dmesg.txt"),
        "report_host": "ai2",
    }


def test_watchdog_records_are_found_read_and_reported(run_module, tmp_path):
    args = _node_with_watchdog(tmp_path, "never", case="gave_up")
    failed, result = run_module(oom_diagnose, args)  # no engines given: found through the watchdog's directory
    assert not failed, result.get("msg")
    (diag,) = result["diagnoses"]
    assert diag["engine"] == "never" and diag["watchdog"]["gave_up"] is True
    assert diag["watchdog"]["restarts"] == 1 and diag["watchdog"]["counts"]["wedges"] == 2
    assert result["sources"]["watchdog:never"].endswith("state.json phase gave_up, events.json 3 entries")
    assert "## Engine watchdog" in result["report"] and "GAVE UP" in result["report"]
    assert "kind start_timeout" in result["report"]


def test_watchdog_floor_restart_in_the_report(run_module, tmp_path):
    args = _node_with_watchdog(tmp_path, "tiny", case="floor_restart")
    failed, result = run_module(oom_diagnose, dict(args, engines=["tiny"]))
    assert not failed
    wd = result["diagnoses"][0]["watchdog"]
    assert (wd["floor_restarts"], wd["evictions"]) == (1, 1)
    assert "restarts (1 for memory), 1 evictions" in result["report"]
    assert "MemAvailable 600 MiB (warning floor 1.38 GiB, critical floor 704 MiB)" in result["report"]


@pytest.mark.parametrize(
    "state, events, said",
    [
        (b"{not json", b"[]", "state.json not valid JSON"),
        (b"[1, 2]", b"\xff\xfe\x00garbage", "state.json not a JSON object (list)"),
        (None, b'{"action": "restart"}', "state.json missing, events.json not a JSON list (dict)"),
        (None, None, "state.json missing, events.json missing"),
    ],
)
def test_missing_or_garbled_watchdog_records_are_never_a_failure(run_module, tmp_path, state, events, said):
    args = _node_with_watchdog(tmp_path, "tiny", state=state, events=events)
    failed, result = run_module(oom_diagnose, dict(args, engines=["tiny"]))
    assert not failed, result.get("msg")
    assert said in result["sources"]["watchdog:tiny"]
    assert "Traceback" not in json.dumps(result)


@pytest.mark.parametrize(
    "damage, said",
    [
        ("fifo", "is not a regular file (a special file)"),
        ("nan", "is not valid JSON"),
        ("1e400", "is not valid JSON"),
        ("list", "holds a JSON list, not a JSON object"),
    ],
)
def test_a_damaged_launch_record_is_named_and_left_in_place(run_module, tmp_path, damage, said):
    """Issue 36 item 4: the launch record is read through the node programs' one record reader -- a
    FIFO is not opened (it hung the module), NaN and 1e400 are not taken as numbers, and the record
    stays where it is (diagnosis reads; it does not set aside)."""
    case = next(c for c in CASES if build_evidence(c).get("launch"))
    args, engine = lay_out(tmp_path, case)
    record = tmp_path / "state" / "launches" / engine / "20260101T000000Z" / "launch.json"
    record.unlink()
    if damage == "fifo":
        os.mkfifo(str(record))
    else:
        record.write_text({"nan": '{"peak": NaN}', "1e400": '{"peak": 1e400}', "list": "[1, 2]"}[damage])
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail("the module hung on the launch record (%s)" % damage))
    signal.alarm(30)
    try:
        failed, result = run_module(oom_diagnose, dict(args, engines=[engine]))
    finally:
        signal.alarm(0)
    assert not failed, result.get("msg")
    source = result["sources"]["launch:%s" % engine]
    assert "20260101T000000Z/launch.json: " + said in source, source  # the file, then its problem
    assert sorted(os.listdir(str(record.parent))) == ["launch.json", "samples.jsonl"]  # nothing set aside
