"""The guard's one configuration type: the same defaults and limits for every caller.

The guard's command line (uma_guard.py), the launcher (uma_launch.py, options guard_*), the
drop_cache_loop module and the diagnosis all take the guard's configuration from GuardConfig.
"""

from __future__ import annotations

import os

import pytest
import yaml

from ansible_collections.uma.vllm.plugins.module_utils.diagnose import core as _diagnose
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.node.guard import config as _guard_config
from ansible_collections.uma.vllm.plugins.module_utils.node.guard import program as uma_guard
from ansible_collections.uma.vllm.plugins.module_utils.node.guard.config import GuardConfig, check_on_node
from ansible_collections.uma.vllm.plugins.module_utils.node.launch import program as uma_launch
from ansible_collections.uma.vllm.plugins.modules import drop_cache_loop

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", ".."))

BAD = [
    (dict(interval=0), "interval", "must be > 0 and <= 60"),
    (dict(interval=61), "interval", "must be > 0 and <= 60"),
    (dict(interval=0.001), "interval", "is below 0.01 s"),
    (dict(interval="nan"), "interval", "must be > 0 and <= 60"),
    (dict(interval=True), "interval", "is a boolean"),
    (dict(max_duration=0), "max_duration", "must be > 0 and <= 86400"),
    (dict(max_duration=86401), "max_duration", "must be > 0 and <= 86400"),
    (dict(threshold_mib=0), "threshold_mib", "is below the minimum 1"),
    (dict(threshold_mib=1048577), "threshold_mib", "is above the maximum 1048576"),
    (dict(min_available_mib=-1), "min_available_mib", "is below the minimum 0"),
    (dict(act_below_free_mib=-1), "act_below_free_mib", "is below the minimum 0"),
    (dict(act_below_free_mib=1048577), "act_below_free_mib", "is above the maximum 1048576"),
    (dict(act_below_free_mib=True), "act_below_free_mib", "boolean"),
    (dict(act_below_free_mib=512, mode="global"), "act_below_free_mib", "has no effect with mode=global"),
    (dict(act_below_free_mib=512, mode="files", paths=["/"]), "act_below_free_mib", "has no effect with mode=files"),
    (dict(drop_level=2), "drop_level", "is not 1 or 3"),
    (dict(mode="turbo"), "mode", "is not a guard mode"),
    (dict(mode="files"), "paths", "is empty but mode=files"),
    (dict(mode="global", paths=["/"]), "paths", "has no effect with mode=global"),
    (dict(paths=["/nonexistent/uma"]), "paths", "does not exist on the node"),
    (dict(until_url="localhost:8000/health"), "until_url", "is not an http(s) URL"),
    (dict(until_url="http://"), "until_url", "is not an http(s) URL"),
    (dict(until_pid=0), "until_pid", "is below the minimum 1"),
]


@pytest.mark.parametrize("values, key, problem", BAD)
@pytest.mark.parametrize(
    "spell, written",
    [
        (_guard_config.plain, lambda k: k),
        (_guard_config.cli, lambda k: "--" + k.replace("_", "-")),
        (_guard_config.prefixed("guard_"), lambda k: "guard_" + k),
    ],
    ids=["module", "cli", "launcher"],
)
def test_one_validator_refuses_the_same_values_in_every_spelling(values, key, problem, spell, written):
    with pytest.raises(UmaError) as err:
        GuardConfig(name="g", **values).validated(spell=spell)
    assert err.value.option == written(key)
    assert problem in err.value.message


def test_valid_values_are_normalised():
    config = GuardConfig(
        name="g", mode="files", paths=["/"], interval="0.5", threshold_mib="32", max_duration=60, until_pid="7"
    ).validated()
    assert (config.interval, config.threshold_mib, config.max_duration, config.until_pid) == (0.5, 32, 60.0, 7)
    assert config.paths == ["/"] and not config.drops_globally
    assert GuardConfig(name="g").validated().drops_globally  # adaptive without paths drops globally


def test_relative_paths_only_where_a_working_directory_means_something(tmp_path, monkeypatch):
    (tmp_path / "ckpt").mkdir()
    monkeypatch.chdir(tmp_path)
    assert GuardConfig(name="g", paths=["ckpt"]).validated().paths == [str(tmp_path / "ckpt")]
    with pytest.raises(UmaError, match="is not an absolute path"):
        GuardConfig(name="g", paths=["ckpt"]).validated(absolute_paths=True)


