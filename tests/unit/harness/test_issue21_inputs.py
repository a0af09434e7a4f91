"""Bad-input harness for what issue 21 added to the roles' controller-side checks: an engine's
api_auth, host, secrets and the cluster address (vllm_service_check), vllm_service_api_auth and
vllm_service_health_timeout_s, vllm_service_prune (vllm_service_prune_plan) and the old names of
renamed variables (role_args_renamed). Each case makes 1-3 inputs bad; the outcome must be
acceptance, or refusals of which at least one names a bad input; any other exception is a
traceback in the play."""

from __future__ import annotations

import os

import harness_core as h
import pytest
from ansible.errors import AnsibleFilterError
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ansible_collections.uma.vllm.plugins.filter import role_args as ra
from ansible_collections.uma.vllm.plugins.filter import vllm_service as vs

EXAMPLES = int(os.environ.get("UMA_HARNESS_EXAMPLES", "1000"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)
BASE = {"runtime": "native", "native_command": ["vllm", "serve"], "api_host": "0.0.0.0", "api_auth": "key"}
# what the case makes bad -> the text a refusal names it by
CHECK_INPUTS = {
    "engine.api_auth": "api_auth",
    "engine.host": ".host",
    "engine.secrets": ".secrets",
    "settings.api_auth": "vllm_service_api_auth",
    "settings.health_timeout_s": "vllm_service_health_timeout_s",
    "settings.node_addr": "uma_cluster_addr",
    "addrs.head": "uma_cluster_addr",
}


def _outcome(target, names, errors, label, case):
    counts = h.COUNTS[target]
    if not all(isinstance(e, str) for e in errors):
        counts["nonsense"] += 1
        h.EXAMPLES[target].append("nonsense: %s -> %r" % (label, errors))
    elif not errors:
        counts["ok"] += 1
    elif any(n in " ".join(errors) for n in names) and all(" Fix: " in e for e in errors):
        counts["refused"] += 1
    else:
        counts["unclear"] += 1
        if len(h.EXAMPLES[target]) < 20:
            h.EXAMPLES[target].append("unclear: %s %r -> %s" % (label, case, errors))


def test_vllm_service_check_issue21_inputs():
    target = "filter:check(issue21)"
    h.COUNTS.pop(target, None)
    h.EXAMPLES.pop(target, None)

    @SETTINGS
    @given(st.data())
    def case(data):
        h.COUNTS[target]["cases"] += 1
        engine = {"name": "e", "port": 8000, "model_path": "/m", "secrets": {"VLLM_API_KEY": "k"},
                  "nodes": ["ai2", "ai1"], "plan": {"tensor_parallel_size": 2}}  # fmt: skip
        settings_ = dict(BASE, health_timeout_s=1800, node_addr="10.0.0.1")
        addrs = {"ai2": "10.0.0.2"}
        bad = data.draw(st.permutations(sorted(CHECK_INPUTS)), label="order")[: data.draw(st.integers(1, 3), label="n")]
        made = {}
        for name in bad:
            value = data.draw(st.sampled_from(h.GENERIC), label=name)
            made[name] = value
            where, key = name.split(".")
            {"engine": engine, "settings": settings_, "addrs": addrs}[where]["ai2" if where == "addrs" else key] = value
        try:
            errors = vs.check(vs.host_engines([engine], "ai1", "mp"), settings_, ["ai1", "ai2"], addrs)
        except Exception as exc:  # an exception here is a traceback in the play
            if isinstance(exc, AnsibleFilterError) and any(CHECK_INPUTS[n] in str(exc) for n in bad):
                h.COUNTS[target]["refused"] += 1
                return
            h.COUNTS[target]["traceback"] += 1
            h.EXAMPLES[target].append("traceback: %r -> %s: %s" % (made, type(exc).__name__, exc))
            return
        _outcome(target, [CHECK_INPUTS[n] for n in bad], errors, "check", made)

    case()
    h.report(target, minimum=EXAMPLES)


def test_vllm_service_prune_plan_inputs():
    target = "filter:prune_plan"
    h.COUNTS.pop(target, None)
    h.EXAMPLES.pop(target, None)
    for value in [*h.GENERIC, "list", "remove", "none", "LIST", "true"]:
        h.COUNTS[target]["cases"] += 1
        try:
            plan = vs.prune_plan(["a", "b"], ["a"], [], value)
        except Exception as exc:
            ok = isinstance(exc, AnsibleFilterError) and "vllm_service_prune = " in str(exc) and " Fix: " in str(exc)
            h.COUNTS[target]["refused" if ok else "traceback"] += 1
            if not ok:
                h.EXAMPLES[target].append("%r -> %s: %s" % (value, type(exc).__name__, exc))
            continue
        assert value in ("list", "remove", "none"), value
        assert plan["remove"] == (["b"] if value == "remove" else [])
        h.COUNTS[target]["ok"] += 1
    h.report(target, minimum=len(h.GENERIC))


@pytest.mark.parametrize("role", sorted(ra.RENAMED))
def test_renamed_variables_inputs(role):
    import pathlib

    import yaml

    root = pathlib.Path(__file__).resolve().parents[3]
    spec = yaml.safe_load((root / "roles" / role / "meta" / "argument_specs.yml").read_text())
    options = spec["argument_specs"]["main"]["options"]
    target = "preflight:renamed:" + role
    h.COUNTS.pop(target, None)
    h.EXAMPLES.pop(target, None)
    for old, (new, _convert) in sorted(ra.RENAMED[role].items()):
        for value in h.GENERIC:
            for current in (options[new].get("default"), value, 3):
                h.COUNTS[target]["cases"] += 1
                try:
                    facts, messages, errors = ra.renamed_values(role, {old: value, new: current}, options)
                except Exception as exc:
                    h.COUNTS[target]["traceback"] += 1
                    h.EXAMPLES[target].append("%s=%r -> %s: %s" % (old, value, type(exc).__name__, exc))
                    continue
                if value is None:
                    assert facts == {} and errors == [] and messages == []
                    h.COUNTS[target]["ok"] += 1
                    continue
                if errors:
                    _outcome(target, [old], errors, old, value)
                else:
                    assert set(facts) == {new} and len(messages) == 1
                    h.COUNTS[target]["ok"] += 1
    h.report(target, minimum=len(h.GENERIC))
