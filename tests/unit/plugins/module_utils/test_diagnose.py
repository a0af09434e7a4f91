# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The OOM classifier against a table of cases modelled on published lines (fixtures/diagnose)."""

from __future__ import annotations

import copy
import glob
import os

import pytest
import yaml

from ansible_collections.uma.vllm.plugins.module_utils.diagnose import core as d
from ansible_collections.uma.vllm.plugins.module_utils.diagnose.parse import flags_from_args

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "diagnose")
GIB = 1024**3


def load_cases():
    cases = []
    for path in sorted(glob.glob(os.path.join(FIXTURES, "*.yml"))):
        with open(path, encoding="utf-8") as handle:
            for case in yaml.safe_load(handle) or []:
                case["_file"] = os.path.basename(path)
                cases.append(case)
    return cases


CASES = load_cases()


def build_evidence(case):
    """A case from the table -> the evidence dict diagnose() takes (GiB shorthands to bytes)."""
    evidence = {
        k: copy.deepcopy(case[k])
        for k in ("dmesg", "journal", "metrics", "sysctl", "other_launches", "boot_time")
        if k in case
    }
    if "meminfo_gib" in case:
        evidence["meminfo"] = {k: int(v * GIB) for k, v in case["meminfo_gib"].items()}
    if "launch" in case:
        launch = copy.deepcopy(case["launch"])
        if "plan_gib" in launch:
            launch["plan"] = {k: int(v * GIB) for k, v in launch.pop("plan_gib").items()}
        evidence["launch"] = launch
    if "samples_gib" in case:
        keys = ("MemAvailable", "Cached", "Mapped", "AnonPages")
        evidence["samples"] = [
            dict({"t": row[0]}, **{k: int(v * GIB) for k, v in zip(keys, row[1:])}) for row in case["samples_gib"]
        ]
    return evidence


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_case_table(case):
    result = d.diagnose(build_evidence(case))
    assert result["class"] == case["expect"], (result["class"], result["evidence"], result["others"])
    assert result["title"] == d.TITLES[case["expect"]]
    assert result["fix"], "every verdict carries a fix"
    if "expect_fix" in case:
        assert any(case["expect_fix"] in line for line in result["fix"]), result["fix"]
    if "expect_evidence" in case:
        assert any(case["expect_evidence"] in line for line in result["evidence"]), result["evidence"]
    if case["expect"] != "none":
        assert result["confidence"] >= 0.6
        assert result["evidence"]


def test_table_covers_every_class_twice():
    counts = {c: 0 for c in d.CLASSES}
    for case in CASES:
        counts[case["expect"]] += 1
    assert all(n >= 2 for n in counts.values()), counts


def test_every_case_cites_a_source_listed_in_the_readme():
    with open(os.path.join(FIXTURES, "README.md"), encoding="utf-8") as handle:
        readme = handle.read()
    for case in CASES:
        assert "`%s`" % case["source"] in readme, case["name"]


def _case(name):
    return next(c for c in CASES if c["name"] == name)


def test_starvation_needs_page_cache_small_cache_makes_it_a_budget_problem():
    case = copy.deepcopy(_case("two_node_sysmem_oom_at_kv_alloc"))
    case["samples_gib"] = [[0.0, 111.0, 4.0, 0.5, 2.1], [127.0, 0.4, 1.2, 0.9, 100.0]]
    del case["launch"]["page_cache_peak_mib"]
    case["launch"]["guard_status"] = {"mode": "adaptive", "evictions": 120}
    result = d.diagnose(build_evidence(case))
    assert result["class"] == "startup_oom"


def test_cache_fraction_setting_moves_the_threshold():
    evidence = build_evidence(_case("cudamemgetinfo_under_reports_with_cache_held"))
    assert d.diagnose(evidence)["class"] == "page_cache_starvation"
    assert d.diagnose(evidence, {"cache_fraction": 0.6})["class"] == "startup_oom"


def test_race_needs_an_overlap_not_just_another_engine():
    case = copy.deepcopy(_case("co_resident_boot_negative_kv_with_overlapping_launch"))
    case["other_launches"] = [case["other_launches"][1]]  # started an hour before, healthy long before
    assert d.diagnose(build_evidence(case))["class"] == "startup_oom"


