# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""uma.vllm.drop_cache_loop (plus _systemd and _nodefiles) against a fake systemd.

The real systemd, the real guard and the connection going away are covered by molecule/guard.
"""

from __future__ import annotations

import json
import os
import sys
import zipfile

import pytest
from ansible.module_utils import basic

from ansible_collections.uma.vllm.plugins.module_utils.node.base import common as _common
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.node.base.systemd import (
    Systemd,
    check_name,
    description_fingerprint,
    parse_show,
)
from ansible_collections.uma.vllm.plugins.module_utils.node.guard import program as uma_guard
from ansible_collections.uma.vllm.plugins.module_utils.plumbing import node_install as _nodefiles
from ansible_collections.uma.vllm.plugins.module_utils.system import guard_service as _guard_service
from ansible_collections.uma.vllm.plugins.modules import drop_cache_loop

PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable


class FakeGuardSystemd:
    """systemctl/systemd-run/journalctl with transient services whose 'guard' writes a status file.

    ``behaviour`` decides what the guard does when started: ``run`` (keeps running), ``no_status``
    (exits before writing anything), ``error`` (stops with an error), ``url`` (the URL already
    answers: stops at once, normally).
    """

    def __init__(self) -> None:
        self.units = {}
        self.calls = []
        self.behaviour = "run"
        self.next_pid = 4000

    def actions(self):
        reads = ("show", "is-enabled", "is-system-running")
        return [c for c in self.calls if not (c[0].endswith("systemctl") and c[1] in reads)]

    def runs(self):
        return [c for c in self.calls if c[0].endswith("systemd-run")]

    @staticmethod
    def _status(argv, pid, state, reason):
        return {
            "name": argv[argv.index("--name") + 1],
            "mode": argv[argv.index("--mode") + 1],
            "pid": pid,
            "state": state,
            "stop_reason": reason,
            "evictions": 3,
            "evicted_bytes": 12345,
            "config": {"argv": argv},
        }

    def _write(self, argv, data):
        path = argv[argv.index("--status-file") + 1]
        _common.atomic_write_json(path, data)

    def __call__(self, argv):
        argv = list(argv)
        self.calls.append(argv)
        tool = os.path.basename(argv[0])
        if tool == "systemctl":
            verb = argv[1]
            if verb == "is-system-running":
                return 1, "degraded\n", ""  # degraded still counts as booted
            if verb == "show":
                unit = self.units.get(argv[2])
                values = unit or {"LoadState": "not-found", "ActiveState": "inactive", "SubState": "dead"}
                return 0, "".join("%s=%s\n" % (p, values.get(p, "")) for p in argv[4].split(",")), ""
            if verb == "stop":
                unit = self.units.pop(argv[2], None)
                if unit is None:
                    return 5, "", "not loaded"
                self._write(unit["argv"], self._status(unit["argv"], int(unit["MainPID"]), "stopped", "signal"))
                return 0, "", ""
            if verb == "reset-failed":
                return 0, "", ""
        if tool == "systemd-run":
            name = argv[argv.index("--unit") + 1] + ".service"
            if name in self.units:
                return 1, "", "Unit %s already exists." % name
            command = argv[argv.index(PYTHON) :]
            pid = self.next_pid
            self.next_pid += 1
            if self.behaviour == "no_status":
                return 0, "", ""
            if self.behaviour == "error":
                self._write(command, self._status(command, pid, "stopped", "error: /proc/meminfo unreadable"))
                return 0, "", ""
            if self.behaviour == "url":
                self._write(command, self._status(command, pid, "stopped", "until_url"))
                return 0, "", ""
            self.units[name] = {
                "LoadState": "loaded",
                "ActiveState": "active",
                "SubState": "running",
                "MainPID": str(pid),
                "Description": argv[argv.index("--description") + 1],
                "argv": command,
            }
            self._write(command, self._status(command, pid, "running", None))
            return 0, "", ""
        if tool == "journalctl":
            return 0, "uma_guard.py: error: argument --mode: invalid choice\n", ""
        return 127, "", "unexpected %s" % argv


@pytest.fixture
def node(tmp_path, monkeypatch):
    fake = FakeGuardSystemd()
    monkeypatch.setattr(basic.AnsibleModule, "run_command", lambda self, args, **kw: fake(args))
    monkeypatch.setattr(basic.AnsibleModule, "get_bin_path", lambda self, name, *a, **kw: "/usr/bin/" + name)
    monkeypatch.setattr(_guard_service, "_sleep", lambda s: None)
    models = tmp_path / "models"
    models.mkdir()
    (models / "model.safetensors").write_bytes(b"\0" * 4096)
    proc = tmp_path / "proc"
    (proc / "sys" / "vm").mkdir(parents=True)
    (proc / "sys" / "vm" / "drop_caches").write_text("")
    (proc / "4242").mkdir()

    class Node:
        systemd = fake
        root = tmp_path
        status = tmp_path / "run" / "guard-g.json"
        sidecar = tmp_path / "run" / "guard-g.unit.json"

        @staticmethod
        def args(**kw):
            base = dict(
                name="g",
                mode="files",
                paths=[str(models)],
                python=PYTHON,
                lib_dir=str(tmp_path / "lib"),
                run_dir=str(tmp_path / "run"),
                proc_root=str(proc),
            )
            base.update(kw)
            return base

    return Node


def test_start_runs_a_transient_unit_and_returns_status(run_module, node):
    failed, result = run_module(drop_cache_loop, node.args(max_duration=20, until_pid=4242))
    assert not failed, result
    assert result["changed"] and result["action"] == "started" and result["active"]
    assert result["unit"] == "uma-guard-g.service"
    assert result["status"]["state"] == "running" and result["status"]["pid"] == result["pid"] == 4000
    run = node.systemd.runs()[0]
    assert run[run.index("--unit") + 1] == "uma-guard-g"
    assert "--collect" in run
    assert "--property=RuntimeMaxSec=80" in run and "--property=Type=exec" in run
    assert "[sha256:%s]" % result["fingerprint"] in run[run.index("--description") + 1]
    command = run[run.index(PYTHON) :]
    assert command[1] == str(node.root / "lib" / "uma_guard.py")
    assert command[command.index("--until-pid") + 1] == "4242"
    assert command[command.index("--status-file") + 1] == str(node.status)
    # the node package and its entry scripts installed from the collection's source
    assert (node.root / "lib" / "uma_vllm_node" / "guard" / "program.py").read_text() == _nodefiles.module_source(
        uma_guard
    )
    assert (node.root / "lib" / "uma_vllm_node" / "base" / "common.py").read_text() == _nodefiles.module_source(_common)
    assert "from uma_vllm_node.guard.program import main" in (node.root / "lib" / "uma_guard.py").read_text()
    assert [f["changed"] for f in result["node_files"]] == [True] * len(_nodefiles.program_names())
    assert json.loads(node.sidecar.read_text())["config"] == result["config"]


def test_starting_twice_leaves_one_guard(run_module, node):
    run_module(drop_cache_loop, node.args())
    node.systemd.calls.clear()
    failed, result = run_module(drop_cache_loop, node.args(), diff=True)
    assert not failed and not result["changed"] and result["action"] == "unchanged"
    assert node.systemd.actions() == []
    assert len(node.systemd.units) == 1
    assert result["pid"] == 4000 and result["status"]["state"] == "running"
    assert result["diff"]["before"] == result["diff"]["after"]
    assert [f["changed"] for f in result["node_files"]] == [False] * len(_nodefiles.program_names())


def test_other_config_restarts(run_module, node):
    _failed, first = run_module(drop_cache_loop, node.args())
    failed, result = run_module(drop_cache_loop, node.args(threshold_mib=64), diff=True)
    assert not failed and result["changed"] and result["action"] == "restarted"
    assert result["pid"] == 4001 and len(node.systemd.units) == 1
    verbs = [c[1] if c[0].endswith("systemctl") else "run" for c in node.systemd.actions()]
    assert verbs[-3:] == ["stop", "reset-failed", "run"]
    assert result["diff"]["before"]["config"]["threshold_mib"] == 16
    assert result["diff"]["after"]["config"]["threshold_mib"] == 64
    assert result["fingerprint"] != first["fingerprint"]


def test_new_program_version_restarts(run_module, node, monkeypatch):
    run_module(drop_cache_loop, node.args())
    monkeypatch.setattr(_guard_service, "files_fingerprint", lambda files: "a new collection version")
    failed, result = run_module(drop_cache_loop, node.args())
    assert not failed and result["action"] == "restarted"


def test_program_edited_on_the_node_is_repaired_without_restart(run_module, node):
    run_module(drop_cache_loop, node.args())
    program = node.root / "lib" / "uma_vllm_node" / "guard" / "program.py"
    program.write_text("# edited by hand\n")
    failed, result = run_module(drop_cache_loop, node.args())
    assert not failed and result["changed"] and result["action"] == "unchanged"
    assert [f["path"] for f in result["node_files"] if f["changed"]] == [str(program)] and result["pid"] == 4000
    assert program.read_text() == _nodefiles.module_source(uma_guard)


def test_stop_returns_final_status(run_module, node):
    run_module(drop_cache_loop, node.args())
    failed, result = run_module(
        drop_cache_loop, dict(name="g", run_dir=str(node.root / "run"), state="stopped"), diff=True
    )
    assert not failed and result["changed"] and result["action"] == "stopped" and not result["active"]
    assert result["status"]["state"] == "stopped" and result["status"]["stop_reason"] == "signal"
    assert result["status"]["evicted_bytes"] == 12345
    assert result["diff"]["before"]["active"] and result["diff"]["after"] == {"active": False, "config": None}
    assert node.systemd.units == {}
    failed, result = run_module(drop_cache_loop, dict(name="g", run_dir=str(node.root / "run"), state="stopped"))
    assert not failed and not result["changed"] and result["action"] == "none"
    assert result["status"]["stop_reason"] == "signal"


def test_check_mode_starts_nothing(run_module, node):
    failed, result = run_module(drop_cache_loop, node.args(), check_mode=True, diff=True)
    assert not failed and result["changed"] and result["action"] == "started" and result["active"]
    assert node.systemd.actions() == []
    assert not (node.root / "lib").exists() and not (node.root / "run").exists()
    assert result["diff"]["before"] == {"active": False, "config": None}
    run_module(drop_cache_loop, node.args())
    node.systemd.calls.clear()
    failed, result = run_module(drop_cache_loop, node.args(state="stopped"), check_mode=True)
    assert not failed and result["changed"] and result["action"] == "stopped"
    assert node.systemd.actions() == [] and len(node.systemd.units) == 1


def test_guard_that_exits_without_status_fails_with_journal(run_module, node):
    node.systemd.behaviour = "no_status"
    failed, result = run_module(drop_cache_loop, node.args())
    assert failed
    assert "guard exited without writing a status: uma_guard.py: error: argument --mode" in result["msg"]


def test_guard_that_stops_with_error_fails(run_module, node):
    node.systemd.behaviour = "error"
    failed, result = run_module(drop_cache_loop, node.args())
    assert failed and "stopped right after it started (error: /proc/meminfo unreadable)" in result["msg"]


def test_guard_whose_url_already_answers_warns(run_module, node):
    node.systemd.behaviour = "url"
    failed, result = run_module(drop_cache_loop, node.args(until_url="http://127.0.0.1:8000/health"))
    assert not failed and result["changed"] and result["pid"] == 0 and not result["active"]
    assert result["status"]["stop_reason"] == "until_url"


def test_same_guard_started_by_another_play_meanwhile_is_accepted(run_module, node, monkeypatch):
    """Two plays start the same guard at once: systemd-run fails for the second, which finds the first."""
    real = node.systemd.__call__

    def racing(argv):
        if argv[0].endswith("systemd-run"):
            real(argv)  # the other play wins the race ...
            return 1, "", "Failed to start transient service unit: Unit uma-guard-g.service already exists."
        return real(argv)

    monkeypatch.setattr(basic.AnsibleModule, "run_command", lambda self, args, **kw: racing(args))
    failed, result = run_module(drop_cache_loop, node.args())
    assert not failed and result["active"] and result["pid"] == 4000
    assert len(node.systemd.units) == 1


def test_systemd_run_refused_fails_cleanly(run_module, node, monkeypatch):
    real = node.systemd.__call__

    def denied(argv):
        if argv[0].endswith("systemd-run"):
            return 1, "", "Failed to start transient service unit: Access denied"
        return real(argv)

    monkeypatch.setattr(basic.AnsibleModule, "run_command", lambda self, args, **kw: denied(args))
    failed, result = run_module(drop_cache_loop, node.args())
    assert failed and "Access denied" in result["msg"] and "become" in result["msg"]
    assert node.systemd.units == {}


def test_stale_status_is_not_taken_for_the_new_guard(run_module, node):
    node.status.parent.mkdir()
    node.status.write_text(json.dumps({"state": "stopped", "stop_reason": "error: old", "pid": 1}))
    failed, result = run_module(drop_cache_loop, node.args())
    assert not failed and result["status"]["state"] == "running"


@pytest.mark.parametrize(
    "args, option, problem",
    [
        (dict(name="a/b"), "name", "safe unit-name fragment"),
        (dict(name=""), "name", "safe unit-name fragment"),
        (dict(name="-x"), "name", "safe unit-name fragment"),
        (dict(name="x" * 65), "name", "safe unit-name fragment"),
        (dict(paths=[]), "paths", "is empty but mode=files"),
        (dict(paths=["/nonexistent/model"]), "paths", "does not exist on the node"),
        (dict(paths=["models"]), "paths", "is not an absolute path"),
        (dict(mode="global"), "paths", "has no effect with mode=global"),
        (dict(mode="turbo"), None, "value of mode must be one of"),
        (dict(interval=0), "interval", "must be > 0 and <= 60"),
        (dict(interval=61), "interval", "must be > 0 and <= 60"),
        (dict(interval="fast"), "interval", "is not a number"),
        (dict(interval=0.001), "interval", "is below 0.01"),
        (dict(interval="nan"), "interval", "must be > 0"),
        (dict(threshold_mib=0), "threshold_mib", "below the minimum 1"),
        (dict(threshold_mib="32M"), "threshold_mib", "is not an integer"),
        (dict(min_available_mib=-1), "min_available_mib", "below the minimum 0"),
        (dict(act_below_free_mib=-1), "act_below_free_mib", "below the minimum 0"),
        (dict(act_below_free_mib="2G"), "act_below_free_mib", "is not an integer"),
        (dict(act_below_free_mib=1048577), "act_below_free_mib", "above the maximum 1048576"),
        (dict(act_below_free_mib=512), "act_below_free_mib", "has no effect with mode=files"),
        (dict(drop_level=2), None, "value of drop_level must be one of"),
        (dict(max_duration=0), "max_duration", "must be > 0"),
        (dict(max_duration=-1), "max_duration", "must be > 0"),
        (dict(max_duration=86401), "max_duration", "<= 86400"),
        (dict(max_duration=True), "max_duration", "is a boolean"),
        (dict(until_url="ftp://host/x"), "until_url", "is not an http(s) URL"),
        (dict(until_url="http://"), "until_url", "is not an http(s) URL"),
        (dict(until_url="localhost:8000/health"), "until_url", "is not an http(s) URL"),
        (dict(until_pid=99999), "until_pid", "is not a running process"),
        (dict(until_pid=0), "until_pid", "below the minimum 1"),
        (dict(until_pid="abc"), "until_pid", "is not an integer"),
        (dict(samples_file="samples.jsonl"), "samples_file", "is not an absolute path"),
        (dict(python="/nonexistent/python3"), "python", "is not an executable"),
        (dict(lib_dir="lib"), "lib_dir", "is not an absolute path"),
        (dict(run_dir="/run/my guard"), "run_dir", "is not an absolute path"),
    ],
)
def test_bad_options_fail_cleanly_and_touch_nothing(run_module, node, args, option, problem):
    failed, result = run_module(drop_cache_loop, node.args(**args))
    assert failed
    assert problem in result["msg"], result["msg"]
    if option:
        assert result["msg"].startswith("option '%s' = " % option)
    assert node.systemd.actions() == []
    assert not (node.root / "lib").exists() and not (node.root / "run").exists()


def test_global_mode_needs_writable_drop_caches(run_module, node, tmp_path):
    empty_proc = tmp_path / "noproc"
    empty_proc.mkdir()
    failed, result = run_module(drop_cache_loop, node.args(mode="adaptive", paths=[], proc_root=str(empty_proc)))
    assert failed and result["msg"].startswith("option 'mode' = 'adaptive': drops caches globally")
    failed, result = run_module(drop_cache_loop, node.args(mode="global", paths=[]))
    assert not failed, result


@pytest.mark.parametrize(
    "options",
    [
        dict(mode="files", paths=["/"], interval=0.1, max_duration=20),
        dict(mode="adaptive", paths=[], threshold_mib=64, min_available_mib=512, drop_level=3, until_pid=1),
        dict(mode="adaptive", paths=["/"], act_below_free_mib=4096),
        dict(mode="global", paths=[], interval=1, until_url="http://127.0.0.1:8000/health", samples_file="/var/lib/s"),
    ],
)
def test_command_is_accepted_by_the_real_guard(options):
    """The argv the module builds parses to the same configuration in uma_guard's own parser."""
    req = _guard_service.GuardRequest(name="g", **options)
    config = _guard_service.validate(req)
    argv = _guard_service.guard_command(req, config, "/run/uma-vllm/guard-g.json")
    assert argv[:2] == ["/usr/bin/python3", "/usr/local/lib/uma-vllm/uma_guard.py"]
    parsed = uma_guard.validate(uma_guard.build_parser().parse_args(argv[2:]))
    for key in ("mode", "paths", "interval", "threshold_mib", "min_available_mib", "act_below_free_mib", "drop_level",
                "max_duration"):  # fmt: skip
        assert parsed[key] == config[key], key
    assert parsed["until_url"] == config["until_url"] and parsed["until_pid"] == config["until_pid"]
    assert parsed["status_file"] == "/run/uma-vllm/guard-g.json"


