"""Issue 21: no engine exposed without a key, the cluster address of every multi-node rank, one health
timeout end to end, and prune that removes only when told (the filters behind roles/vllm_service)."""

from __future__ import annotations

import json
import os

import pytest
from vllm_service_cases import ADDRS, HOSTS, NATIVE, engine, one, plan

from ansible_collections.uma.vllm.plugins.filter import vllm_service as vs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))


def keyed(e):
    return dict(e, secrets=dict({"VLLM_API_KEY": "k"}, **(e.get("secrets") or {})))


# issue 21: an API beyond loopback needs a key unless api_auth: none; an empty secret is refused
AUTH_CHECKS = [
    ("no key on 0.0.0.0", [engine()], NATIVE, "vllm_service_api_host = '0.0.0.0' lets engine e's API"),
    ("no key on a LAN address", [engine(host="192.168.1.5")], NATIVE, "vllm_service_engines[e].host = '192.168.1.5'"),
    ("no key on ::", [engine(host="::")], NATIVE, ".host = '::' lets engine e's API"),
    ("no key on a host name", [engine(host="spark1.lan")], NATIVE, ".host = 'spark1.lan' lets"),
    ("no key, loopback", [engine(host="127.0.0.1")], NATIVE, None),
    ("no key, 127.0.0.2", [engine(host="127.0.0.2")], NATIVE, None),
    ("no key, ::1", [engine(host="::1")], NATIVE, None),
    ("no key, localhost", [engine()], dict(NATIVE, api_host="localhost"), None),
    ("no key, api_auth none", [engine(api_auth="none")], NATIVE, None),
    ("no key, role api_auth none", [engine()], dict(NATIVE, api_auth="none"), None),
    ("engine api_auth key beats role none", [engine(api_auth="key")], dict(NATIVE, api_auth="none"), "without a key"),
    ("key given", [engine(secrets={"VLLM_API_KEY": "k"})], NATIVE, None),
    ("empty key", [engine(secrets={"VLLM_API_KEY": ""})], NATIVE, "secrets.VLLM_API_KEY is empty"),
    ("null key", [engine(secrets={"VLLM_API_KEY": None})], NATIVE, "secrets.VLLM_API_KEY is empty"),
    ("empty key on loopback", [engine(host="127.0.0.1", secrets={"VLLM_API_KEY": ""})], NATIVE, "is empty"),
    ("empty HF_TOKEN", [engine(secrets={"VLLM_API_KEY": "k", "HF_TOKEN": ""})], NATIVE, "secrets.HF_TOKEN is empty"),
    ("bad api_auth", [engine(api_auth="off")], NATIVE, "vllm_service_engines[e].api_auth = 'off' is not key or none"),
    ("bad role api_auth", [engine()], dict(NATIVE, api_auth="yes"), "vllm_service_api_auth = 'yes' is not key"),
    ("stopped engine too", [engine(state="stopped")], NATIVE, "without a key"),
    ("absent engine skipped", [engine(state="absent")], NATIVE, None),
    ("worker rank too", [engine(nodes=["ai2", "ai1"], plan={"tensor_parallel_size": 2})], NATIVE, "without a key"),
]


@pytest.mark.parametrize(("case", "engines", "settings", "expect"), AUTH_CHECKS, ids=[c[0] for c in AUTH_CHECKS])
def test_check_api_auth(case, engines, settings, expect):
    normalized = []
    for e in engines:
        normalized += vs.host_engines([e], "ai1", "mp")
    errors = vs.check(normalized, settings, HOSTS, {"ai1": "10.0.0.1", "ai2": "10.0.0.2"})
    if expect is None:
        assert errors == []
    else:
        assert len(errors) == 1 and expect in errors[0], errors
        assert " Fix: " in errors[0]


def test_empty_secret_names_the_key_never_a_value():
    (e,) = vs.host_engines([engine(secrets={"VLLM_API_KEY": "s3cr3t", "HF_TOKEN": ""})], "ai1", "mp")
    errors = vs.check([e], NATIVE, HOSTS, ADDRS)
    assert errors and all("s3cr3t" not in err for err in errors)
    assert any("HF_TOKEN is empty" in err and "vault_hf_token" in err for err in errors), errors