def test_nv_err_alone_during_failed_start_counts_but_not_during_healthy_one():
    line = _case("healthy_load_with_nv_err_noise_in_dmesg")["dmesg"]
    failed = {
        "dmesg": line,
        "launch": {"engine": "x", "started_at": "2026-09-14T23:16:20+00:00", "failed_at": "2026-09-14T23:17:00+00:00"},
    }
    assert d.diagnose(failed)["class"] == "startup_oom"
    healthy = {"dmesg": line, "launch": dict(failed["launch"], healthy_at="2026-09-14T23:17:00+00:00", failed_at=None)}
    assert d.diagnose(healthy)["class"] == "none"


@pytest.mark.parametrize(
    "text,expected",
    [
        ("14.75 GiB", int(14.75 * GIB)),
        ("140.27 MiB", int(140.27 * 1024**2)),
        ("512 KiB", 512 * 1024),
        ("-0.41 GiB", int(-0.41 * GIB)),
        ("lots", None),
    ],
)
def test_size_to_bytes(text, expected):
    assert d.size_to_bytes(text) == expected


@pytest.mark.parametrize(
    "value,expected",
    [
        ("2026-09-10T08:02:10+00:00", 1789027330.0),
        ("2026-09-10T08:02:10Z", 1789027330.0),
        ("2026-09-10T08:02:10+0000 spark kernel: x", 1789027330.0),
        ("2026-09-10T10:02:10.250000+02:00", 1789027330.25),
        ("2026-09-10T08:02:10,500000+00:00 python (21411): drop_caches: 3", 1789027330.5),
        ("Sep 10 08:02:10 spark", None),
        (None, None),
    ],
)
def test_parse_time(value, expected):
    assert d.parse_time(value) == expected


def test_dmesg_T_time_and_file_pages_in_pages_and_kb():
    k = d.parse_kernel_log(
        "[Sun Aug 30 19:44:09 2026]  active_file:1000 inactive_file:24 isolated_file:0\n"
        "[Sun Aug 30 19:44:09 2026] Node 0 active_anon:1kB active_file:8000kB inactive_file:192kB x\n",
        page_size=4096,
    )
    assert [e["kind"] for e in k["events"]] == ["oom_file_pages", "oom_file_pages"]
    assert k["events"][0]["file_bytes"] == 1024 * 4096
    assert k["events"][1]["file_bytes"] == 8192 * 1024
    assert k["events"][0]["t"] == d.parse_time("2026-08-30T19:44:09+00:00")


def test_journal_runs_split_at_process_end_and_phase_by_health():
    j = d.parse_journal(_case("repeated_oom_after_long_idle_runs")["journal"])
    assert len(j["runs"]) == 3
    assert j["restarts"] == 2
    assert [r["healthy"] for r in j["runs"]] == [True, True, True]
    assert [len(r["killed"]) for r in j["runs"]] == [2, 2, 0]


def test_journal_joins_a_wrapped_pytorch_message():
    text = (
        "torch.OutOfMemoryError: CUDA out of memory.\n"
        "Tried to allocate 20.00 MiB.\n"
        "GPU 0 has a total capacity of 15.51 GiB of which 149.62 MiB is free.\n"
        "Process 1839 has 322.23 MiB memory in use.\n"
        "Of the allocated memory 11.47 GiB is allocated by PyTorch,\n"
        "and 10.27 MiB is reserved by PyTorch but unallocated.\n"
    )
    run = d.parse_journal(text)["runs"][0]
    oom = run["ooms"][0]
    assert oom["kind"] == "cuda_oom"
    assert oom["tried_bytes"] == 20 * 1024**2
    assert oom["reserved_unallocated_bytes"] == int(10.27 * 1024**2)
    assert oom["other_processes"] == [{"pid": 1839, "bytes": int(322.23 * 1024**2)}]


def test_kv_size_line_for_gpu_and_cpu_backends():
    for device in ("GPU", "CPU"):
        run = d.parse_journal(
            "INFO [kv_cache_utils.py:2328] %s KV cache size: 4,096 tokens, " % device
            + "Maximum concurrency for 512 tokens per request: 8.00x"
        )["runs"][0]
        event = run["events"][0]
        assert (event["device"], event["tokens"], event["max_concurrency"]) == (device, 4096, 8.0)


