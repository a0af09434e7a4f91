"""diagnose.yml against real failed launches: the right class, the deciding line, the fix."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET

import pytest

REPORTS = os.environ.get("UMA_DIAGNOSE_REPORTS", "")


def _report():
    with open(os.path.join(REPORTS, "diagnose-node.json"), encoding="utf-8") as handle:
        return json.load(handle)


def _engine(name):
    return next(d for d in _report()["diagnoses"] if d["engine"] == name)


@pytest.mark.parametrize(
    "engine,line,fix",
    [
        ("big", "on kv cache allocation is less than requested memory for kv (64.0 GiB)", "VLLM_CPU_KVCACHE_SPACE"),
        ("long", "To serve at least one request with the model's max seq len (2048)", "--max-model-len"),
    ],
)
def test_each_failed_launch_is_a_startup_oom_with_its_line_and_fix(engine, line, fix):
    found = _engine(engine)
    assert found["class"] == "startup_oom", (found["evidence"], found["others"])
    assert any(line in e for e in found["evidence"]), found["evidence"]
    assert any(fix in f for f in found["fix"]), found["fix"]
    assert found["summary"]["launch_outcome"] == "failed"


def test_the_report_files_are_written():
    md = open(os.path.join(REPORTS, "diagnose-node.md"), encoding="utf-8").read()
    assert md.startswith("# OOM diagnosis: diagnose-node / ")
    assert md.count("Startup OOM: weights + KV cache over the memory budget") == 2
    ns = {"s": "http://www.w3.org/2000/svg"}
    for engine in ("big", "long"):
        root = ET.parse(os.path.join(REPORTS, "diagnose-node-%s.svg" % engine)).getroot()
        assert "![memory timeline](diagnose-node-%s.svg)" % engine in md
        lines = root.findall("s:polyline", ns)
        assert {p.get("data-key") for p in lines} >= {"MemAvailable", "Cached", "Mapped", "AnonPages"}
        assert all(len(p.get("points").split()) > 50 for p in lines)  # the guard sampled the whole load
        marks = {m.get("data-t"): m for m in root.findall("s:line[@class='mark']", ns)}
        record = _engine(engine)["summary"]
        assert len(marks) >= 1  # failed (and KV allocated when the engine got that far)
        if record["kv_alloc_t"] is not None:
            assert "%g" % record["kv_alloc_t"] in marks
        # Samples are aligned to the launch start: no x value left of the plot's origin.
        first = float(lines[0].get("points").split()[0].split(",")[0])
        assert first >= 70 - 0.5


def test_the_launcher_left_a_failed_launch_record(host):
    for engine in ("big", "long"):
        record = json.loads(host.file("/var/lib/uma-vllm/launches/%s/latest/launch.json" % engine).content_string)
        assert record["failed_at"] is not None and record["healthy_at"] is None