# -- _systemd -----------------------------------------------------------------------------------


def test_parse_show_and_fingerprint():
    shown = parse_show("ActiveState=active\nDescription=uma.vllm page-cache guard x [sha256:0123abcd4567ef89]\nX=a=b\n")
    assert shown["X"] == "a=b"
    assert description_fingerprint(shown["Description"]) == "0123abcd4567ef89"
    assert description_fingerprint("no fingerprint") is None


@pytest.mark.parametrize("name", ["llama70b", "a", "Qwen2.5-7B_fp8", "x" * 64])
def test_check_name_accepts(name):
    assert check_name("name", name) == name


@pytest.mark.parametrize("name", ["", "a b", "a/b", "..", "a..b", "@x", "x@y", "x" * 65, None, 5, "ä"])
def test_check_name_refuses(name):
    with pytest.raises(UmaError):
        check_name("name", name)


def test_systemd_require_and_run_argv():
    calls = []

    def runner(argv):
        calls.append(argv)
        return (1, "offline\n", "") if argv[1:] == ["is-system-running"] else (0, "", "")

    with pytest.raises(UmaError, match="needs a running systemd"):
        Systemd(runner, "/bin/systemctl", "/bin/systemd-run").require("state", "started")
    with pytest.raises(UmaError, match="systemctl/systemd-run were not found"):
        Systemd(runner, None, None).require("state", "started")
    Systemd(runner, "/bin/systemctl", "/bin/systemd-run").run(
        "u", ["/bin/true"], "d", ["A=1"], ["AccuracySec=1s"], on_active=5, setenv={"K": "v"}
    )
    assert calls[-1] == [
        "/bin/systemd-run",
        "--quiet",
        "--unit",
        "u",
        "--description",
        "d",
        "--collect",
        "--on-active=5s",
        "--property=A=1",
        "--timer-property=AccuracySec=1s",
        "--setenv=K=v",
        "/bin/true",
    ]


