"""benchmarks/uma_vm.py's host side without a VM: a guest that a launch left unreachable is charged to
that launch (the next configuration's launch starts on a guest that answers), and the report says so.
The experiment itself needs the VM lab (lab/vm.sh up; docs/VM-LAB.md)."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess

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
