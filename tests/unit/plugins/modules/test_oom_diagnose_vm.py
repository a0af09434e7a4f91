# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""oom_diagnose on launches captured in the VM lab node (issue 20 item 6): real kernel output.

Each ``tests/unit/fixtures/diagnose/vm-*`` directory holds, verbatim, what
``lab/vm/capture_launch.py`` wrote in the VM guest (its own Debian 6.1 kernel, 3 GiB) for one
launch of the UMA loader (a stand-in for vLLM on a GB10 rank) against fakegb10 (a STAND-IN
for NVIDIA's GB10 driver): the kernel log, the engine unit's journal, /proc/meminfo,
/proc/stat, /proc/vmstat and /proc/buddyinfo before and after. See the directory's README.md.

The files are laid out as the node the module reads (``proc_root``, ``kernel_log_file``,
``journal_dir``) and the real module runs over them, as ``oom_diagnose`` does on a node.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from ansible_collections.uma.vllm.plugins.modules import oom_diagnose

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "diagnose")
ENGINE = "uma-vm"

# fixture directory -> (the class the diagnosis must name, a substring one evidence line must hold)
EXPECT = {
    "vm-healthy-kv512m": ("none", None),
    "vm-kv960m-no-memory": ("startup_oom", "NV_ERR_NO_MEMORY"),
    "vm-hog-oom-kill": ("startup_oom", "Out of memory: Killed process 657 (python3)"),
}
# Lines of an earlier run of the same unit in the same boot (the 960M launch at 04:15:04, pid 539):
# they must not be the evidence for the launch after it.
EARLIER_RUN = ("04:15:04", "[  191.1", "pid=539")
KERNEL_SOURCES = ("kernel-journal.txt", "dmesg.txt")  # journalctl -k -o short-iso; plain dmesg + btime


def fixture(name, *parts):
    return os.path.join(FIXTURES, name, *parts)


def lay_out(tmp_path, name, kernel_source):
    """The captured files where oom_diagnose reads them on a node; returns the module's args."""
    proc = tmp_path / "proc"
    proc.mkdir()
    shutil.copy(fixture(name, "meminfo.after"), str(proc / "meminfo"))
    shutil.copy(fixture(name, "stat.txt"), str(proc / "stat"))
    journal_dir = tmp_path / "journal"
    journal_dir.mkdir()
    shutil.copy(fixture(name, "journal.txt"), str(journal_dir / ("%s.log" % ENGINE)))
    return {
        "proc_root": str(proc),
        "state_dir": str(tmp_path / "state"),
        "run_dir": str(tmp_path / "run"),
        "journal_dir": str(journal_dir),
        "kernel_log_file": fixture(name, kernel_source),
        "engines": [ENGINE],
        "report_host": "uma-vm",
    }


def test_every_vm_fixture_has_an_expectation_and_its_files():
    found = sorted(d for d in os.listdir(FIXTURES) if d.startswith("vm-") and d != "vm-gfp2-kv960m")
    assert found == sorted(EXPECT)
    for name in found:
        for part in ("README.md", "result.json", "journal.txt", "loader.log", "dmesg.txt", "kernel-journal.txt"):
            assert os.path.getsize(fixture(name, part)) > 0, (name, part)


@pytest.mark.parametrize("kernel_source", KERNEL_SOURCES)
@pytest.mark.parametrize("name", sorted(EXPECT))
def test_vm_launch_is_named_correctly(run_module, tmp_path, name, kernel_source):
    cls, evidence = EXPECT[name]
    failed, result = run_module(oom_diagnose, lay_out(tmp_path, name, kernel_source))
    assert not failed, result.get("msg")
    diagnosis = result["diagnoses"][0]
    assert result["class"] == cls, (diagnosis["evidence"], diagnosis["others"], result["sources"])
    if evidence:
        assert any(evidence in line for line in diagnosis["evidence"]), diagnosis["evidence"]
    assert "page_cache_starvation" not in [o["class"] for o in diagnosis["others"]]
    if name == "vm-hog-oom-kill":
        # the kill of this run, not the previous run's NV_ERR_NO_MEMORY and torch error
        assert not [line for line in diagnosis["evidence"] if any(m in line for m in EARLIER_RUN)], diagnosis
        assert any("status=9/KILL" in line for line in diagnosis["evidence"]), diagnosis["evidence"]


