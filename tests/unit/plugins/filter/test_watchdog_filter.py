"""The watchdog configs the vllm_service role writes (plugins/filter/watchdog.py): ranks, peers,
status ports, floors from uma_ram_gib, refusals naming the role variable, the value and the fix,
and every config accepted by the watchdog program's own validation."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.uma.vllm.plugins.filter import vllm_service as vs
from ansible_collections.uma.vllm.plugins.filter import watchdog as wf
from ansible_collections.uma.vllm.plugins.module_utils.node.watchdog import logic

ENGINES = [
    {"name": "tp2", "nodes": ["ai1", "ai2", "ai3"], "port": 8100, "model_path": "/models/tiny"},
    {"name": "solo", "port": 8000, "model_path": "/models/solo"},
    {"name": "parked", "state": "stopped", "port": 8001, "model_path": "/models/solo"},
]
HOSTVARS = {h: {"__vllm_service_node": {"addr": "10.0.0.%d" % i}} for i, h in enumerate(["ai1", "ai2", "ai3"], 1)}
SETTINGS = {
    "state_dir": "/var/lib/uma-vllm",
    "unified_memory": "True",
    "runtime": "native",
    "ram_gib": "121",
    "interval_s": "5",
    "max_restarts": "3",
    "rank_link_grace_s": 30,
    "textfile_dir": "/var/lib/prometheus/node-exporter",
    "warn_floor_mib": None,
    "critical_floor_mib": "",
}


def configs(host, engines=None, settings=None, hostvars=None):
    mine = vs.host_engines(engines or ENGINES, host)
    launch = [{"name": e["name"], "health_url": "http://127.0.0.1:%d/health" % e["port"]} for e in mine]
    return {c["name"]: c for c in wf.watchdog_configs(launch, mine, host, hostvars or HOSTVARS, settings or SETTINGS)}


def test_rank0_watches_the_api_and_every_peer_the_others_follow_rank0():
    head = configs("ai1")
    assert sorted(head) == ["solo", "tp2"]  # a stopped engine gets no watchdog
    tp2 = head["tp2"]["config"]
    assert tp2["rank"] == 0 and tp2["base_url"] == "http://127.0.0.1:8100"
    assert tp2["peers"] == [
        {"name": "ai2", "url": "http://10.0.0.2:29512/status"},
        {"name": "ai3", "url": "http://10.0.0.3:29512/status"},
    ]
    assert tp2["status_bind"] == "10.0.0.1" and tp2["status_port"] == 29512
    assert tp2["processes"] == [{"match": "VLLM::EngineCore", "min": 1}]
    assert tp2["_comment"].startswith("Managed by uma.vllm")
    solo = head["solo"]["config"]
    assert "peers" not in solo and "status_port" not in solo and solo["base_url"] == "http://127.0.0.1:8000"
    rank2 = configs("ai3")["tp2"]["config"]
    assert rank2["rank"] == 2 and rank2["leader_url"] == "http://10.0.0.1:29512/status"
    assert rank2["processes"] == [{"match": "VLLM::Worker", "min": 1}] and "base_url" not in rank2
    for host in ("ai1", "ai2", "ai3"):
        for item in configs(host).values():
            logic.validate(item["config"])  # what the node program will accept


def test_floors_are_sized_from_uma_ram_gib_and_overridable():
    spark = configs("ai1")["tp2"]["floors"]
    assert spark["critical_bytes"] == logic.size_floors(121 * logic.GIB)["critical_bytes"]
    assert spark["warn_bytes"] == 2 * spark["critical_bytes"]
    lab = configs("ai1", settings=dict(SETTINGS, ram_gib=23))["tp2"]["floors"]
    assert lab["critical_bytes"] < spark["critical_bytes"]
    explicit = configs("ai1", settings=dict(SETTINGS, warn_floor_mib="8192", critical_floor_mib=4096))["tp2"]
    assert explicit["config"]["warn_floor_mib"] == 8192 and explicit["floors"]["critical_bytes"] == 4096 << 20


def test_container_runtime_watches_the_engines_container():
    item = configs("ai1", settings=dict(SETTINGS, runtime="container", container_bin="/usr/bin/podman"))["solo"]
    assert item["config"]["container"] == "uma-vllm-solo" and item["config"]["container_bin"] == "/usr/bin/podman"


def test_a_port_per_engine_can_be_given():
    engines = [dict(ENGINES[0], watchdog_port=9411)]
    assert configs("ai2", engines=engines)["tp2"]["config"]["leader_url"] == "http://10.0.0.1:9411/status"


@pytest.mark.parametrize(
    "over, words",
    [
        ({"interval_s": "-1"}, "vllm_service_watchdog_interval_s = -1 is out of range (must be > 0 and <= 604800)"),
        ({"max_restarts": 0}, "vllm_service_watchdog_max_restarts = 0 is out of range (must be >= 1 and <= 1000)"),
        ({"evict_scope": "all"}, "vllm_service_watchdog_evict_scope = 'all' is not model or global. Fix:"),
        ({"warn_floor_mib": 100, "critical_floor_mib": 200}, "vllm_service_watchdog_warn_floor_mib = 100 is not above"),
        ({"rank_link_grace_s": "soon"}, "vllm_service_watchdog_rank_link_grace_s = 'soon' is a string, not a number"),
        ({"backoff_initial_s": 60, "backoff_max_s": 30}, "vllm_service_watchdog_backoff_max_s = 30.0 is below"),
        ({"ram_gib": "-4"}, "vllm_service_ram_gib = -4 is out of range (must be > 0"),
        (
            {"healthy_reset_s": 0},
            "vllm_service_watchdog_healthy_reset_s = 0 is out of range (must be > 0 and <= 604800)",
        ),
        ({"healthy_reset_s": "soon"}, "vllm_service_watchdog_healthy_reset_s = 'soon' is a string, not a number"),
        (
            {"probe_idle_s": "-60"},
            "vllm_service_watchdog_probe_idle_s = -60 is out of range (must be > 0 and <= 604800)",
        ),
        ({"lock_memory": "maybe"}, "vllm_service_watchdog_lock_memory = 'maybe' is not a boolean (true or false)"),
        ({"lock_memory": 1}, "vllm_service_watchdog_lock_memory = 1 is not a boolean (true or false)"),
    ],
)
def test_bad_values_are_refused_naming_the_variable_the_value_and_the_fix(over, words):
    with pytest.raises(AnsibleFilterError) as err:
        configs("ai2", settings=dict(SETTINGS, **over))
    assert words in str(err.value) and "engine tp2 on ai2" in str(err.value)


def test_a_node_without_a_cluster_address_is_refused_with_the_fix():
    hostvars = dict(HOSTVARS, ai2={})
    with pytest.raises(AnsibleFilterError) as err:
        configs("ai1", hostvars=hostvars)
    assert "no cluster-link address for peer ai2. Fix: set uma_cluster_addr" in str(err.value)


def test_the_new_variables_reach_the_config():
    """vllm_service_watchdog_healthy_reset_s and _probe_idle_s become the watchdog's options."""
    got = configs("ai1", settings=dict(SETTINGS, healthy_reset_s="900", probe_idle_s=120))["tp2"]["config"]
    assert got["healthy_reset_s"] == 900 and got["probe_idle_s"] == 120


