# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node-exporter textfile generator: format, every source, missing sources, atomic write."""

from __future__ import annotations

import json
import os
import re

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.base import common as _common
from ansible_collections.uma.vllm.plugins.module_utils.node.base import metrics as m

MIB = 1 << 20


def parse(text):
    """{(name, frozenset(labels)): value} of a rendered textfile; also checks HELP/TYPE precede samples."""
    seen_type = set()
    values = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            seen_type.add(line.split()[2])
            continue
        if line.startswith("#"):
            continue
        match = re.match(r"^([a-z_:]+)(?:\{(.*)\})? (\S+)$", line)
        assert match, line
        assert match.group(1) in seen_type, "sample before its TYPE: %s" % line
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
        values[(match.group(1), labels)] = float(match.group(3))
    return values


@pytest.fixture
def node(tmp_path):
    state = tmp_path / "state"
    run = tmp_path / "run"
    proc = tmp_path / "proc"
    (proc / "sys" / "vm").mkdir(parents=True)
    run.mkdir()
    (proc / "meminfo").write_text(
        "MemTotal: 125000000 kB\nMemAvailable: 90000000 kB\nCached: 30000000 kB\nMapped: 1000000 kB\n"
    )
    for key, value in {
        "min_free_kbytes": 3145728,
        "vfs_cache_pressure": 100,
        "dirty_ratio": 5,
        "dirty_background_ratio": 2,
    }.items():
        (proc / "sys" / "vm" / key).write_text("%d\n" % value)
    body = (
        "vm.dirty_background_ratio = 2\nvm.dirty_ratio = 5\nvm.min_free_kbytes = 3145728\nvm.vfs_cache_pressure = 200\n"
    )
    sysctl = tmp_path / "90-vllm.conf"
    sysctl.write_text(_common.managed_header("test", body) + body)

    def launch(engine, stamp, **record):
        d = state / "launches" / engine / stamp
        d.mkdir(parents=True)
        (d / "launch.json").write_text(json.dumps(dict({"engine": engine}, **record)))
        latest = d.parent / "latest"
        if latest.is_symlink():
            latest.unlink()
        os.symlink(stamp, str(latest))

    launch(
        "qwen",
        "20261122T010000Z",
        started_at="2026-11-22T01:00:00+00:00",
        failed_at="2026-11-22T01:01:10+00:00",
        exit_code=1,
    )
    launch(
        "qwen",
        "20261122T011000Z",
        started_at="2026-11-22T01:10:00Z",
        healthy_at="2026-11-22T01:11:32.5Z",
        kv_alloc_t=61.2,
        page_cache_peak_mib=2048,
        guard_status={
            "name": "qwen",
            "mode": "adaptive",
            "state": "stopped",
            "evictions": 12,
            "evicted_bytes": 5 * MIB,
            "peak_cache_mib": 2048.5,
            "cpu_seconds": 0.8,
        },
    )
    launch("embed", "20261122T012000Z", started_at="2026-11-22T01:20:00+00:00")
    (run / "guard-embed.json").write_text(
        json.dumps({"name": "embed", "state": "running", "evictions": 3, "peak_cache_mib": 100})
    )
    return {"state_dir": str(state), "run_dir": str(run), "sysctl_file": str(sysctl), "proc_root": str(proc)}


def test_every_source_becomes_its_metrics(node):
    values = parse(m.render(m.collect(now=1000.0, **node)))
    q, e = frozenset({("engine", "qwen")}), frozenset({("engine", "embed")})
    expected = {
        ("uma_vllm_launch_duration_seconds", q): 92.5,
        ("uma_vllm_launch_healthy", q): 1,
        ("uma_vllm_launch_loading", q): 0,
        ("uma_vllm_launch_kv_alloc_seconds", q): 61.2,
        ("uma_vllm_launch_page_cache_peak_bytes", q): 2048 * MIB,
        ("uma_vllm_launch_records", q): 2,
        ("uma_vllm_launch_failed_records", q): 1,
        ("uma_vllm_guard_running", q): 0,
        ("uma_vllm_guard_evictions_total", q): 12,
        ("uma_vllm_guard_evicted_bytes_total", q): 5 * MIB,
        ("uma_vllm_guard_peak_cache_bytes", q): int(2048.5 * MIB),
        ("uma_vllm_guard_cpu_seconds_total", q): 0.8,
        ("uma_vllm_launch_loading", e): 1,
        ("uma_vllm_launch_healthy", e): 0,
        ("uma_vllm_guard_running", e): 1,  # the running guard's file wins over the record
        ("uma_vllm_guard_evictions_total", e): 3,
        ("uma_vllm_min_free_kbytes", frozenset()): 3145728,
        ("uma_vllm_sysctl_drift", frozenset({("key", "vm.vfs_cache_pressure")})): 1,
        ("uma_vllm_sysctl_drift", frozenset({("key", "vm.min_free_kbytes")})): 0,
        ("uma_vllm_sysctl_file_edited", frozenset()): 0,
        ("uma_vllm_node_page_cache_unmapped_bytes", frozenset()): 29000000 * 1024,
        ("uma_vllm_textfile_source_ok", frozenset({("source", "sysctl_file")})): 1,
        ("uma_vllm_textfile_timestamp_seconds", frozenset()): 1000,
    }
    for key, value in expected.items():
        assert values.get(key) == pytest.approx(value), key
    assert ("uma_vllm_launch_exit_code", q) not in values  # the latest launch did not fail


