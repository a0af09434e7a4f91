"""A module's exit, caught: ``exit_json``/``fail_json`` replaced by functions that raise
``ModuleExit`` with the result, so a unit test (conftest.run_module) or the bad-input harness
(harness/harness_core.py) can run a module's ``main()`` in-process and read what it returned."""

from __future__ import annotations

from typing import Any, Dict


class ModuleExit(Exception):
    def __init__(self, failed: bool, result: Dict[str, Any]) -> None:
        super().__init__(result.get("msg", ""))
        self.failed = failed
        self.result = result


def exit_json(self, **kwargs):
    kwargs.setdefault("changed", False)
    raise ModuleExit(False, kwargs)


def fail_json(self, msg, **kwargs):
    kwargs["msg"] = msg
    kwargs["failed"] = True
    raise ModuleExit(True, kwargs)
