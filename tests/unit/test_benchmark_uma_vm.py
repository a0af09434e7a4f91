"""benchmarks/uma_vm.py's host side without a VM: a guest that a launch left unreachable is charged to
that launch (the next configuration's launch starts on a guest that answers), and the report says so.
The experiment itself needs the VM lab (lab/vm.sh up; docs/VM-LAB.md)."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def uma_vm():
    spec = importlib.util.spec_from_file_location("uma_vm", ROOT / "benchmarks" / "uma_vm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_guest_that_answers_again_within_the_tries_answers(uma_vm):
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise SystemExit("kex_exchange_identification: read: Connection reset by peer")

    assert uma_vm.guest_answers(tries=6, wait_s=0, run=flaky) is True
    assert len(calls) == 3


def test_a_guest_that_never_answers_does_not(uma_vm):
    calls = []

    def dead():
        calls.append(1)
        raise subprocess.TimeoutExpired("ssh", 30)

    assert uma_vm.guest_answers(tries=4, wait_s=0, run=dead) is False
    assert len(calls) == 4


def _launch(config, index, healthy, **extra):
    return dict(
        {"config": config, "index": index, "healthy": healthy, "completion": healthy, "healthy_s": 15.0 if healthy
         else None, "exit": 0 if healthy else -9, "cached_peak_mib": 900, "facts": {}, "guard": None,
         "errors": [], "kernel": [], "vmstat": {k: 0 for k in ("allocstall_normal", "compact_stall", "oom_kill")}},
        **extra)  # fmt: skip


def test_the_report_names_launches_that_left_the_guest_unreachable(uma_vm, tmp_path, capsys):
    launches = [
        _launch("a", 1, True),
        _launch("r", 1, False, left_unreachable=True),
        _launch("a", 2, True),
        _launch("r", 2, False, hung=True),
    ]
    path = tmp_path / "exp.json"
    path.write_text(json.dumps({"defaults": {}, "reserve_spark_kb": 0, "launches": launches}))
    uma_vm.report(str(path))
    rows = {line.split(" |")[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")}
    assert "| a" in rows and "| 2/2 | 2/2 |" in rows["| a"]
    assert "| r (1 hung) (1 left it unreachable)" in rows, rows


@pytest.mark.parametrize("scale", ["0", "-1", "3.5", "nan"])
def test_a_reserve_scale_outside_its_range_is_refused_naming_it(uma_vm, scale, capsys):
    with pytest.raises(SystemExit) as err:
        uma_vm.main(["--reserve-scale", scale, "--report", "/nonexistent.json"])
    assert err.value.code == 2
    assert "--reserve-scale must be above 0 and at most 3" in capsys.readouterr().err


def test_the_report_of_c_says_what_the_launcher_and_the_watchdog_did(uma_vm, tmp_path, capsys):
    """c (site.yml on the VM): the plan, and per launch the launcher's record (healthy_at, admission) and the
    engine's watchdog (restarts, floor notes while starting), counted from what SiteLaunch kept."""
    adm = {"admitted": True, "need_bytes": 2446 << 20}
    c1 = dict(_launch("c", 1, True), launcher={
        "healthy_at": 20.6, "admission": dict(adm, mem_available_bytes=2698 << 20),
        "watchdog": {"restart": 0, "evict": 1, "gave_up": 0, "floor-while-starting": 1}})  # fmt: skip
    c2 = dict(_launch("c", 2, False), launcher={
        "healthy_at": None, "admission": dict(adm, mem_available_bytes=2700 << 20),
        "watchdog": {"restart": 1, "evict": 0, "gave_up": 0, "floor-while-starting": 0}})  # fmt: skip
    site = {"seconds": 92.7, "recap": ["uma-vm : ok=54 changed=1 failed=0"], "kv_cache_bytes": 591918695,
            "gpu_memory_utilization": 0.824, "reserve_bytes": 546415410, "reserve_source": "derived", "knobs": {},
            "restore": {"rc": 0}}  # fmt: skip
    path = tmp_path / "exp.json"
    path.write_text(json.dumps({"defaults": {}, "reserve_spark_kb": 0, "site": site, "launches": [c1, c2]}))
    uma_vm.report(str(path))
    out = capsys.readouterr().out
    assert "plan: KV 591918695 bytes (564 MiB), --gpu-memory-utilization 0.824" in out
    rows = {line.split(" |")[0]: line for line in out.splitlines() if line.startswith("| ")}
    assert rows["| the launcher saw /health 200 (its record's healthy_at)"].endswith("| 1 of 2 |")
    assert rows["| watchdog restarts"].endswith("| 1 of 2 |")
    assert rows["| watchdog floor-while-starting notes"].endswith("| 1 of 2 |")
    assert rows["| MemAvailable at admission MiB, median / the plan's request MiB"].endswith("| 2699 / 2446 |")


