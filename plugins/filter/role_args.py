# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter of the uma.vllm.preflight role: the whole-number role variables checked before
ansible-core's own argument_specs validation.

ansible-core's ``check_type_int`` raises OverflowError on ``inf`` / ``Infinity``
(``int(Decimal('Infinity'))``), so a ``type: int`` role variable set to ``.inf`` ends the
play with "Task failed: cannot convert Infinity to integer": no variable, no fix. It also
takes ``true`` as 1, ``1e308`` / ``10**40`` as huge integers and ``'٣'`` as 3. This filter
refuses all of them first, each message naming the variable, the value and the fix.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Dict, List, Optional

LIMIT = 2**63 - 1
_INT_RE = re.compile(r"^[-+]?[0-9]+$")


def _show(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def int_problem(value: Any) -> Optional[str]:
    """None when ansible-core's type int takes ``value`` as a sane whole number, else why not."""
    if isinstance(value, bool):
        return "is a boolean, not a whole number"
    if isinstance(value, int):
        return None if abs(value) <= LIMIT else "is out of range (more than 2^63 - 1)"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "is not a finite number"
        if value != int(value):
            return "has a fractional part"
        return None if abs(value) <= LIMIT else "is out of range (more than 2^63 - 1)"
    if isinstance(value, str):
        text = value.strip()
        if not _INT_RE.match(text):
            return "is not a whole number in ASCII digits"
        return None if abs(int(text)) <= LIMIT else "is out of range (more than 2^63 - 1)"
    return "is a %s, not a whole number" % type(value).__name__


def _fix(spec: Dict[str, Any]) -> str:
    default = spec.get("default")
    if isinstance(default, int) and not isinstance(default, bool):
        return "Fix: give a whole number, e.g. %d (the default), or leave it unset." % default
    return "Fix: give a whole number (e.g. 30), or leave it unset."


def _walk(name: str, value: Any, spec: Dict[str, Any], errors: List[str]) -> None:
    if value is None or not isinstance(spec, dict):
        return
    kind = spec.get("type", "str")
    if kind == "int":
        problem = int_problem(value)
        if problem:
            errors.append("%s = %s %s (type int). %s" % (name, _show(value), problem, _fix(spec)))
        return
    elements = spec.get("elements")
    if kind == "list" and isinstance(value, list):
        for index, item in enumerate(value):
            where = "%s[%d]" % (name, index)
            if elements == "int":
                problem = int_problem(item)
                if problem:
                    errors.append(
                        "%s = %s %s (a list of whole numbers). Fix: give whole numbers." % (where, _show(item), problem)
                    )
            elif elements == "dict" and isinstance(item, dict) and isinstance(spec.get("options"), dict):
                _walk_options(where, item, spec["options"], errors)
        return
    if kind == "dict" and isinstance(value, dict) and isinstance(spec.get("options"), dict):
        _walk_options(name, value, spec["options"], errors)


def _walk_options(prefix: str, values: Dict[str, Any], options: Dict[str, Any], errors: List[str]) -> None:
    for key in sorted(options):
        if key in values:
            _walk("%s.%s" % (prefix, key) if prefix else key, values[key], options[key], errors)


def role_args_errors(values: Dict[str, Any], options: Dict[str, Any]) -> List[str]:
    """``values``: the role's variables by name (unset ones left out or None); ``options``: the
    entry point's argument_specs options. Returns one message per whole-number variable
    (nested ones too, e.g. ``launch_wrapper_engines[0].port``) that ansible-core would
    crash on or take wrongly."""
    errors: List[str] = []
    if isinstance(values, dict) and isinstance(options, dict):
        _walk_options("", values, options, errors)
    return errors


def role_args_names(options: Dict[str, Any]) -> List[str]:
    """The top-level variables whose spec holds a whole number somewhere (the ones to read)."""

    def has_int(spec: Any) -> bool:
        if not isinstance(spec, dict):
            return False
        if spec.get("type") == "int" or spec.get("elements") == "int":
            return True
        return any(has_int(sub) for sub in (spec.get("options") or {}).values())

    return sorted(name for name, spec in (options or {}).items() if has_int(spec))


class FilterModule:
    def filters(self):
        return {"role_args_errors": role_args_errors, "role_args_names": role_args_names}
