"""Issue 21: every role's defaults/main.yml and meta/argument_specs.yml say the same thing. Each default
is documented with a matching type and the same default (a templated default: the value it renders to
from the role's other defaults with no inventory, or the template itself), and every default the spec
documents is in defaults/main.yml. Before, vllm_service_hardening listed 3 keys in the spec and 13 in
the defaults."""

from __future__ import annotations

import pathlib

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROLES = sorted(p.parent.parent.name for p in ROOT.glob("roles/*/defaults/main.yml"))
TYPES = {
    "int": (int,),
    "float": (int, float),
    "str": (str,),
    "path": (str,),
    "bool": (bool,),
    "list": (list,),
    "dict": (dict,),
    "raw": (object,),
}


def _load(role):
    defaults = yaml.safe_load((ROOT / "roles" / role / "defaults/main.yml").read_text()) or {}
    spec = yaml.safe_load((ROOT / "roles" / role / "meta/argument_specs.yml").read_text())
    return defaults, spec["argument_specs"]["main"].get("options") or {}


def _rendered(defaults):
    """Each default as the role sees it with nothing from the inventory (templates rendered)."""
    variables = {k: trust_as_template(v) if isinstance(v, str) else v for k, v in defaults.items()}
    templar = Templar(loader=DataLoader(), variables=variables)
    return {
        k: templar.template(trust_as_template(v)) if isinstance(v, str) and "{{" in v else v
        for k, v in defaults.items()
    }


def _problems(defaults, options):
    problems = []
    rendered = _rendered(defaults)
    for name, value in defaults.items():
        if name not in options:
            problems.append("%s: in defaults/main.yml, not documented in meta/argument_specs.yml" % name)
            continue
        option = options[name]
        kind = option.get("type", "str")
        templated = isinstance(value, str) and "{{" in value
        effective = rendered[name]
        if effective is not None and (
            not isinstance(effective, TYPES[kind]) or (kind in ("int", "float") and isinstance(effective, bool))
        ):
            problems.append("%s: default %r is not of the documented type %s" % (name, effective, kind))
        documented = option.get("default")
        if templated:
            ok = documented in (value, effective) or (documented is None and effective is None)
        else:
            ok = documented == value
        if not ok:
            problems.append("%s: argument_specs default %r, defaults/main.yml %r" % (name, documented, value))
    for name, option in options.items():
        if "default" in option and name not in defaults:
            problems.append("%s: argument_specs has a default, defaults/main.yml has no such variable" % name)
    return problems


@pytest.mark.parametrize("role", ROLES)
def test_argument_specs_equal_defaults(role):
    defaults, options = _load(role)
    assert _problems(defaults, options) == []


def test_the_comparison_catches_what_issue_21_found():
    """The old vllm_service_hardening (3 keys documented, 13 in defaults) and the other kinds of drift."""
    defaults = {"x_hardening": {"A": "yes", "B": "yes"}, "x_n": 5, "x_t": "{{ x_n }}", "x_u": "{{ x_n }}"}
    options = {
        "x_hardening": {"type": "dict", "default": {"A": "yes"}},
        "x_n": {"type": "str", "default": 5},
        "x_t": {"type": "int", "default": 6},
        "x_u": {"type": "int"},
        "x_gone": {"type": "int", "default": 1},
    }
    problems = " | ".join(_problems(defaults, options))
    for name in (
        "x_hardening: argument_specs default",
        "x_n: default 5 is not of the documented type str",
        "x_t: argument_specs default 6",
        "x_u: argument_specs default None",
        "x_gone: argument_specs has",
    ):
        assert name in problems, problems
    assert "x_undocumented" in " ".join(_problems({"x_undocumented": 1}, {}))