def test_older_driver_flags_oom_kill_from_the_serial_console(run_module, tmp_path):
    """gfp_mode=2: the driver's own order-0 allocation invoked the OOM killer; only the console survived."""
    console = fixture("vm-gfp2-kv960m", "console.log")
    text = open(console, encoding="utf-8", errors="replace").read()
    assert "invoked oom-killer: gfp_mask=0x102dc2(GFP_HIGHUSER|__GFP_NOWARN|__GFP_ZERO)" in text
    assert "fg_ioctl+" in text and "Killed process 714 (python3)" in text
    proc = tmp_path / "proc"
    proc.mkdir()
    args = {"proc_root": str(proc), "state_dir": str(tmp_path / "state"), "run_dir": str(tmp_path / "run"),
            "journal_dir": str(tmp_path), "kernel_log_file": console, "report_host": "uma-vm"}  # fmt: skip
    failed, result = run_module(oom_diagnose, args)
    assert not failed, result.get("msg")
    diagnosis = result["diagnoses"][0]
    assert result["class"] == "startup_oom", diagnosis
    assert any("Out of memory: Killed process" in line for line in diagnosis["evidence"]), diagnosis["evidence"]


def result_of(name):
    with open(fixture(name, "result.json"), encoding="utf-8") as fh:
        return json.load(fh)


def test_the_fixtures_are_the_outcomes_they_are_named_for():
    """The captures themselves: healthy reached /health; 960M failed at the KV allocation (no OOM kill); hog: killed."""
    assert result_of("vm-healthy-kv512m")["healthy"] is True
    assert result_of("vm-kv960m-no-memory")["exit"]["Result"] == "exit-code"
    with open(fixture("vm-kv960m-no-memory", "dmesg.txt"), encoding="utf-8") as fh:
        dmesg = fh.read()
    assert "NV_ERR_NO_MEMORY" in dmesg and "Killed process" not in dmesg
    assert result_of("vm-hog-oom-kill")["exit"]["Result"] == "oom-kill"


def test_journal_runs_split_at_systemd_start_and_a_second_exit():
    """Two starts of one unit with no launcher: the second, killed before any vLLM line, is a run of its own."""
    from ansible_collections.uma.vllm.plugins.module_utils.diagnose.parse import parse_journal

    with open(fixture("vm-hog-oom-kill", "journal.txt"), encoding="utf-8") as fh:
        runs = parse_journal(fh.read())["runs"]
    assert [(r["healthy"], bool(r["ooms"]), len(r["killed"])) for r in runs] == [
        (True, False, 0),  # 512M: healthy, stopped
        (False, True, 0),  # 960M: torch OutOfMemoryError, exit-code
        (False, False, 2),  # the hog's launch: status=9/KILL, result 'oom-kill'
    ]
    # systemd's Started line and the launcher's first line are one start, not two runs
    text = (
        "2026-01-01T00:00:00+0000 n systemd[1]: Started uma-vllm@e.service - vLLM e.\n"
        "2026-01-01T00:00:01+0000 n vllm-uma-launch[5]: [vllm-uma-launch e] launch t=0.0 ...\n"
        "2026-01-01T00:00:09+0000 n vllm-uma-launch[5]: INFO:     Application startup complete.\n"
    )
    assert len(parse_journal(text)["runs"]) == 1


@pytest.mark.parametrize("kernel_source", KERNEL_SOURCES)
def test_explicit_kv_cache_size_is_what_the_fix_names(run_module, tmp_path, kernel_source):
    """960M of KV given with --kv-cache-memory-bytes: lowering --gpu-memory-utilization would change nothing.

    No launch record here: the flags come from the transient unit's command line in systemd's
    ``Started`` line (``systemd-run`` describes a unit by its command).
    """
    failed, result = run_module(oom_diagnose, lay_out(tmp_path, "vm-kv960m-no-memory", kernel_source))
    assert not failed, result.get("msg")
    diagnosis = result["diagnoses"][0]
    assert result["class"] == "startup_oom"
    assert "--kv-cache-memory-bytes 960M" in diagnosis["fix"][0], diagnosis["fix"]
    assert "lower --gpu-memory-utilization" not in " ".join(diagnosis["fix"]), diagnosis["fix"]


@pytest.mark.parametrize("kernel_source", KERNEL_SOURCES)
def test_the_other_process_the_kernel_killed_is_named(run_module, tmp_path, kernel_source):
    """The hog ran in ssh.service's cgroup with 939 MiB of anonymous memory: the fix names it, by the kernel's words."""
    failed, result = run_module(oom_diagnose, lay_out(tmp_path, "vm-hog-oom-kill", kernel_source))
    assert not failed, result.get("msg")
    diagnosis = result["diagnoses"][0]
    assert result["class"] == "startup_oom"
    assert "pid 660 (python3) in /system.slice/ssh.service, 939 MiB anonymous" in diagnosis["fix"][0], diagnosis
    assert any("Killed process 660 (python3)" in line for line in diagnosis["evidence"]), diagnosis["evidence"]
    # the engine's own kill (pid 657, in uma-vllm@uma-vm.service) is not called another process's
    assert "pid 657" not in diagnosis["fix"][0]