def test_the_launcher_copied_into_the_guest_is_the_node_programs_the_role_installs(uma_vm):
    from ansible_collections.uma.vllm.plugins.module_utils.plumbing import node_install

    files = uma_vm.node_program_files()
    assert sorted(files) == sorted(node_install.node_sources())  # the same paths and the same text
    assert "uma_launch.py" in dict(files)


@pytest.mark.parametrize("hold", ["600", "0:10", "x:10", "600:-1", "600:4000", "600:nan"])
def test_a_hold_that_is_not_mib_and_seconds_is_refused_naming_it(uma_vm, hold, capsys):
    with pytest.raises(SystemExit) as err:
        uma_vm.main(["--hold", hold, "--report", "/nonexistent.json"])
    assert err.value.code == 2
    said = capsys.readouterr().err
    assert "--hold must be MIB:S" in said and repr(hold) in said


def test_a_hold_is_parsed_as_mib_and_seconds(uma_vm):
    assert uma_vm.parse_hold("600:10") == (600, 10.0)
    assert uma_vm.parse_hold("1:0.5") == (1, 0.5)


def test_the_report_says_what_the_admission_waited_for_and_what_the_engine_check_did(uma_vm, tmp_path, capsys):
    """d (the launcher's admission alone) under --hold: admitted after waiting, or refused (exit 75); a under the
    same hold: the engine's own startup check failed."""
    hold = {"mib": 600, "s": 10.0, "said": "held 600 MiB", "exit": 0}
    check = "ValueError: Free memory on device cuda:0 (2.12/2.9 GiB) on startup is less than desired GPU memory"
    d_ok = {"admission": {"admitted": True, "waited_s": 9.0}}
    d_refused = {"admission": {"admitted": False, "waited_s": 20.1}}
    launches = [
        dict(_launch("a", 1, False, exit=1, errors=[check]), hold=dict(hold, memavailable_with_hold_mib=2185)),
        dict(_launch("d", 1, True), hold=dict(hold, memavailable_with_hold_mib=2164), launcher=d_ok),
        dict(_launch("d", 2, False, exit=75), hold=dict(hold, memavailable_with_hold_mib=2170), launcher=d_refused),
    ]
    path = tmp_path / "exp.json"
    path.write_text(json.dumps({"defaults": {}, "reserve_spark_kb": 0, "launches": launches}))
    uma_vm.report(str(path))
    lines = {line.split(":")[0]: line for line in capsys.readouterr().out.splitlines() if line[:3] in ("a: ", "d: ")}
    assert lines["a"].startswith("a: admitted 0, refused 0 of 1 (exit 75: 0)")
    assert (
        "the engine's own check failed 1; held MiB 600 for 10.0 s, MemAvailable with it MiB median 2185" in lines["a"]
    )
    assert lines["d"].startswith("d: admitted 1, refused 1 of 2 (exit 75: 1); waited s median 14.6 (max 20.1)")
    assert "the engine's own check failed 0" in lines["d"]


# ---- issue 35 item 6: c from a fresh clone, ansible-playbook not on PATH


def test_c_runs_the_checkouts_venv_ansible_playbook_when_path_has_none(uma_vm, tmp_path):
    tool = tmp_path / ".venv" / "bin" / "ansible-playbook"
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert uma_vm.ansible_playbook(str(tmp_path), which=lambda _name: None) == str(tool)


def test_c_falls_back_to_the_ansible_playbook_on_path(uma_vm, tmp_path):
    tool = tmp_path / ".venv" / "bin" / "ansible-playbook"
    tool.parent.mkdir(parents=True)
    tool.write_text("not executable\n")  # a .venv half made: not used
    assert uma_vm.ansible_playbook(str(tmp_path), which=lambda name: "/opt/x/" + name) == "/opt/x/ansible-playbook"


def test_c_without_any_ansible_playbook_is_refused_before_the_guest_is_touched(tmp_path):
    """The script as a user runs it: PATH without ansible-playbook and a checkout copy without .venv.
    Before the fix this was a FileNotFoundError traceback after the guest's set-up (setup() boots
    nothing here: it is never reached)."""
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    (bench / "uma_vm.py").write_bytes((ROOT / "benchmarks" / "uma_vm.py").read_bytes())
    (tmp_path / "empty").mkdir()  # PATH: a folder with no ansible-playbook, whatever the machine has
    env = {"PATH": str(tmp_path / "empty"), "UMA_VM_CACHE": str(tmp_path / "cache")}
    res = subprocess.run(
        [sys.executable, str(bench / "uma_vm.py"), "--configs", "c", "--launches", "1"],
        capture_output=True, text=True, env=env, check=False, timeout=60,
    )  # fmt: skip
    assert res.returncode == 1, res
    assert "Traceback" not in res.stderr
    assert "neither in this checkout's .venv" in res.stderr and "tests/setup.sh --base" in res.stderr
    assert not (tmp_path / "cache").exists()