def test_every_caller_takes_the_same_defaults():
    assert uma_guard.parse_config(["--name", "x", "--paths", "/"])["mode"] == _guard_config.DEFAULT_MODE
    cli = uma_guard.parse_config(["--name", "x", "--mode", "global"])
    assert cli["interval"] == _guard_config.DEFAULT_INTERVAL
    assert cli["threshold_mib"] == _guard_config.DEFAULT_THRESHOLD_MIB
    assert cli["max_duration"] == _guard_config.DEFAULT_MAX_DURATION
    assert uma_launch.DEFAULTS["guard_mode"] == _guard_config.DEFAULT_MODE
    assert uma_launch.DEFAULTS["guard_interval"] == _guard_config.DEFAULT_INTERVAL
    assert uma_launch.DEFAULTS["guard_threshold_mib"] == _guard_config.DEFAULT_THRESHOLD_MIB
    assert _diagnose.GUARD_MODE == _guard_config.DEFAULT_MODE
    options = yaml.safe_load(drop_cache_loop.DOCUMENTATION)["options"]
    assert options["mode"]["default"] == _guard_config.DEFAULT_MODE
    assert options["mode"]["choices"] == list(_guard_config.MODES)
    assert options["interval"]["default"] == _guard_config.DEFAULT_INTERVAL
    assert options["threshold_mib"]["default"] == _guard_config.DEFAULT_THRESHOLD_MIB
    assert options["min_available_mib"]["default"] == _guard_config.DEFAULT_MIN_AVAILABLE_MIB
    assert options["act_below_free_mib"]["default"] == _guard_config.DEFAULT_ACT_BELOW_FREE_MIB
    assert cli["act_below_free_mib"] == _guard_config.DEFAULT_ACT_BELOW_FREE_MIB
    assert options["max_duration"]["default"] == _guard_config.DEFAULT_MAX_DURATION
    with open(os.path.join(ROOT, "roles", "launch_wrapper", "defaults", "main.yml"), encoding="utf-8") as handle:
        role = yaml.safe_load(handle)
    assert role["launch_wrapper_guard_mode"] == _guard_config.DEFAULT_MODE
    assert role["launch_wrapper_guard_interval_s"] == _guard_config.DEFAULT_INTERVAL
    assert role["launch_wrapper_guard_threshold_mib"] == _guard_config.DEFAULT_THRESHOLD_MIB


def test_the_launcher_refuses_files_without_model_path_instead_of_turning_it_into_adaptive():
    base = dict(uma_launch.DEFAULTS, engine="e", command=["true"], health_url="http://127.0.0.1:1/h")
    with pytest.raises(UmaError) as err:
        uma_launch.validate(dict(base, guard_mode="files"))
    assert err.value.option == "guard_mode" and "model_path is not set" in err.value.message
    assert uma_launch.validate(dict(base, guard_mode="adaptive"))["guard_mode"] == "adaptive"
    # the default pre_evict (files) without a model still means: no pre-load eviction
    assert uma_launch.validate(dict(base))["pre_evict"] == "none"


def test_check_on_node(tmp_path):
    proc = tmp_path / "proc"
    (proc / "sys" / "vm").mkdir(parents=True)
    with pytest.raises(UmaError, match="is not a running process"):
        check_on_node(GuardConfig(name="g", mode="files", paths=["/"], until_pid=4242, proc_root=str(proc)))
    with pytest.raises(UmaError, match="drops caches globally here"):
        check_on_node(GuardConfig(name="g", mode="global", proc_root=str(proc)))
    (proc / "sys" / "vm" / "drop_caches").write_text("")
    (proc / "4242").mkdir()
    check_on_node(GuardConfig(name="g", mode="global", until_pid=4242, proc_root=str(proc)))
    world = tmp_path / "world"
    world.mkdir()
    world.chmod(0o777)
    with pytest.raises(UmaError, match="another user can write"):
        check_on_node(GuardConfig(name="g", mode="files", paths=["/"], samples_file=str(world / "s.jsonl")))
