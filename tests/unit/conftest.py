"""Shared fixtures for the unit tests.

``run_module(module, args, check_mode=False, diff=False)`` runs a module's
``main()`` in-process and returns ``(failed, result)``: the dict that
``exit_json`` or ``fail_json`` was called with. A traceback escaping the module
fails the test, so "no traceback for bad input" is checked by every call.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Tuple

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args


class _Exit(Exception):
    def __init__(self, failed: bool, result: Dict[str, Any]) -> None:
        super().__init__(result.get("msg", ""))
        self.failed = failed
        self.result = result


def _exit_json(self, **kwargs):
    kwargs.setdefault("changed", False)
    raise _Exit(False, kwargs)


def _fail_json(self, msg, **kwargs):
    kwargs["msg"] = msg
    kwargs["failed"] = True
    raise _Exit(True, kwargs)


@pytest.fixture
def run_module(monkeypatch):
    monkeypatch.setattr(basic.AnsibleModule, "exit_json", _exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", _fail_json)

    def run(module, args: Dict[str, Any], check_mode: bool = False, diff: bool = False) -> Tuple[bool, Dict[str, Any]]:
        full = dict(args)
        full["_ansible_check_mode"] = check_mode
        full["_ansible_diff"] = diff
        full.setdefault("_ansible_remote_tmp", "/tmp")
        with patch_module_args(full):
            try:
                module.main()
            except _Exit as done:
                json.dumps(done.result, default=str)  # results must serialise
                return done.failed, done.result
        raise AssertionError("module returned without exit_json/fail_json")

    return run


# ---- node-side counts (issue 22): the tests of the node programs' writes and state files, tallied
# so that every run prints them beside the bad-input harness's table. A failed case is counted as
# what it guards against (a write that followed a symlink, a damaged state file not set aside).
_NODE_GROUPS = {
    "test_node_writes.py": "writes: planted symlink / unsafe directory",
    "test_node_state_damage.py::test_sigkill": "power loss: SIGKILL mid-write",
    "test_node_state_damage.py::test_each_state_file": "power loss: state file truncated / zeroed",
    "test_node_state_damage.py": "damaged state files set aside",
}
_NODE_COUNTS: Dict[str, Dict[str, int]] = {}


def _node_group(nodeid: str) -> Any:
    for key, group in _NODE_GROUPS.items():  # the longer keys first (dict order above)
        path, _sep, prefix = key.partition("::")
        if ("/" + path + "::") in ("/" + nodeid) and (not prefix or ("::" + prefix) in nodeid):
            return group
    return None


def pytest_runtest_logreport(report):
    group = _node_group(report.nodeid)
    if group is None or (report.when != "call" and not (report.failed or report.skipped)):
        return
    counts = _NODE_COUNTS.setdefault(group, {"cases": 0, "failed": 0, "skipped": 0})
    counts["cases"] += 1
    counts["failed"] += int(report.failed)
    counts["skipped"] += int(report.skipped)


def pytest_terminal_summary(terminalreporter):
    if not _NODE_COUNTS:
        return
    terminalreporter.section("node programs: writes and state files")
    terminalreporter.write_line("%-44s %6s %7s %8s" % ("group", "cases", "failed", "skipped"))
    for group in sorted(_NODE_COUNTS):
        c = _NODE_COUNTS[group]
        terminalreporter.write_line("%-44s %6d %7d %8d" % (group, c["cases"], c["failed"], c["skipped"]))
