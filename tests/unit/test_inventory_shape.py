"""Issue 21 item 2: the sample inventory has the shape of a real cluster, and the role's checks
hold on it. inventories/spark is read with ansible-core's own inventory and variable managers
(group_vars, host_vars) and its engines go through the vllm_service role's real check."""

from __future__ import annotations

import configparser
import ipaddress
import pathlib

import pytest
import yaml
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from ansible.vars.manager import VariableManager

from ansible_collections.uma.vllm.plugins.filter import vllm_service as vs

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPARK = ROOT / "inventories" / "spark"
SETTINGS = {"runtime": "container", "image": "vllm/vllm-openai:v0.32.0", "api_host": "0.0.0.0", "api_auth": "key"}


def _hosts(extra=None):
    loader = DataLoader()
    inventory = InventoryManager(loader=loader, sources=[str(SPARK)])
    manager = VariableManager(loader=loader, inventory=inventory)
    manager._extra_vars = dict(extra or {})
    out = {}
    for host in inventory.get_hosts():
        variables = manager.get_vars(host=host)
        out[host.name] = Templar(loader=loader, variables=variables), variables
    return out


def test_management_and_cluster_addresses_are_separate_ip_addresses():
    hosts = _hosts()
    assert sorted(hosts) == ["ai1", "ai2"]
    for name, (templar, variables) in hosts.items():
        management = str(templar.template(variables["ansible_host"]))
        cluster = str(templar.template(variables["uma_cluster_addr"]))
        ipaddress.ip_address(management), ipaddress.ip_address(cluster)
        assert management != cluster, "%s: ansible_host and uma_cluster_addr are one address" % name


def test_no_ssh_user_in_group_vars():
    """ansible_user in group_vars overrides an AWX machine credential."""
    for path in sorted((SPARK / "group_vars").rglob("*")):
        if path.is_file() and path.suffix in (".yml", ".yaml", ""):
            data = yaml.safe_load(path.read_text()) or {}
            assert "ansible_user" not in data, path


def test_host_key_checking_is_not_turned_off_for_every_inventory():
    """The lab reaches its nodes with the docker connection (no SSH); real nodes keep host keys checked."""
    config = configparser.ConfigParser()
    config.read(ROOT / "ansible.cfg")
    assert config.get("defaults", "host_key_checking", fallback="True").lower() not in ("false", "no", "0")
    lab = yaml.safe_load((ROOT / "inventories/lab/group_vars/all.yml").read_text())
    assert lab["ansible_connection"] == "community.docker.docker"


def test_example_values_are_marked_not_defaults():
    for name in ("ai1", "ai2"):
        text = (SPARK / "host_vars" / ("%s.yml" % name)).read_text()
        active = [line for line in text.splitlines() if line and not line.startswith("#") and line != "---"]
        assert active and all("published example" in line for line in active), active
    group = yaml.safe_load((SPARK / "group_vars" / "spark.yml").read_text())
    assert "uma_reserve_gib" not in group  # the planner derives it; a sampled value below it warned


def test_the_sample_engine_passes_the_roles_check_with_its_vault_key():
    for name, (templar, variables) in _hosts({"vault_vllm_api_key": "k3y"}).items():
        engines = templar.template(variables["vllm_service_engines"])
        mine = vs.host_engines(engines, name, "mp")
        addrs = {"ai1": str(templar.template(_hosts()["ai1"][1]["uma_cluster_addr"]))}
        settings = dict(SETTINGS, node_addr=str(templar.template(variables["uma_cluster_addr"])))
        assert vs.check(mine, settings, ["ai1", "ai2"], addrs) == []


def test_the_sample_engine_without_its_vault_key_is_refused():
    for name, (templar, variables) in _hosts({"vault_vllm_api_key": ""}).items():
        mine = vs.host_engines(templar.template(variables["vllm_service_engines"]), name, "mp")
        errors = vs.check(mine, dict(SETTINGS, node_addr="192.168.100.12"), ["ai1", "ai2"], {"ai1": "192.168.100.11"})
        assert len(errors) == 1 and "secrets.VLLM_API_KEY is empty" in errors[0], errors


def _addr_expression():
    tasks = DataLoader().load_from_file(str(ROOT / "roles/vllm_service/tasks/main.yml"))
    (task,) = [t for t in tasks if "__vllm_service_node" in (t.get("ansible.builtin.set_fact") or {})]
    return str(task["ansible.builtin.set_fact"]["__vllm_service_node"]["addr"])


@pytest.mark.parametrize(("given", "expect"), [(None, None), ("", None), ("192.168.100.12", "192.168.100.12")])
def test_no_fallback_to_the_default_route_address(given, expect):
    """Before issue 21 an unset uma_cluster_addr became default_ipv4 (the management network)."""
    variables = {"vllm_service_cluster_addr": given, "ansible_facts": {"default_ipv4": {"address": "10.0.0.12"}}}
    got = Templar(loader=DataLoader(), variables=variables).template(trust_as_template(_addr_expression()))
    assert got == expect
