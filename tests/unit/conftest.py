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
