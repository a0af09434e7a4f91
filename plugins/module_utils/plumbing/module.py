# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""AnsibleModule construction that refuses bad numbers cleanly (private to the collection).

ansible-core's own type checks let three kinds of bad number through or
crash on them:

- ``type: int`` with ``inf`` / ``nan`` / ``1e999`` raises OverflowError or
  ValueError out of ``AnsibleModule()`` (a traceback, MODULE FAILURE);
- ``type: int`` / ``type: float`` accept ``true`` as 1;
- ``type: float`` accepts ``inf`` and ``nan``.

:func:`strict_module` builds the module and turns each of them into a
``fail_json`` that names the option, the value and the fix.
"""

from __future__ import annotations

import math
import re
from typing import Any, Dict

from ansible.module_utils import basic

NUMERIC = ("int", "float")
# What a number written in an inventory looks like. Python's int()/float() also take
# other scripts' digits ('\u0663' is 3), which ansible-core's checks then accept.
_PLAIN_NUMBER_RE = re.compile(r"\s*[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?\s*", re.ASCII)


def _raw_args() -> Dict[str, Any]:
    try:
        loaded = basic._load_params()
    except Exception:
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _problem(option: str, kind: str, raw: Any, value: Any) -> str:
    if isinstance(raw, bool):
        return "option '%s' = %s: is a boolean, not a number. Give a %s." % (
            option,
            raw,
            "whole number" if kind == "int" else "number",
        )
    return "option '%s' = %r: is not a finite number. Give a %s." % (
        option,
        raw,
        "whole number" if kind == "int" else "number",
    )


def _non_finite(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, str):
        try:
            return not math.isfinite(float(value))
        except ValueError:
            return False
    return False


def strict_module(argument_spec: Dict[str, Dict[str, Any]], **kwargs: Any) -> basic.AnsibleModule:
    raw = _raw_args()
    numeric = {k: v.get("type") for k, v in argument_spec.items() if v.get("type") in NUMERIC}
    try:
        module = basic.AnsibleModule(argument_spec=argument_spec, **kwargs)
    except (OverflowError, ValueError, ArithmeticError):
        # ansible-core's int check crashed on a non-finite number: rebuild without types to report it
        loose = {k: dict(v, type="raw") if v.get("type") in NUMERIC else v for k, v in argument_spec.items()}
        module = basic.AnsibleModule(argument_spec=loose, **kwargs)
        for option, kind in sorted(numeric.items()):
            if _non_finite(raw.get(option)):
                module.fail_json(msg=_problem(option, kind, raw.get(option), None), option=option)
        module.fail_json(msg="the options could not be read as numbers: %s" % ", ".join(sorted(numeric)))
    for option, kind in sorted(numeric.items()):
        value = raw.get(option)
        if value is None:
            continue
        if isinstance(value, bool) or _non_finite(value) or _non_finite(module.params.get(option)):
            module.fail_json(msg=_problem(option, kind, value, module.params.get(option)), option=option)
        if isinstance(value, str) and not _PLAIN_NUMBER_RE.fullmatch(value):
            module.fail_json(
                msg="option '%s' = %r: is not a plain decimal number (digits 0-9). Give a %s."
                % (option, value, "whole number" if kind == "int" else "number"),
                option=option,
            )
    return module
