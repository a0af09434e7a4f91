"""plugins/module_utils/system/readahead.py without AnsibleModule: plan -> execute -> result over a fake
sysfs (the node fixture of test_readahead_window.py) and a fake systemd (issue 13 item 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.node.base.systemd import Systemd
from ansible_collections.uma.vllm.plugins.module_utils.plumbing.flow import run_flow
from ansible_collections.uma.vllm.plugins.module_utils.system import readahead as ra

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "modules"))
from test_readahead_window import FakeSystemd, node  # noqa: F401 # pylint: disable=unused-import


def flow(req, systemd, check_mode=False):
    return run_flow(
        lambda: ra.plan(req, systemd, now=100, page=4),
        lambda p: ra.execute(p, systemd),
        lambda p, _done: ra.result(p),
        check_mode=check_mode,
        want_diff=True,
        diff=lambda p: p.diff(),
        failed_result=ra.result,
    )


def test_throttle_then_restore_without_ansible(node):  # noqa: F811
    systemd = Systemd(node.systemd)
    req = ra.WindowRequest(**node.args(device="sda", read_ahead_kb=16, duration=60))
    p = ra.plan(req, systemd, now=100, page=4)
    assert p.changed and p.live_before == {"sda": 4096} and p.live_after == {"sda": 16}
    assert p.arm_timer and p.record_after["ends_at"] == 160
    names = [f.name for f in p.node_files]  # the node package and its entry scripts
    assert "uma_readahead.py" in names and "uma_vllm_node/base/blockdev.py" in names
    ra.execute(p, systemd)
    assert node.ra("sda") == 16
    assert json.loads(node.record.read_text())["devices"][0]["original_kb"] == 4096
    assert not ra.plan(req, systemd, now=101, page=4).changed
    back = ra.plan(ra.WindowRequest(**node.args(state="restored")), systemd, now=102, page=4)
    assert back.live_after == {"sda": 4096} and back.stop_timer and back.record_after is None
    ra.execute(back, systemd)
    assert node.ra("sda") == 4096 and not node.record.exists()


def test_the_flow_in_check_mode_changes_nothing_and_reports_the_diff(node):  # noqa: F811
    systemd = Systemd(node.systemd)
    outcome = flow(ra.WindowRequest(**node.args(device="sda")), systemd, check_mode=True)
    assert not outcome.failed and outcome.fields["changed"]
    assert node.ra("sda") == 4096 and not node.record.exists() and node.systemd.actions() == []
    headers = [d["before_header"] for d in outcome.fields["diff"]]
    assert headers[:2] == ["live values", "timer"] and "node programs" in headers


def test_the_flow_refuses_a_bad_option_naming_it(node):  # noqa: F811
    outcome = flow(ra.WindowRequest(**node.args(device="sda", duration=0)), Systemd(node.systemd))
    assert outcome.failed and outcome.fields["option"] == "duration" and "86400" in outcome.fields["msg"]


def test_the_installed_restorer_runs_on_a_bare_python(node):  # noqa: F811
    """The installed node package is enough for the boot unit's command without Ansible."""
    systemd = Systemd(node.systemd)
    req = ra.WindowRequest(**node.args(device="sda", read_ahead_kb=16))
    ra.execute(ra.plan(req, systemd, now=100, page=4), systemd)
    lib = node.root / "lib"
    ran = subprocess.run(
        [sys.executable, "-S", str(lib / "uma_readahead.py"), "restore", "--all",
         "--state-dir", str(node.root / "state"), "--sysfs-root", req.sysfs_root],
        capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"},
        timeout=60, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert node.ra("sda") == 4096


def test_validate_needs_no_systemd():
    with pytest.raises(UmaError) as err:
        ra.validate(ra.WindowRequest(state="throttled"))
    assert err.value.option == "path"