def test_systemd_failures_are_uma_errors():
    sd = Systemd(lambda argv: (1, "", "Access denied"), "/bin/systemctl", "/bin/systemd-run")
    with pytest.raises(UmaError, match="Access denied"):
        sd.stop("x.service")
    with pytest.raises(UmaError, match="could not be queried"):
        sd.show("x.service")
    assert Systemd(lambda argv: (5, "", "not loaded"), "/bin/systemctl").stop("x.service") is None


# -- _nodefiles ---------------------------------------------------------------------------------


def test_module_source_from_a_zip_like_ansiballz(tmp_path):
    payload = tmp_path / "payload.zip"
    with zipfile.ZipFile(payload, "w") as zf:
        zf.writestr("umazipdemo/__init__.py", "")
        zf.writestr("umazipdemo/prog.py", "VALUE = 42\n")
    sys.path.insert(0, str(payload))
    try:
        from umazipdemo import prog  # type: ignore[import-not-found]

        assert prog.VALUE == 42
        assert type(prog.__loader__).__name__ == "zipimporter"
        assert _nodefiles.module_source(prog) == "VALUE = 42\n"
    finally:
        sys.path.remove(str(payload))
        for name in ("umazipdemo.prog", "umazipdemo"):
            sys.modules.pop(name, None)