def test_hand_edited_sysctl_file_is_flagged(node):
    text = open(node["sysctl_file"]).read().replace("= 5", "= 9")
    open(node["sysctl_file"], "w").write(text)
    values = parse(m.render(m.collect(**node)))
    assert values[("uma_vllm_sysctl_file_edited", frozenset())] == 1
    assert values[("uma_vllm_sysctl_drift", frozenset({("key", "vm.dirty_ratio")}))] == 1


def test_missing_sources_leave_metrics_out_and_say_so(tmp_path):
    values = parse(
        m.render(m.collect(str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "c"), str(tmp_path / "d")))
    )
    ok = {dict(k[1])["source"]: v for k, v in values.items() if k[0] == "uma_vllm_textfile_source_ok"}
    assert ok == {"launches": 0, "sysctl_file": 0, "sysctl_live": 0, "meminfo": 0}
    assert not [k for k in values if k[0].startswith(("uma_vllm_launch", "uma_vllm_guard", "uma_vllm_sysctl"))]


@pytest.mark.parametrize(
    "value,text", [(True, "1"), (3, "3"), (2.0, "2"), (0.25, "0.25"), (float("nan"), "NaN"), (float("inf"), "+Inf")]
)
def test_format_value(value, text):
    assert m.format_value(value) == text


def test_label_values_are_escaped_and_help_type_come_once():
    text = m.render(
        [
            ("uma_vllm_launch_healthy", {"engine": 'we"ird\\name\nx'}, 1),
            ("uma_vllm_launch_healthy", {"engine": "a"}, 0),
        ]
    )
    lines = text.splitlines()
    assert lines[0].startswith("# HELP uma_vllm_launch_healthy ") and lines[1] == "# TYPE uma_vllm_launch_healthy gauge"
    assert lines[2] == 'uma_vllm_launch_healthy{engine="a"} 0'
    assert lines[3] == 'uma_vllm_launch_healthy{engine="we\\"ird\\\\name\\nx"} 1'
    with pytest.raises(ValueError):
        m.render([("not_ours", {}, 1)])


def test_main_writes_atomically_and_refuses_a_name_node_exporter_ignores(node, tmp_path, capsys):
    out = tmp_path / "textfile" / "uma_vllm.prom"
    argv = [
        "--output",
        str(out),
        "--state-dir",
        node["state_dir"],
        "--run-dir",
        node["run_dir"],
        "--sysctl-file",
        node["sysctl_file"],
        "--proc-root",
        node["proc_root"],
    ]
    assert m.main(argv) == 0
    assert "uma_vllm_launch_healthy" in out.read_text()
    assert os.listdir(str(out.parent)) == ["uma_vllm.prom"]  # no temporary file left
    assert m.main(["--output", str(tmp_path / "x.txt")]) == 2
    assert "must end in .prom" in capsys.readouterr().err


def test_main_reports_an_unwritable_output(node, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert m.main(["--output", str(blocker / "uma_vllm.prom"), "--proc-root", node["proc_root"]]) == 1
    assert "cannot write" in capsys.readouterr().err


def test_launcher_records_with_relative_times(tmp_path):
    d = tmp_path / "state" / "launches" / "e" / "20261122T000000Z"
    d.mkdir(parents=True)
    record = {
        "engine": "e",
        "started_at": "2026-11-22T00:00:00Z",
        "healthy_at": None,
        "failed_at": 41.5,
        "exit_code": 1,
    }
    (d / "launch.json").write_text(json.dumps(record))
    values = parse(m.render(m.collect(str(tmp_path / "state"), str(tmp_path / "run"), "/nonexistent", str(tmp_path))))
    e = frozenset({("engine", "e")})
    assert values[("uma_vllm_launch_duration_seconds", e)] == 41.5
    assert values[("uma_vllm_launch_healthy", e)] == 0 and values[("uma_vllm_launch_loading", e)] == 0
    assert values[("uma_vllm_launch_exit_code", e)] == 1
    assert values[("uma_vllm_launch_failed_records", e)] == 1


# issue 36 item 4: a launch record's number that no launch can hold (1e308 MiB of page cache) was an
# OverflowError at every run of the metrics timer; now no sample of it, and the others still come
@pytest.mark.parametrize("key", ["page_cache_peak_mib", "kv_alloc_t", "exit_code", "failed_at"])
@pytest.mark.parametrize("value", [1e308, -1e308, 10**40, 10**400], ids=["1e308", "-1e308", "10^40", "10^400"])
def test_a_number_no_launch_can_hold_is_no_sample(key, value):
    good = {"state": "failed", "started_at": "2026-11-29T08:00:00Z", "failed_at": 30.5, "exit_code": 69,
            "kv_alloc_t": 2.5, "page_cache_peak_mib": 100}  # fmt: skip
    metric = {"page_cache_peak_mib": "uma_vllm_launch_page_cache_peak_bytes",
              "kv_alloc_t": "uma_vllm_launch_kv_alloc_seconds", "exit_code": "uma_vllm_launch_exit_code",
              "failed_at": "uma_vllm_launch_duration_seconds"}  # fmt: skip
    assert set(metric.values()) <= {name for name, _labels, _value in m.launch_samples("main", good, [good])}
    record = dict(good, **{key: value})
    names = {name for name, _labels, _value in m.launch_samples("main", record, [record])}
    assert metric[key] not in names
    assert "uma_vllm_launch_records" in names and len(names - {metric[key]}) >= 3