# issue 21: a multi-node rank's own cluster address is required (no default-route fallback) and an IP
ADDR_CHECKS = [
    ("rank 1 without its address", ["ai2", "ai1"], None, {"ai2": "10.0.0.2"},
     "uma_cluster_addr = None is not set for host ai1, rank 1 of engine e"),
    ("rank 1 with an empty address", ["ai2", "ai1"], "", {"ai2": "10.0.0.2"}, "host_vars/ai1.yml"),
    ("rank 1 with a name", ["ai2", "ai1"], "spark1.lan", {"ai2": "10.0.0.2"},
     "uma_cluster_addr = 'spark1.lan' of host ai1 is not an IP address"),
    ("rank 0 with a name", ["ai1", "ai2"], "spark0", {"ai1": "spark0"},
     "uma_cluster_addr = 'spark0' of host ai1 is not an IP address"),
    ("head with a name", ["ai2", "ai1"], "10.0.0.1", {"ai2": "spark2;x"}, "'spark2;x' of host ai2 is not an IP"),
    ("both set", ["ai2", "ai1"], "10.0.0.1", {"ai2": "10.0.0.2"}, None),
    ("IPv6", ["ai2", "ai1"], "fd00::1", {"ai2": "fd00::2"}, None),
]  # fmt: skip


@pytest.mark.parametrize(("case", "nodes", "own", "addrs", "expect"), ADDR_CHECKS, ids=[c[0] for c in ADDR_CHECKS])
def test_check_cluster_addresses(case, nodes, own, addrs, expect):
    (e,) = vs.host_engines([keyed(engine(nodes=nodes, plan={"tensor_parallel_size": 2}))], "ai1", "mp")
    errors = vs.check([e], dict(NATIVE, node_addr=own), HOSTS, addrs)
    if expect is None:
        assert errors == []
    else:
        assert len(errors) == 1 and expect in errors[0] and " Fix: " in errors[0], errors


def test_single_node_engine_needs_no_cluster_address():
    (e,) = vs.host_engines([keyed(engine())], "ai1", "mp")
    assert vs.check([e], dict(NATIVE, node_addr=None), HOSTS, {}) == []


# --------------------------------------------------------------------------- one health timeout (issue 21)


def test_the_roles_health_timeout_reaches_the_launcher(tmp_path):
    """vllm_service_health_timeout_s is what the launcher on the node waits, not launch_wrapper's node-wide
    1800 s: the engine's config (written by the role) overrides the node's launch.json."""
    from ansible_collections.uma.vllm.plugins.filter import launch_wrapper as lw
    from ansible_collections.uma.vllm.plugins.module_utils.node.launch import config as _launch_config

    e = one("ai1", secrets={"VLLM_API_KEY": "k"})
    config = vs.launch_config(e, plan(), dict(NATIVE, health_timeout_s="3600"), {})
    assert config["health_timeout_s"] == 3600.0
    (written,) = lw.engine_files([config], str(tmp_path))
    engine_file = json.loads(written["content"])
    node_file = {"health_timeout_s": 1800}  # launch_wrapper_health_timeout_s in /etc/uma-vllm/launch.json
    merged = _launch_config.merge_config(node_file, engine_file)
    assert merged["health_timeout_s"] == 3600.0
    # unset (the launch_wrapper role's own engines): the node-wide value as before, no key written
    assert "health_timeout_s" not in lw.engine_config(vs.launch_config(e, plan(), NATIVE, {}))


@pytest.mark.parametrize("bad", [0, -5, "soon", "1e3"])
def test_a_bad_health_timeout_is_refused_before_anything_changes(bad):
    (e,) = vs.host_engines([keyed(engine())], "ai1", "mp")
    (err,) = vs.check([e], dict(NATIVE, health_timeout_s=bad), HOSTS, ADDRS)
    assert err.startswith("vllm_service_health_timeout_s = ") and " Fix: " in err


# --------------------------------------------------------------------------- prune (issue 21)


def test_a_renamed_engine_is_shown_not_stopped_by_default():
    """Before issue 21 vllm_service_prune: true (the default) stopped every engine not in the inventory:
    renaming an engine (or a typo) stopped the running one."""
    import yaml

    defaults = yaml.safe_load(open(os.path.join(ROOT, "roles/vllm_service/defaults/main.yml")))
    plan = vs.prune_plan(["old-name", "kept", "gone"], ["new-name", "kept"], ["gone"], defaults["vllm_service_prune"])
    assert plan == {"remove": ["gone"], "orphans": ["old-name"]}


@pytest.mark.parametrize(
    ("prune", "expect"),
    [
        ("list", {"remove": ["gone"], "orphans": ["a", "b"]}),
        ("remove", {"remove": ["gone", "a", "b"], "orphans": []}),
        ("none", {"remove": ["gone"], "orphans": ["a", "b"]}),
    ],
)
def test_prune_removes_only_when_told(prune, expect):
    assert vs.prune_plan(["b", "a", "kept", "gone"], ["kept"], ["gone"], prune) == expect


@pytest.mark.parametrize("bad", [True, False, "yes", "", None, ["remove"]])
def test_prune_refuses_other_values(bad):
    with pytest.raises(Exception, match=r"vllm_service_prune = .* is not list, remove or none\. Fix: "):
        vs.prune_plan(["a"], [], [], bad)


def test_prune_with_nothing_installed():
    assert vs.prune_plan([], ["a"], [], "remove") == {"remove": [], "orphans": []}
