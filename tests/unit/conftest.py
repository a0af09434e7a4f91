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

# the caught exit of a module's main(), shared with the other in-process runner
from module_exit import ModuleExit as _Exit
from module_exit import exit_json as _exit_json
from module_exit import fail_json as _fail_json


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
