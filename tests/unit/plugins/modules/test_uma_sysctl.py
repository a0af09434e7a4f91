"""uma.vllm.uma_sysctl as Ansible runs it: results, check mode, diff, refusals."""

from __future__ import annotations

import os
import pathlib

import pytest
import yaml

from ansible_collections.uma.vllm.plugins.modules import uma_sysctl

REFUSALS = yaml.safe_load((pathlib.Path(__file__).parent / "uma_sysctl_refusals.yaml").read_text())


@pytest.fixture
def node(tmp_path):
    proc = tmp_path / "proc"
    (proc / "sys" / "vm").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal:       126877696 kB\n")  # 121 GiB
    for key, value in {
        "min_free_kbytes": 45056,
        "vfs_cache_pressure": 100,
        "dirty_ratio": 20,
        "dirty_background_ratio": 10,
        "swappiness": 60,
    }.items():
        (proc / "sys" / "vm" / key).write_text("%s\n" % value)
    etc = tmp_path / "etc" / "sysctl.d"
    etc.mkdir(parents=True)
    return {
        "path": str(etc / "90-vllm.conf"),
        "proc_root": str(proc),
        "sysctl_dirs": [str(etc)],
        "sysctl_conf": str(tmp_path / "etc" / "sysctl.conf"),
        "state_dir": str(tmp_path / "state"),
    }


def live(node, key):
    return pathlib.Path(node["proc_root"], "sys", "vm", key).read_text().strip()


def test_changed_then_unchanged_then_changed_after_edit(run_module, node):
    args = dict(node, min_free_kbytes=3145728)
    failed, first = run_module(uma_sysctl, args)
    assert not failed and first["changed"]
    assert first["sizing"]["rule"] == "explicit" and live(node, "min_free_kbytes") == "3145728"
    assert first["settings"]["vm.min_free_kbytes"] == "3145728"
    failed, second = run_module(uma_sysctl, args)
    assert not failed and not second["changed"] and second["drift"] == {"file": None, "live": {}}
    pathlib.Path(node["path"]).write_text(pathlib.Path(node["path"]).read_text().replace("= 5", "= 7"))
    failed, third = run_module(uma_sysctl, args)
    assert third["changed"] and third["drift"]["file"] == "edited by hand (fingerprint mismatch)"
    assert "vm.dirty_ratio = 5" in pathlib.Path(node["path"]).read_text()


def test_check_mode_predicts_and_touches_nothing(run_module, node):
    failed, result = run_module(uma_sysctl, dict(node, ram_gib=121), check_mode=True, diff=True)
    assert not failed and result["changed"]
    assert not os.path.exists(node["path"]) and not os.path.exists(node["state_dir"])
    assert live(node, "vfs_cache_pressure") == "100"
    assert result["live_after"]["vm.vfs_cache_pressure"] == "200"
    file_diff, live_diff = result["diff"]
    assert file_diff["before"] == "" and "vm.min_free_kbytes = 3801088" in file_diff["after"]
    assert "vm.vfs_cache_pressure = 100" in live_diff["before"] and "vm.vfs_cache_pressure = 200" in live_diff["after"]


def test_live_drift_alone_is_reported_and_corrected(run_module, node):
    run_module(uma_sysctl, node)
    pathlib.Path(node["proc_root"], "sys", "vm", "vfs_cache_pressure").write_text("100\n")
    failed, result = run_module(uma_sysctl, node)
    assert not failed and result["changed"] and result["drift"]["file"] is None
    assert result["drift"]["live"] == {"vm.vfs_cache_pressure": {"expected": "200", "actual": "100"}}
    assert live(node, "vfs_cache_pressure") == "200"