def test_plan_and_install_node_files(tmp_path):
    lib = tmp_path / "lib"
    files = _nodefiles.plan_node_files(str(lib))
    names = _nodefiles.program_names()
    assert [f.name for f in files] == names and all(f.changed for f in files)
    assert {"uma_guard.py", "uma_vllm_node/__init__.py", "uma_vllm_node/guard/program.py"} <= set(names)
    assert _nodefiles.install_node_files(files) == [str(lib / name) for name in names]
    again = _nodefiles.plan_node_files(str(lib))
    assert not any(f.changed for f in again)
    assert _nodefiles.install_node_files(again) == []
    assert _nodefiles.files_fingerprint(files) == _nodefiles.files_fingerprint(list(reversed(again)))
    found = sorted(os.path.relpath(os.path.join(d, f), str(lib)) for d, _s, fs in os.walk(lib) for f in fs)
    assert found == sorted(names)  # no temporary files left


@pytest.mark.parametrize("lib_dir, problem", [("relative", "not an absolute"), ("FILE", "not a directory")])
def test_plan_node_files_refuses(tmp_path, lib_dir, problem):
    if lib_dir == "FILE":
        lib_dir = str(tmp_path / "file")
        open(lib_dir, "w").close()
    with pytest.raises(UmaError, match=problem):
        _nodefiles.plan_node_files(lib_dir)


def test_install_failure_is_a_uma_error(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    item = _nodefiles.NodeFile(name="x.py", path=str(blocker / "lib" / "x.py"), content="x", before=None)
    with pytest.raises(UmaError) as info:
        _nodefiles.install_node_files([item])
    assert info.value.option == "lib_dir" and "could not be written" in info.value.message
