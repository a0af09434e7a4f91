"""The engine model of roles/vllm_service, called directly (plugins/module_utils/service/engines.py,
service/state.py, service/watchdog.py): the role's scalar settings, the engine user,
the steps of a launcher config, the watchdog config steps, and the filters as thin wrappers
(same text, AnsibleFilterError instead of EngineModelError)."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.uma.vllm.plugins.filter import vllm_service as filters
from ansible_collections.uma.vllm.plugins.filter import watchdog as watchdog_filter
from ansible_collections.uma.vllm.plugins.module_utils.service import engines as model
from ansible_collections.uma.vllm.plugins.module_utils.service import state
from ansible_collections.uma.vllm.plugins.module_utils.service import watchdog as wd

NATIVE = {"runtime": "native", "native_command": ["/opt/vllm/bin/vllm", "serve"], "native_model_flag": ""}
DOCKER = dict(NATIVE, runtime="container", image="nvcr.io/nvidia/vllm:26.02-py3", container_bin="/usr/bin/docker")


def engines(hostname, *raw, backend="mp"):
    return model.host_engines(list(raw), hostname, backend)


# --------------------------------------------------------------------------- scalar settings


@pytest.mark.parametrize(
    "ram, reserve, unified",
    [(None, None, True), ("", "", "false"), (121, 12, "yes"), ("121.5", "0", "No"), (0.5, 1.5, "TRUE")],
)
def test_good_scalar_settings_pass(ram, reserve, unified):
    assert model.settings_errors(ram, reserve, unified, "root", [], "container") == []


@pytest.mark.parametrize("ram", [0, "0", "abc", -1, "1e3", "12 GiB", [12]])
def test_ram_gib_that_is_not_a_positive_number_is_refused_naming_the_value(ram):
    (error,) = model.settings_errors(ram, None, "true", None, [], "native")
    assert error.startswith("vllm_service_ram_gib = %s is not a positive number of GiB." % model._json(ram))
    assert "Fix: set uma_ram_gib" in error


@pytest.mark.parametrize("reserve", [-1, "x", "-0.5"])
def test_reserve_gib_below_zero_or_not_a_number_is_refused(reserve):
    (error,) = model.settings_errors(None, reserve, "true", None, [], "native")
    assert error == (
        "vllm_service_reserve_gib = %s is not a number of GiB >= 0. Fix: set uma_reserve_gib (e.g. 12)."
        % model._json(reserve)
    )


@pytest.mark.parametrize("unified", [None, "maybe", 1, "on"])
def test_unified_memory_must_be_a_boolean_word(unified):
    (error,) = model.settings_errors(None, None, unified, None, [], "native")
    assert error.startswith("vllm_service_unified_memory = %s is not a boolean." % model._json(unified))


def test_a_non_root_user_needs_every_engine_native():
    native = engines("ai1", {"name": "a", "port": 8000, "model_path": "/m"})
    mixed = engines("ai1", {"name": "a", "port": 8000, "model_path": "/m", "runtime": "container"})
    assert model.settings_errors(None, None, "true", "vllm", native, "native") == []
    assert model.settings_errors(None, None, "true", "root", mixed, "native") == []
    (error,) = model.settings_errors(None, None, "true", "vllm", mixed, "native")
    assert error.startswith('vllm_service_user = "vllm" needs the native runtime')
    # the role's runtime counts for engines that do not name one
    assert len(model.settings_errors(None, None, "true", "vllm", native, "container")) == 1


def test_every_problem_is_reported_at_once():
    assert len(model.settings_errors("abc", "x", "maybe", "u", [{"name": "a"}], "container")) == 4


# --------------------------------------------------------------------------- engine user


@pytest.mark.parametrize("user", [None, "", "root"])
def test_root_means_no_engine_user(user):
    assert model.engine_user(user) is None
    keys = model.user_keys(user, "g", ["video"], "/home/u")
    assert keys == {"user": None, "group": None, "groups": None, "home": None}
    assert model.hardening({"A": "1"}, {"B": "2"}, user) == {"A": "1"}


def test_a_non_root_user_gets_its_keys_and_the_extra_hardening():
    assert model.engine_user("vllm") == "vllm"
    keys = model.user_keys("vllm", "g", ["video"], "/h")
    assert keys == {"user": "vllm", "group": "g", "groups": ["video"], "home": "/h"}
    base = {"A": "1", "B": "0"}
    assert model.hardening(base, {"B": "2", "C": "3"}, "vllm") == {"A": "1", "B": "2", "C": "3"}
    assert base == {"A": "1", "B": "0"}  # the role's default is not changed in place


# --------------------------------------------------------------------------- launcher config steps


def test_planned_args_refuses_what_is_not_a_vllm_serve_argv():
    assert model.planned_args(["vllm", "serve", "/m", "--x", 1]) == ["--x", "1"]
    with pytest.raises(model.EngineModelError, match="vllm_flags returned"):
        model.planned_args(["python", "serve", "/m"])


def test_ray_script_head_execs_the_engine_worker_only_joins():
    head = {"rank": 0, "ray_port": 6379}
    worker = {"rank": 1, "ray_port": 6379}
    settings = {"ray_command": ["/opt/ray bin/ray"], "node_addr": "10.0.0.2"}
    assert model.ray_script(head, settings, "10.0.0.1") == (
        '\'/opt/ray bin/ray\' start --head --port=6379 --node-ip-address=10.0.0.2 && exec "$0" "$@"'
    )
    assert model.ray_script(worker, {}, "10.0.0.1") == "exec ray start --block --address=10.0.0.1:6379"


def test_engine_command_native_and_container():
    (e,) = engines("ai1", {"name": "a", "port": 8000, "model_path": "/m"})
    assert model.engine_command(e, NATIVE, [], None, False) == (["/opt/vllm/bin/vllm", "serve"], "")
    assert model.engine_command(e, NATIVE, [], "S", True) == (["/bin/sh", "-c", "S", "sh"], "")
    command, flag = model.engine_command(e, DOCKER, ["B", "A"], None, False)
    assert command[:5] == ["/usr/bin/docker", "run", "--rm", "--name", "uma-vllm-a"]
    assert command[-3:] == [DOCKER["image"], "vllm", "serve"] and flag == ""
    assert command.index("A") < command.index("B")  # env names sorted, values never on the line
    command = model.engine_command(e, DOCKER, [], "S", False)[0]
    assert command[-5:] == [DOCKER["image"], "-c", "S", "vllm", "serve"]
    assert command[command.index("--entrypoint") + 1] == "/bin/sh"


@pytest.mark.parametrize(
    "host, worker, expected",
    [
        ("0.0.0.0", False, "http://127.0.0.1:8000/health"),
        ("::", False, "http://127.0.0.1:8000/health"),
        ("fd00::1", False, "http://[fd00::1]:8000/health"),
        ("0.0.0.0", True, "http://10.0.0.1:8000/health"),
        ("10.0.0.2", True, "http://10.0.0.2:8000/health"),
    ],
)
def test_health_url_of_an_api_rank_and_of_a_headless_rank(host, worker, expected):
    assert model.health_url({}, host, 8000, worker, "10.0.0.1") == expected
    assert model.health_url({"health_url": "http://x/h"}, host, 8000, worker, "10.0.0.1") == "http://x/h"


# --------------------------------------------------------------------------- state


def test_changed_and_with_peers_restart_every_rank():
    two = engines("ai2", {"name": "tp", "nodes": ["ai1", "ai2"], "port": 8000, "model_path": "/m"})
    assert state.changed(two, [], False, {"tp": "f"}, {"tp": "f"}) == []
    assert state.changed(two, [], False, {"tp": "f"}, {}) == ["tp"]
    assert state.with_peers(two, [], {"ai1": ["tp"]}) == ["tp"]
    assert state.with_peers(two, [], {"ai1": []}) == []


# --------------------------------------------------------------------------- watchdog steps


def test_cluster_config_refuses_a_missing_address_naming_the_host():
    (e,) = engines("ai1", {"name": "tp", "nodes": ["ai1", "ai2"], "port": 8000, "model_path": "/m"})
    raw = {}
    hostvars = {"ai1": {"uma_cluster_addr": "10.0.0.1"}, "ai2": {}}
    with pytest.raises(
        model.EngineModelError, match=r"no cluster-link address for peer ai2\. Fix: set uma_cluster_addr"
    ):
        wd.cluster_config(raw, e, 0, "ai1", hostvars, "where")
    hostvars["ai2"]["uma_cluster_addr"] = "fd00::2"
    wd.cluster_config(raw, e, 0, "ai1", hostvars, "where")
    assert raw == {
        "status_bind": "10.0.0.1",
        "status_port": 29501 + wd.PORT_OFFSET,
        "peers": [{"name": "ai2", "url": "http://[fd00::2]:29512/status"}],
    }


def test_checked_floors_names_the_role_variable():
    (e,) = engines("ai1", {"name": "a", "port": 8000, "model_path": "/m"})
    raw = wd.base_config("a", e, {"health_url": "http://127.0.0.1:8000/health"}, 0, {"ram_gib": "64"})
    assert raw["base_url"] == "http://127.0.0.1:8000"
    assert wd.checked_floors(raw, "w")["ram_bytes"] == 64 * 1024**3
    raw = wd.base_config("a", e, {}, 0, {"interval_s": "-3"})
    with pytest.raises(model.EngineModelError, match=r"^w: vllm_service_watchdog_interval_s = -3 "):
        wd.checked_floors(raw, "w")


# --------------------------------------------------------------------------- the filters are thin wrappers


def test_filters_raise_the_models_refusal_as_ansible_filter_error_with_the_same_text():
    with pytest.raises(model.EngineModelError) as direct:
        model.host_engines("nope", "ai1")
    with pytest.raises(AnsibleFilterError) as wrapped:
        filters.host_engines("nope", "ai1")
    assert str(wrapped.value) == str(direct.value)
    assert wrapped.value.__cause__ is None
    launch = [{"name": "a"}]
    mine = engines("ai1", {"name": "a", "port": 8000, "model_path": "/m"})
    with pytest.raises(AnsibleFilterError, match="vllm_service_watchdog_interval_s"):
        watchdog_filter.watchdog_configs(launch, mine, "ai1", {}, {"interval_s": "-3"})


def test_every_filter_of_the_role_is_registered_once():
    names = set(filters.FilterModule().filters()) | set(watchdog_filter.FilterModule().filters())
    assert {"vllm_service_settings_errors", "vllm_service_engine_user", "vllm_service_user_keys"} <= names
    assert "vllm_service_hardening" in names and "vllm_service_watchdog_configs" in names