@pytest.mark.parametrize(
    "text,usage,name,hit",
    [
        (
            'vllm:kv_cache_usage_perc{engine="0"} 0.5\n'
            "vllm:prefix_cache_queries_total 10\nvllm:prefix_cache_hits_total 4\n",
            0.5,
            "vllm:kv_cache_usage_perc",
            0.4,
        ),
        (
            "vllm:gpu_cache_usage_perc 0.25\nvllm:gpu_prefix_cache_hit_rate 0.1\n",
            0.25,
            "vllm:gpu_cache_usage_perc",
            0.1,
        ),
        ("# only comments\n", None, None, None),
    ],
)
def test_parse_metrics_old_and_new_names(text, usage, name, hit):
    m = d.parse_metrics(text)
    assert m["kv_usage"] == usage
    assert m["kv_usage_metric"] == name
    assert m["prefix_hit_rate"] == (pytest.approx(hit) if hit is not None else None)


def test_flags_from_argv_both_spellings():
    flags = d.flags_from_argv(
        ["vllm", "--max-model-len=4096", "--max-num-seqs", "8", "--enable-prefix-caching", "--model", "m"]
    )
    assert flags == {"max_model_len": "4096", "max_num_seqs": "8", "enable_prefix_caching": True}
    assert d.flags_from_argv(None) == {}


VLLM_ARGS_LINE = (
    "Nov 26 04:15:17 spark1 vllm[657]: (APIServer pid=657) INFO 11-26 04:15:17 [utils.py:253] non-default args:"
    " {'model_tag': '/models/qwen', 'model': '/models/qwen', 'max_model_len': 32768,"
    " 'gpu_memory_utilization': 0.85, 'kv_cache_memory_bytes': 34359738368, 'enable_prefix_caching': True,"
    " 'compilation_config': {'level': 3}}"
)


def test_flags_from_vllms_own_non_default_args_line():
    """No launch record (an engine this collection did not start): vLLM's own record of its arguments."""
    runs = d.parse_journal(VLLM_ARGS_LINE + "\n")["runs"]
    event = runs[0]["events"][0]
    assert event["kind"] == "engine_args"
    # plain values only: the nested compilation_config is left out
    assert "compilation_config" not in event["args"] and event["args"]["max_model_len"] == 32768
    assert flags_from_args(event["args"]) == {
        "max_model_len": "32768", "gpu_memory_utilization": "0.85", "kv_cache_memory_bytes": "34359738368",
        "enable_prefix_caching": True}  # fmt: skip
    facts = d.gather_facts({"journal": VLLM_ARGS_LINE + "\n"})
    assert facts["flags"]["kv_cache_memory_bytes"] == "34359738368"


@pytest.mark.parametrize(
    "tail",
    [
        "{'model': Path('/m')}",  # a repr that is not a literal: nothing read, no exception
        "{'a': __import__('os').system('true')}",  # never evaluated
        "[1, 2]",  # not a dict
        "{'a': 1" + ", 'b': 2" * 5000 + "}",  # too long
    ],
)
def test_non_default_args_that_are_not_plain_literals_give_no_flags(tail):
    runs = d.parse_journal("x vllm[1]: INFO [utils.py:253] non-default args: %s\n" % tail)["runs"]
    events = [e for r in runs for e in r["events"] if e["kind"] == "engine_args"]
    assert [e["args"] for e in events] in ([{}], [])


def test_the_kernel_names_the_killed_tasks_cgroup():
    text = (
        "[  216.940100] oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,"
        "task_memcg=/system.slice/ssh.service,task=python3,pid=660,uid=0\n"
        "[  216.940496] Out of memory: Killed process 660 (python3) total-vm:1037760kB, anon-rss:961404kB,"
        " file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:1948kB oom_score_adj:0\n"
        "[  217.000000] Out of memory: Killed process 700 (python3) total-vm:1kB, anon-rss:1kB, file-rss:0kB\n"
    )
    killed = [e for e in d.parse_kernel_log(text)["events"] if e["kind"] == "oom_killed"]
    assert killed[0]["memcg"] == "/system.slice/ssh.service" and killed[0]["anon_rss_bytes"] == 961404 * 1024
    assert "memcg" not in killed[1]  # no context line for it: unknown, not guessed


def test_samples_text_skips_bad_lines_and_sorts():
    rows = d.parse_samples('{"t": 2, "Cached": 1}\nnot json\n{"t": 1, "Cached": 2}\n{"x": 1}\n')
    assert [r["t"] for r in rows] == [1, 2]


