"""plugins/module_utils/plumbing/flow.py: the plan -> check/diff -> execute -> result flow, with plain functions."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.plumbing.flow import Outcome, Refusal, exit_module, run_flow


class Recorder:
    def __init__(self, changed=True, fail_plan=None, fail_execute=None):
        self.calls = []
        self.changed = changed
        self.fail_plan = fail_plan
        self.fail_execute = fail_execute

    def plan(self):
        self.calls.append("plan")
        if self.fail_plan:
            raise self.fail_plan
        return SimpleNamespace(changed=self.changed, warnings=["w1"])

    def execute(self, p):
        self.calls.append("execute")
        if self.fail_execute:
            raise self.fail_execute
        return {"done": True}

    def result(self, p, done):
        self.calls.append("result")
        return {"changed": p.changed, "done": done}


def run(rec, **kw):
    warned = []
    kw.setdefault("check_mode", False)
    kw.setdefault("want_diff", False)
    outcome = run_flow(rec.plan, rec.execute, rec.result, warn=warned.append, **kw)
    return outcome, warned


def test_a_change_is_executed_and_its_result_returned():
    rec = Recorder()
    outcome, _warned = run(rec)
    assert outcome == Outcome(False, {"changed": True, "done": {"done": True}})
    assert rec.calls == ["plan", "execute", "result"]


@pytest.mark.parametrize("changed, check_mode", [(True, True), (False, False), (False, True)])
def test_check_mode_or_no_change_never_executes(changed, check_mode):
    rec = Recorder(changed=changed)
    outcome, _warned = run(rec, check_mode=check_mode)
    assert rec.calls == ["plan", "result"] and outcome.fields["done"] is None and not outcome.failed


def test_diff_only_when_asked():
    assert "diff" not in run(Recorder(), diff=lambda p: "D")[0].fields
    assert run(Recorder(), diff=lambda p: "D", want_diff=True)[0].fields["diff"] == "D"


def test_warnings_go_to_warn_before_execute():
    rec = Recorder()
    _outcome, warned = run(rec, warnings=lambda p: p.warnings)
    assert warned == ["w1"]


def test_a_refused_plan_names_the_option_and_runs_nothing_else():
    rec = Recorder(fail_plan=UmaError("duration", 0, "is too short", "Give 1 or more."))
    outcome, _warned = run(rec)
    assert outcome.failed and outcome.fields["option"] == "duration" and "duration" in outcome.fields["msg"]
    assert rec.calls == ["plan"]


def test_a_failed_execute_returns_the_failed_result_beside_the_message():
    rec = Recorder(fail_execute=UmaError("state", "x", "failed", "Fix it."))
    outcome, _warned = run(rec, failed_result=lambda p: {"unit": "u"})
    assert outcome.failed and outcome.fields["unit"] == "u" and outcome.fields["option"] == "state"
    assert "result" not in rec.calls


def test_refuse_stops_before_warnings_and_execute():
    rec = Recorder()

    def refuse(p):
        raise Refusal("no: conflicts", conflicts=[1])

    outcome, warned = run(rec, refuse=refuse, warnings=lambda p: p.warnings)
    assert outcome == Outcome(True, {"msg": "no: conflicts", "conflicts": [1]})
    assert warned == [] and rec.calls == ["plan"]


def test_translate_turns_another_error_into_a_named_one():
    rec = Recorder(fail_execute=PermissionError(13, "denied", "/etc/x"))
    outcome, _warned = run(
        rec, translate=(OSError, lambda err: UmaError("path", err.filename, "is not writable", "Fix."))
    )
    assert outcome.failed and outcome.fields["option"] == "path"
    with pytest.raises(PermissionError):
        run(Recorder(fail_execute=PermissionError(13, "denied")))  # not translated: not swallowed


def test_exit_module_ends_with_fail_or_exit():
    seen = []
    module = SimpleNamespace(
        fail_json=lambda **kw: seen.append(("fail", kw)), exit_json=lambda **kw: seen.append(("exit", kw))
    )
    exit_module(module, Outcome(False, {"changed": False}))
    assert seen == [("exit", {"changed": False})]
