# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Bad-input harness for the roles: every role's meta/argument_specs.yml through Ansible's own validation.

The roles validate their variables with ansible.builtin.validate_argument_spec,
which runs ansible-core's ArgumentSpecValidator on the entry point's options;
before it, their dependency uma.vllm.preflight checks the whole-number variables
(plugins/filter/role_args.py, the same function here) because core crashes on inf.
Each case makes 1-3 variables bad and requires either errors that name every
bad variable, or acceptance of values the spec's type really allows; an
exception escaping the validator is a traceback in the play.
"""

from __future__ import annotations

import os
import pathlib

import harness_core as h
import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ansible_collections.uma.vllm.plugins.filter.role_args import role_args_errors

ROOT = pathlib.Path(__file__).resolve().parents[3]
ROLES = sorted(p.parent.parent.name for p in ROOT.glob("roles/*/meta/argument_specs.yml"))
EXAMPLES = int(os.environ.get("UMA_HARNESS_EXAMPLES", "1000"))


def _spec(role):
    data = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())
    options = data["argument_specs"]["main"].get("options") or {}

    def clean(opts):
        out = {}
        for name, raw in opts.items():
            opt = {k: v for k, v in raw.items() if k not in ("description", "version_added")}
            if "options" in opt:
                opt["options"] = clean(opt["options"])
            out[name] = opt
        return out

    return clean(options)


def _defaults(role):
    path = ROOT / "roles" / role / "defaults" / "main.yml"
    return yaml.safe_load(path.read_text()) or {} if path.exists() else {}


def _has_preflight(role):
    meta = yaml.safe_load((ROOT / "roles" / role / "meta" / "main.yml").read_text()) or {}
    return any(
        isinstance(dep, dict) and dep.get("role") == "uma.vllm.preflight" and dep.get("preflight_role") == role
        for dep in meta.get("dependencies") or []
    )


def _refused_or_unclear(target, params, messages, bad, label):
    """A refusal counts as clear when it names one of the options the case made bad."""
    counts = h.COUNTS[target]
    if any(n in messages for n in bad):
        counts["refused"] += 1
        return
    counts["unclear"] += 1
    if len(h.EXAMPLES[target]) < 20:
        h.EXAMPLES[target].append("%s: %r -> %s" % (label, params, messages))


def _from_check_type_int(exc):
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "check_type_int":
            return True
        tb = tb.tb_next
    return False


@pytest.mark.parametrize("role", ROLES)
def test_role_argument_specs(role):
    spec = _spec(role)
    target = "role:" + role
    h.COUNTS.pop(target, None)
    h.EXAMPLES.pop(target, None)
    validator = ArgumentSpecValidator(spec)
    names = sorted(spec)
    preflight = _has_preflight(role)

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def case(data):
        params = {}
        bad = data.draw(st.permutations(names), label="order")[: data.draw(st.integers(1, 3), label="n")]
        for name in bad:
            params[name] = data.draw(st.sampled_from(h.GENERIC), label=name)
        counts = h.COUNTS[target]
        counts["cases"] += 1
        # the role's first task (uma.vllm.preflight), then ansible-core's validation
        first = role_args_errors(params, spec) if preflight else []
        if first:
            _refused_or_unclear(target, params, " ".join(first), bad, "unclear (preflight)")
            return
        try:
            result = validator.validate(params)
        except OverflowError as exc:
            # ansible-core's check_type_int does int(Decimal('Infinity')): a core defect the
            # preflight must catch first. Counted apart and fails the test below.
            if "Infinity" not in str(exc) or not _from_check_type_int(exc):
                raise
            counts["core"] += 1
            return
        except Exception as exc:  # an exception here is a traceback in the play
            counts["traceback"] += 1
            if len(h.EXAMPLES[target]) < 20:
                h.EXAMPLES[target].append("traceback: %r -> %s: %s" % (params, type(exc).__name__, exc))
            return
        if not result.error_messages:
            counts["ok"] += 1
            return
        _refused_or_unclear(target, params, " ".join(result.error_messages), bad, "unclear")

    case()
    # uma.vllm.preflight has one option: Hypothesis runs out of distinct cases (138) before 1,000
    h.report(target, minimum=EXAMPLES if len(names) > 1 else 100)
    core = h.COUNTS[target]["core"]
    assert core == 0, "%s: %d cases reached ansible-core's OverflowError (no variable, no fix)" % (target, core)