def test_markdown_report_reads_at_a_glance():
    result = d.diagnose(build_evidence(_case("two_node_sysmem_oom_at_kv_alloc")))
    text = d.render_markdown("ai2", result, timeline_file="ai2.svg")
    lines = text.splitlines()
    assert lines[0] == "# OOM diagnosis: ai2 / dsv4"
    assert "UMA page-cache starvation at load" in lines[2] and "page_cache_starvation" in lines[2]
    assert lines[4] == "## Fix"
    assert "![memory timeline](ai2.svg)" in text
    assert "sysmemAllocResources+0xa8/0x2a0 [nvidia]" in text
    assert "| plan.weights_bytes | %d (74.00 GiB) |" % int(74.0 * GIB) in text
    other = d.render_markdown("spark", d.diagnose(build_evidence(_case("uvm_oom_kill_budget_over_memory_no_cache"))))
    assert "| guard.mode | adaptive |" in other and "| flags.gpu_memory_utilization | 0.99 |" in other
    assert "![memory timeline]" not in other


def test_result_is_json_serialisable():
    import json

    for case in CASES:
        json.dumps(d.diagnose(build_evidence(case)))


@pytest.mark.parametrize(
    "record,key,expected",
    [
        ({"started_at": "2026-09-10T08:02:10Z", "healthy_at": 92.5}, "healthy_at", 1789027330.0 + 92.5),
        ({"started_at": "2026-09-10T08:02:10Z", "failed_at": "2026-09-10T08:03:10+00:00"}, "failed_at", 1789027390.0),
        ({"started_at": "2026-09-10T08:02:10Z", "failed_at": None}, "failed_at", None),
        ({"healthy_at": 5.0}, "healthy_at", None),  # relative time without a start
        ({"started_at": "2026-09-10T08:02:10Z"}, "started_at", 1789027330.0),
        (None, "started_at", None),
    ],
)
def test_record_time_reads_the_launchers_relative_and_iso_times(record, key, expected):
    assert d.record_time(record, key) == expected


def test_journal_runs_split_at_the_launchers_launch_step():
    text = (
        "x vllm-uma-launch[1]: [vllm-uma-launch q] launch t=0.000 engine=q record=/r/1\n"
        "x vllm-uma-launch[1]: ValueError: No available memory for the cache blocks. Try increasing\n"
        "x vllm-uma-launch[9]: [vllm-uma-launch q] launch t=0.000 engine=q record=/r/2\n"
        "x vllm-uma-launch[9]: [vllm-uma-launch q] engine-healthy t=80.100\n"
    )
    runs = d.parse_journal(text)["runs"]
    assert [(len(r["ooms"]), r["healthy"]) for r in runs] == [(1, False), (0, True)]


def test_waiting_for_the_launch_lock_is_not_a_concurrent_start():
    case = copy.deepcopy(_case("lab_launcher_serialized_kv_demand_over_cache"))
    assert d.diagnose(build_evidence(case))["class"] == "startup_oom"
    # Without the launcher's lock step the two launch windows overlap for 206 s: a race.
    case["launch"]["steps"] = [s for s in case["launch"]["steps"] if s["name"] != "lock-acquired"]
    result = d.diagnose(build_evidence(case))
    assert result["class"] == "profiling_race"
    assert any("'big'" in line and "overlapped" in line for line in result["evidence"])


def test_guard_samples_in_unix_time_are_aligned_to_the_launch_start():
    launch = {"started_at": "2026-11-22T02:14:52Z", "steps": [{"name": "launch", "t": 0.0, "at": 1795313692.924}]}
    rows = [{"t": 1795313898.9, "Cached": 1}, {"t": 1795314028.3, "Cached": 2}]
    assert d.launch_epoch(launch) == 1795313692.924
    assert [r["t"] for r in d.align_samples(rows, d.launch_epoch(launch))] == [205.976, 335.376]
    assert [r["t"] for r in d.align_samples(rows, None)] == [0.0, 129.4]
    assert d.align_samples([{"t": 3.0}], 1795313692.924) == [{"t": 3.0}]  # already relative
    assert d.launch_epoch({"started_at": "2026-11-22T02:14:52Z"}) == d.parse_time("2026-11-22T02:14:52Z")
