# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the uma.vllm.preflight role: the whole-number role variables checked before
ansible-core's own argument_specs validation, and the old names of renamed variables (issue 21:
units in every name) taken over with a deprecation warning.

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
from typing import Any, Callable, Dict, List, Optional, Tuple

from ansible.errors import AnsibleFilterError
from ansible.utils.display import Display

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


# --------------------------------------------------------------------------
# Renamed variables: the old name still works for a while, with a deprecation warning.

UNSET = "__uma_unset__"
_SPAN_RE = re.compile(r"^\s*([0-9]+)\s*(s|sec|m|min|h|hr)?\s*$")
_SPAN_UNITS = {None: 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600}


def _same(value: Any) -> Any:
    return value


def span_seconds(value: Any) -> int:
    """A systemd time span of whole seconds or more (``15s``, ``1min``, ``15``) in seconds."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    match = _SPAN_RE.match(str(value)) if isinstance(value, (str, int)) and not isinstance(value, bool) else None
    if not match or int(match.group(1)) <= 0:
        raise ValueError("is not a time span of whole seconds (15s, 1min)")
    return int(match.group(1)) * _SPAN_UNITS[match.group(2)]


# role -> old name -> (new name, how the old value becomes the new one)
RENAMED: Dict[str, Dict[str, Tuple[str, Callable[[Any], Any]]]] = {
    "vllm_service": {"vllm_service_restart_sec": ("vllm_service_restart_s", _same)},
    "launch_wrapper": {
        "launch_wrapper_guard_interval": ("launch_wrapper_guard_interval_s", _same),
        "launch_wrapper_guard_max_duration": ("launch_wrapper_guard_max_duration_s", _same),
    },
    "monitoring": {"monitoring_interval": ("monitoring_interval_s", span_seconds)},
}


def role_args_renamed_names(role: Any) -> List[str]:
    """The old names of ``role``'s renamed variables, then their new names (the variables to read)."""
    renames = RENAMED.get(role) or {}
    return sorted(renames) + [renames[old][0] for old in sorted(renames)]


def renamed_values(
    role: Any, values: Dict[str, Any], options: Dict[str, Any]
) -> Tuple[Dict[str, Any], List[str], List[str]]:
    """``values``: the old and new names by name (unset = None). Returns the new names to set from
    old ones, the deprecation messages and the errors (both names set to different values, an old
    value that cannot be converted), each naming the variables, the value and the fix."""
    facts: Dict[str, Any] = {}
    messages: List[str] = []
    errors: List[str] = []
    # the preflight reads unset variables as UNSET (the vars lookup's default cannot be None)
    values = {k: None if v == UNSET else v for k, v in (values or {}).items()}
    for old, (new, convert) in sorted((RENAMED.get(role) or {}).items()):
        value = (values or {}).get(old)
        if value is None:
            continue
        try:
            converted = convert(value)
        except ValueError as err:
            errors.append("%s = %s %s. Fix: use %s (seconds, e.g. 15) instead." % (old, _show(value), err, new))
            continue
        wrong = role_args_errors({new: converted}, {new: (options or {}).get(new) or {}})
        if wrong:
            errors.extend("%s (set through the deprecated %s; use %s)" % (w, old, new) for w in wrong)
            continue
        current = (values or {}).get(new)
        default = ((options or {}).get(new) or {}).get("default")
        if current is not None and current not in (default, converted):
            errors.append(
                "%s = %s and its new name %s = %s are both set. Fix: keep %s only (the old name is deprecated)."
                % (old, _show(value), new, _show(current), new)
            )
            continue
        facts[new] = converted
        messages.append(
            "uma.vllm.%s: the variable %s is deprecated, use %s (the unit is in the name now; value %s -> %s)."
            % (role, old, new, _show(value), _show(converted))
        )
    return facts, messages, errors


def role_args_renamed(values: Dict[str, Any], role: Any, options: Dict[str, Any]) -> Dict[str, Any]:
    """The new names to set from the old ones the inventory still uses, with a deprecation warning each;
    an error (AnsibleFilterError) names both variables when they disagree."""
    facts, messages, errors = renamed_values(role, values, options)
    if errors:
        raise AnsibleFilterError(" | ".join(errors))
    for message in messages:
        Display().deprecated(message, version="2.0.0", collection_name="uma.vllm")
    return facts


class FilterModule:
    def filters(self):
        return {
            "role_args_errors": role_args_errors,
            "role_args_names": role_args_names,
            "role_args_renamed_names": role_args_renamed_names,
            "role_args_renamed": role_args_renamed,
        }