def test_conflicts_fail_refuses_before_touching(run_module, node):
    pathlib.Path(node["sysctl_dirs"][0], "99-local.conf").write_text("vm.dirty_ratio = 30\n")
    failed, result = run_module(uma_sysctl, dict(node, conflicts="fail"))
    assert failed and "99-local.conf sets vm.dirty_ratio = 30" in result["msg"]
    assert "option 'conflicts'" in result["msg"] and not os.path.exists(node["path"])
    assert live(node, "dirty_ratio") == "20"
    failed, result = run_module(uma_sysctl, dict(node, conflicts="warn"))
    assert not failed and result["conflicts"][0]["wins_at_boot"]


def test_absent_puts_the_node_back(run_module, node):
    run_module(uma_sysctl, dict(node, extra={"vm.swappiness": 5}))
    failed, result = run_module(uma_sysctl, dict(node, state="absent"), diff=True)
    assert not failed and result["changed"]
    assert not os.path.exists(node["path"])
    assert [live(node, k) for k in ("min_free_kbytes", "dirty_ratio", "swappiness")] == ["45056", "20", "60"]
    failed, result = run_module(uma_sysctl, dict(node, state="absent"))
    assert not failed and not result["changed"]


@pytest.mark.parametrize("case", REFUSALS, ids=[c["id"] for c in REFUSALS])
def test_refusals_name_option_value_and_fix(run_module, node, case):
    before = {k: live(node, k) for k in ("min_free_kbytes", "dirty_ratio")}
    failed, result = run_module(uma_sysctl, dict(node, **case["args"]))
    assert failed, result
    msg = result["msg"]
    assert msg.startswith("option '%s' = " % case["option"]), msg
    assert case["match"] in msg
    assert "Traceback" not in msg
    # the fix: every message ends with an instruction sentence
    assert msg.rstrip().endswith(".") and msg.count(". ") >= 1
    assert not os.path.exists(node["path"]) and not os.path.exists(node["state_dir"])
    assert {k: live(node, k) for k in ("min_free_kbytes", "dirty_ratio")} == before


def _snapshot(node):
    files = [pathlib.Path(node["path"]), pathlib.Path(node["state_dir"], "sysctl-original.json")]
    keys = ("min_free_kbytes", "vfs_cache_pressure", "dirty_ratio", "dirty_background_ratio", "swappiness")
    return {str(f): f.read_bytes() for f in files if f.exists()}, {k: live(node, k) for k in keys}


@pytest.mark.parametrize(
    "damage, problem",
    [
        (b'{"vm.min_free_kbytes": "45056", "vm.dirty_ra', "not JSON (truncated?)"),
        (b'{"vm.min_free_kbytes": "4505\xff"}', "not UTF-8 text"),
    ],
    ids=["truncated", "not UTF-8"],
)
@pytest.mark.parametrize("state", ["absent", "present"])
@pytest.mark.parametrize("check_mode", [False, True], ids=["run", "check mode"])
def test_a_damaged_original_record_fails_the_task_and_changes_nothing(run_module, node, damage, problem, state,
                                                                      check_mode):  # fmt: skip
    """Issue 36, as Ansible runs the module: a truncated or non-UTF-8 sysctl-original.json made state=absent
    delete the drop-in, restore nothing and report changed (check mode predicted the same). Now the task
    fails in a run and in check mode alike, naming the file, what is wrong and the two fixes; the drop-in,
    the record and every live value stay as they were."""
    failed, result = run_module(uma_sysctl, dict(node, extra={"vm.swappiness": 5}))
    assert not failed and result["original"]["vm.swappiness"] == "60"
    record = pathlib.Path(node["state_dir"], "sysctl-original.json")
    record.write_bytes(damage)
    before = _snapshot(node)
    failed, result = run_module(uma_sysctl, dict(node, state=state), check_mode=check_mode, diff=True)
    assert failed and not result.get("changed"), result
    msg = result["msg"]
    assert msg.startswith("option 'state_dir' = '%s': %s holds the operator's original" % (node["state_dir"], record))
    assert "is damaged (%s); it is not taken for no record, and nothing was changed" % problem in msg, msg
    assert '"vm.swappiness": "<original>"' in msg and "or remove it if the values the node has now are to stay" in msg
    assert _snapshot(node) == before
