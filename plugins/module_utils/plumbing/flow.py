# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one flow of the collection's state modules: plan -> check mode / diff -> execute -> result.

Every such module (``readahead_window``, ``drop_cache_loop``, ``uma_sysctl``) does the same:

1. ``plan()`` reads the node and decides what would change, touching nothing; a refusal
   (:class:`UmaError`) fails the task naming the option;
2. optional ``refuse(plan)``: a last word before anything is done (e.g. ``conflicts=fail``);
3. ``warnings(plan)`` are passed to the module's ``warn``;
4. ``execute(plan)`` runs only when the plan changes something and the run is not check
   mode; a refusal there fails the task with ``failed_result(plan)`` beside the message;
5. ``result(plan, done)`` is the task's return (``done``: what execute returned, None when it
   did not run), with ``diff(plan)`` when Ansible asked for ``--diff``.

:func:`run_flow` is that sequence without Ansible (unit tests call it with plain functions);
:func:`exit_module` hands its outcome to an AnsibleModule (``fail_json`` / ``exit_json``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Optional, Tuple, Type

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError


@dataclass
class Outcome:
    """What the task ends with: ``fields`` go to fail_json (failed) or exit_json."""

    failed: bool
    fields: Dict[str, Any] = field(default_factory=dict)


class Refusal(Exception):
    """A failure that is not one option's fault: the message and the fields to return beside it."""

    def __init__(self, msg: str, **fields: Any) -> None:
        super().__init__(msg)
        self.msg = msg
        self.fields = fields


def _failure(err: UmaError, extra: Optional[Dict[str, Any]] = None) -> Outcome:
    fields = dict(extra or {})
    fields.update(msg=err.message, option=err.option)
    return Outcome(True, fields)


def run_flow(
    plan: Callable[[], Any],
    execute: Callable[[Any], Any],
    result: Callable[[Any, Any], Dict[str, Any]],
    *,
    check_mode: bool,
    want_diff: bool,
    warn: Callable[[str], Any] = lambda _msg: None,
    diff: Optional[Callable[[Any], Any]] = None,
    warnings: Optional[Callable[[Any], Iterable[str]]] = None,
    refuse: Optional[Callable[[Any], None]] = None,
    failed_result: Optional[Callable[[Any], Dict[str, Any]]] = None,
    translate: Tuple[Type[BaseException], Callable[[Any], UmaError]] = (),  # type: ignore[assignment]
) -> Outcome:
    """Run the flow; ``translate`` = (exception type, function to an UmaError) for e.g. OSError.

    The plan object must have a ``changed`` attribute.
    """
    catch: Tuple[Type[BaseException], ...] = (UmaError, translate[0]) if translate else (UmaError,)

    def as_uma(err: BaseException) -> UmaError:
        return err if isinstance(err, UmaError) else translate[1](err)

    try:
        p = plan()
    except catch as err:
        return _failure(as_uma(err))
    if refuse is not None:
        try:
            refuse(p)
        except Refusal as refusal:
            return Outcome(True, dict(refusal.fields, msg=refusal.msg))
    for message in warnings(p) if warnings is not None else ():
        warn(message)
    done = None
    if p.changed and not check_mode:
        try:
            done = execute(p)
        except catch as err:
            return _failure(as_uma(err), failed_result(p) if failed_result is not None else None)
    out = result(p, done)
    if want_diff and diff is not None:
        out["diff"] = diff(p)
    return Outcome(False, out)


def exit_module(module: Any, outcome: Outcome) -> None:
    """End an AnsibleModule with the outcome (never returns)."""
    if outcome.failed:
        module.fail_json(**outcome.fields)
    module.exit_json(**outcome.fields)


def run_module(module: Any, plan: Callable[[], Any], execute: Callable[[Any], Any], result: Any, **kw: Any) -> None:
    """:func:`run_flow` with the module's check mode, ``--diff`` and ``warn``, then :func:`exit_module`."""
    outcome = run_flow(
        plan, execute, result, check_mode=module.check_mode, want_diff=bool(module._diff), warn=module.warn, **kw
    )
    exit_module(module, outcome)
