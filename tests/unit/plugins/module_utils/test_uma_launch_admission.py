# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The launcher's admission check (issue 14 item 4) against a meminfo file that changes."""

from __future__ import annotations

import io

import node_helpers
import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.node.launch import program as uma_launch

GIB = 1 << 30


def meminfo_text(available):
    return "MemTotal:       %d kB\nMemFree:        %d kB\nMemAvailable:   %d kB\n" % (
        128 * GIB // 1024,
        available // 1024,
        available // 1024,
    )


def write_meminfo(root, available):
    (root / "meminfo").write_text(meminfo_text(available))


def make(tmp_path, available, plan=None, **extra):
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "model" / "model.safetensors").write_bytes(b"\0" * 4096)
    config = node_helpers.launch_config(tmp_path, meminfo_text(available), plan=plan, **extra)
    return uma_launch.Launch(config, uma_launch.Log("e1", out=io.StringIO())), tmp_path / "proc"


PLAN = {"requested_memory_bytes": 40 * GIB, "ranks_per_node": 1}


def test_admitted_when_memavailable_covers_the_request(tmp_path):
    launch, _unused = make(tmp_path, 50 * GIB, PLAN)
    assert launch.admit(sleep=lambda s: pytest.fail("no wait expected"))
    adm = launch.record["admission"]
    assert adm["admitted"] and adm["need_bytes"] == 40 * GIB and adm["short_bytes"] == 0


def test_every_rank_on_the_node_counts(tmp_path):
    launch, _unused = make(
        tmp_path, 50 * GIB, {"requested_memory_bytes": 40 * GIB, "ranks_per_node": 2}, admission_wait_s=0
    )
    assert not launch.admit()
    assert launch.record["admission"]["need_bytes"] == 80 * GIB
    assert "x 2 rank(s)" in launch.record["admission"]["need_source"]


def test_waits_for_memory_another_load_frees(tmp_path):
    launch, proc = make(tmp_path, 30 * GIB, PLAN, admission_wait_s=30)
    calls = []

    def sleep(seconds):
        calls.append(seconds)
        if len(calls) == 3:  # the other engine's load ends, its page cache goes
            write_meminfo(proc, 45 * GIB)

    assert launch.admit(sleep=sleep)
    assert len(calls) == 3
    assert launch.record["admission"]["mem_available_first_bytes"] == 30 * GIB
    assert launch.record["admission"]["evicted_bytes"] >= 0


def test_refused_with_the_numbers_and_the_fix(tmp_path):
    launch, _unused = make(tmp_path, 30 * GIB, PLAN, admission_wait_s=0.2)
    assert not launch.admit(sleep=lambda s: None)
    adm = launch.record["admission"]
    assert not adm["admitted"] and adm["short_bytes"] == 10 * GIB
    assert "MemAvailable 30.00 GiB is below the plan's startup request 40.00 GiB" in adm["reason"]
    assert "short by 10.00 GiB" in adm["reason"] and "Fix: free 10.00 GiB" in adm["reason"]
    assert launch.log.steps[-1]["name"] == "admission-refused"


def test_run_exits_69_before_the_engine(tmp_path):
    launch, _unused = make(tmp_path, 30 * GIB, PLAN, admission_wait_s=0)
    launch.config["guard"] = False
    code = launch.run()
    assert code == uma_launch.EXIT_ADMISSION == 75
    assert launch.engine is None
    assert launch.record["exit_code"] == 75 and launch.record["failed_at"] is not None
    assert not launch.lock.held


def test_no_plan_or_off_is_not_checked(tmp_path):
    launch, _unused = make(tmp_path, 1 * GIB, None)
    assert launch.admit()
    assert launch.log.steps[-1]["checked"] is False
    launch, _unused = make(tmp_path, 1 * GIB, PLAN, admission=False)
    assert launch.admit()


def test_explicit_request_wins_over_the_plan(tmp_path):
    launch, _unused = make(tmp_path, 50 * GIB, PLAN, admission_request_bytes=60 * GIB, admission_wait_s=0)
    assert not launch.admit()
    assert launch.record["admission"]["need_source"] == "admission_request_bytes"


@pytest.mark.parametrize(
    "key, value",
    [("admission_wait_s", -1), ("admission_wait_s", True), ("admission_request_bytes", 0), ("admission", "yes")],
)
def test_bad_admission_settings_are_refused(tmp_path, key, value):
    with pytest.raises(UmaError) as err:
        make(tmp_path, GIB, PLAN, **{key: value})
    assert "option '%s'" % key in err.value.message