def test_the_watchdog_configs_are_checked_before_anything_on_the_node_changes():
    """A bad vllm_service_watchdog_* value fails the play before the role removes, creates or writes anything."""
    import pathlib

    import yaml

    tasks = yaml.safe_load((pathlib.Path(__file__).resolve().parents[4] / "roles" / "vllm_service" / "tasks"
                            / "present.yml").read_text())  # fmt: skip
    names = [t.get("name", "") for t in tasks]
    checked = names.index(
        "Work out each engine's watchdog config on this node (checked by the watchdog's own validation)"
    )
    for first_change in (
        "Remove the engines set to absent (and, with vllm_service_prune=remove, those no longer defined)",
        "Create the engine user (least privilege, uma.vllm.launch_wrapper)",
    ):
        assert checked < names.index(first_change), first_change
    before = tasks[:checked]
    changing = [t["name"] for t in before if not any(k in t for k in (
        "ansible.builtin.set_fact", "ansible.builtin.assert", "ansible.builtin.debug", "uma.vllm.vllm_flags",
        "uma.vllm.engine_facts", "uma.vllm.rdma_facts", "ansible.builtin.stat"))]  # fmt: skip
    # only checks, plans and read-only facts come first - and the version read, which the plan needs:
    # its one lasting change is pulling a missing image (the plan is for the vLLM that image has);
    # likewise downloading an engine's model from the Hub (the plan reads the model's config.json),
    # after the Hub settings themselves were checked (issue 21 item 3), and copying a model_path from the
    # node that has it to those that lack it (issue 34 item 3b: model files, no configuration of the node)
    assert changing == [
        "Read the vLLM version each engine will run (and check and pull the images)",
        "Copy each model_path from the node that has it to the engine's nodes that lack it",
        "Download the engines' models from the Hub and verify them on every node",
    ]


