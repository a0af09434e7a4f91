"""drop_cache_loop's logic (module_utils/system/guard_service.py) without AnsibleModule: plan -> execute -> result.

The module itself, through run_module, is tested in tests/unit/plugins/modules/test_drop_cache_loop.py;
the real systemd and the real guard in molecule/guard.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.node.base.systemd import Systemd
from ansible_collections.uma.vllm.plugins.module_utils.node.guard import program as uma_guard
from ansible_collections.uma.vllm.plugins.module_utils.plumbing import node_install
from ansible_collections.uma.vllm.plugins.module_utils.system import guard_service as svc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "modules"))
# the module tests' node fixture (the node tree and the fake systemd), used by guard() below
from test_drop_cache_loop import node  # noqa: F401  # pylint: disable=unused-import


@pytest.fixture
def guard(node):  # noqa: F811
    """The fake systemd's calls, a Systemd driving it, a GuardRequest factory, the node's root."""
    systemd = Systemd(node.systemd, "/usr/bin/systemctl", "/usr/bin/systemd-run")
    return node.systemd, systemd, lambda **kw: svc.GuardRequest(**node.args(**kw)), node.root


def test_plan_touches_nothing_and_says_what_it_would_do(guard):
    fake, systemd, request, root = guard
    p = svc.plan(request(), systemd)
    assert p.action == "started" and p.changed and not p.active_before
    assert [f.name for f in p.node_files] == [name for name, _text in node_install.node_sources()]
    assert "uma_guard.py" in [f.name for f in p.node_files]
    assert p.diff() == {
        "before": {"active": False, "config": None},
        "after": {"active": True, "config": p.config},
    }
    assert fake.actions() == [] and not (root / "lib").exists() and not (root / "run").exists()


def test_execute_then_plan_again_is_unchanged(guard):
    _fake, systemd, request, root = guard
    p = svc.plan(request(), systemd)
    done = svc.execute(p, systemd)
    assert done["status"]["state"] == "running" and done["pid"] == 4000
    installed = sorted(
        os.path.relpath(os.path.join(d, f), str(root / "lib")) for d, _s, fs in os.walk(root / "lib") for f in fs
    )
    assert installed == sorted(f.name for f in p.node_files)
    sidecar = json.loads((root / "run" / "guard-g.unit.json").read_text())
    assert sidecar["fingerprint"] == p.fingerprint and sidecar["config"] == p.config
    again = svc.plan(request(), systemd)
    assert again.action == "unchanged" and not again.changed
    assert again.diff()["before"] == again.diff()["after"]
    result = svc.result(again, svc.read_status(again.status_file), 4000)
    assert (
        result["changed"] is False
        and result["active"]
        and len(result["node_files"]) == len(node_install.node_sources())
    )


def test_a_new_configuration_restarts_and_the_diff_names_it(guard):
    _fake, systemd, request, _root = guard
    svc.execute(svc.plan(request(), systemd), systemd)
    p = svc.plan(request(threshold_mib=64), systemd)
    assert p.action == "restarted"
    diff = p.diff()
    assert diff["before"]["config"]["threshold_mib"] == 16 and diff["after"]["config"]["threshold_mib"] == 64


def test_stop_plans_stopped_then_none(guard):
    _fake, systemd, request, _root = guard
    svc.execute(svc.plan(request(), systemd), systemd)
    p = svc.plan(request(state="stopped"), systemd)
    assert p.action == "stopped" and p.diff()["after"] == {"active": False, "config": None}
    done = svc.execute(p, systemd)
    assert done["pid"] == 0 and done["status"]["stop_reason"] == "signal"
    assert svc.plan(request(state="stopped"), systemd).action == "none"


@pytest.mark.parametrize(
    "config, drops",
    [
        (dict(mode="global", paths=[]), True),
        (dict(mode="adaptive", paths=[]), True),
        (dict(mode="adaptive", paths=["/m"]), False),
        (dict(mode="files", paths=["/m"]), False),
    ],
)
def test_hardening_grants_cap_sys_admin_only_to_a_guard_that_drops_globally(config, drops):
    props = svc.guard_hardening(svc.GuardRequest(name="g"), config)
    assert ("CapabilityBoundingSet=CAP_DAC_READ_SEARCH CAP_SYS_ADMIN" in props) is drops
    assert ("ProtectKernelTunables=yes" in props) is not drops
    assert "PrivateNetwork=yes" in props  # no until_url: no network
    assert "IPAddressDeny=any" in props
    # issue 22: an ordinary service's system calls only, refused with EPERM (nothing killed)
    assert "SystemCallFilter=@system-service" in props and "SystemCallErrorNumber=EPERM" in props


def test_hardening_keeps_the_network_for_until_url():
    props = svc.guard_hardening(
        svc.GuardRequest(name="g"), {"mode": "model", "paths": ["/m"], "until_url": "http://127.0.0.1:8000/health"}
    )
    assert "PrivateNetwork=no" in props and "IPAddressDeny=any" not in props


def test_guard_command_parses_back_to_the_same_configuration(guard):
    _fake, _systemd, request, _root = guard
    req = request(interval="0.5", threshold_mib="32", until_url="http://127.0.0.1:8000/health")
    config = svc.validate(req)
    argv = svc.guard_command(req, config, "/run/uma-vllm/guard-g.json")
    parsed = uma_guard.parse_config(argv[2:])
    for key in svc.CONFIG_KEYS:
        if key != "samples_file":
            assert parsed[key] == config[key], key


def test_validate_names_the_modules_option(guard):
    _fake, _systemd, request, _root = guard
    with pytest.raises(UmaError) as err:
        svc.validate(request(interval=0.001))
    assert err.value.option == "interval" and "is below 0.01 s" in err.value.message


@pytest.mark.parametrize(
    "content",
    [None, "fifo", '{"state": "running", "rss": NaN}', '{"samples": 1e400}', "[1, 2]", '{"state": "running"'],
)
def test_read_status_takes_no_damaged_status_and_never_hangs(tmp_path, content):
    """Issue 36 item 4: the guard's status and the unit's sidecar are read through the node programs'
    one record reader: a FIFO at the path is not opened (it hung the module), NaN/1e400, a list and a
    truncated object are no status (None), a missing one is None too."""
    path = tmp_path / "guard-x.json"
    if content == "fifo":
        os.mkfifo(str(path))
    elif content is not None:
        path.write_text(content)
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail("read_status hung on %r" % content))
    signal.alarm(10)
    try:
        assert svc.read_status(str(path)) is None
    finally:
        signal.alarm(0)


def test_read_status_returns_a_whole_status(tmp_path):
    path = tmp_path / "guard-x.json"
    path.write_text('{"state": "running", "evictions": 3}')
    assert svc.read_status(str(path)) == {"state": "running", "evictions": 3}