def test_a_multi_node_engines_status_is_signed_with_its_link_key():
    """Issue 19 item 7: every rank's watchdog reads the engine's link key (the file the role
    writes, 0600 root); a single-node engine has no status port and no key."""
    settings = dict(SETTINGS, secrets_dir="/etc/uma-vllm/engines")
    for host in ("ai1", "ai2", "ai3"):
        found = configs(host, settings=settings)
        assert found["tp2"]["config"]["key_file"] == "/etc/uma-vllm/engines/tp2.link.key"
        logic.validate(found["tp2"]["config"])
    assert "key_file" not in configs("ai1", settings=settings)["solo"]["config"]


def test_the_config_carries_the_node_programs_fingerprint_so_new_programs_restart_the_watchdog(tmp_path, monkeypatch):
    """A running watchdog keeps the code it started with: on the VM lab node an updated watchdog logic was
    installed by site.yml while the old watchdog went on deciding with the old rules. The config now holds the
    programs' fingerprint (node_files' own value), so new programs are a changed config: the role restarts it."""
    from ansible_collections.uma.vllm.plugins.module_utils.plumbing import node_install

    installed = node_install.files_fingerprint(node_install.plan_node_files(str(tmp_path)))
    for item in configs("ai1").values():
        assert item["config"]["programs"] == installed
        assert logic.validate(item["config"])["programs"] == installed
    # one program's text changes -> another fingerprint -> another config
    real = node_install.module_source
    monkeypatch.setattr(
        node_install, "module_source", lambda m: real(m) + ("\n# new" if m.__name__.endswith("watchdog.logic") else "")
    )
    assert configs("ai1")["solo"]["config"]["programs"] != installed
    with pytest.raises(logic.UmaError) as err:
        logic.validate({"engine": "solo", "programs": "not-a-fingerprint"})
    assert "programs" in str(err.value)


def test_a_loader_that_gives_bytes_gives_the_same_source():
    """ansible-core's collection loader (the controller, where the role's filters run) returns the source as
    bytes; the fingerprint must be the same text node_files hashes on the node (the first site.yml run with the
    fingerprint failed on the controller: 'bytes' object has no attribute 'encode')."""
    import types

    from ansible_collections.uma.vllm.plugins.module_utils.plumbing import node_install as _nodefiles

    class BytesLoader:
        @staticmethod
        def get_source(_name):
            return "x = 'é'\n".encode()

    mod = types.ModuleType("ansible_collections.uma.vllm.plugins.module_utils._fake")
    mod.__loader__ = BytesLoader()
    assert _nodefiles.module_source(mod) == "x = 'é'\n"


@pytest.mark.parametrize("given, written", [(None, None), (True, True), (False, False), ("True", True),
                                            ("false", False), (" yes ", True), ("no", False)])  # fmt: skip
def test_lock_memory_is_written_as_a_boolean_and_on_by_default(given, written):
    settings = dict(SETTINGS) if given is None else dict(SETTINGS, lock_memory=given)
    config = configs("ai1", settings=settings)["tp2"]["config"]
    assert config.get("lock_memory") is written
    assert logic.validate(config)["lock_memory"] is (True if written is None else written)
