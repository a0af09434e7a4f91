"""Issue 34 item 3b: an engine's model_path on some of its nodes only is refused on all of them,
before anything changes, naming where it is, where it is not, and the fix."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from ansible_collections.uma.vllm.plugins.filter import vllm_service as vs
from ansible_collections.uma.vllm.plugins.module_utils.service import model_presence as mp

TP2 = {"name": "tp2", "model_path": "/models/tiny", "cluster": {"nodes": ["ai1", "ai2"], "rank": 0}}
ONE = {"name": "one", "model_path": "/models/one", "cluster": None}
HUB = {"name": "hub", "model_path": "/var/lib/uma-vllm/models/o--n", "hub": {"repo_id": "o/n"}, "cluster": None}


PATHS = {"tp2": TP2["model_path"], "one": ONE["model_path"]}


def _stat(name, exists=True, isreg=True, **extra):
    found = {"exists": exists, "isreg": isreg} if exists else {"exists": False}
    return dict({"item": PATHS.get(name, name), "stat": found}, **extra)


def _hostvars(**by_host):
    return {host: {mp.STAT_VAR: {"results": results}} for host, results in by_host.items()}


def test_only_local_models_of_kept_engines_are_looked_for():
    gone = dict(TP2, name="gone", state="absent")
    relative = dict(ONE, name="rel", model_path="models/x")
    assert [e["name"] for e in mp.looked_for([TP2, ONE, HUB, gone, relative, "junk"])] == ["tp2", "one"]
    twin = dict(TP2, name="twin")
    assert mp.paths([TP2, twin, ONE, HUB, gone]) == ["/models/one", "/models/tiny"]


def test_a_model_on_every_node_passes():
    hv = _hostvars(ai1=[_stat("tp2"), _stat("one")], ai2=[_stat("tp2")])
    assert mp.presence([TP2, ONE, HUB], hv, "ai1") == {"errors": [], "lines": {}}


def test_a_model_on_rank0_only_is_refused_naming_both_nodes_and_the_copy():
    hv = _hostvars(ai1=[_stat("tp2")], ai2=[_stat("tp2", exists=False)])
    for host in ("ai1", "ai2"):  # the same refusal on every node of the engine
        (error,) = mp.presence([TP2], hv, host)["errors"]
        assert error.startswith("vllm_service_engines[tp2].model_path = '/models/tiny' is on ai1 but not on ai2"), error
        assert "on ai1: rsync -a --partial /models/tiny/ ai2:/models/tiny/" in error
        assert "model: OWNER/NAME" in error and "Fix:" in error


def test_a_model_on_no_node_and_a_directory_named_config_json():
    hv = _hostvars(ai1=[_stat("tp2", isreg=False)], ai2=[_stat("tp2", exists=False)])
    (error,) = mp.presence([TP2], hv, "ai1")["errors"]
    assert "has no config.json on ai1, ai2" in error and "on ai1 and ai2" in error
    hv = _hostvars(ai1=[_stat("one", exists=False)])
    (error,) = mp.presence([ONE], hv, "ai1")["errors"]
    assert error.startswith("vllm_service_engines[one].model_path = '/models/one' has no config.json on ai1.")


def test_a_node_outside_the_play_or_failed_is_named_not_checked():
    not_checked = {"tp2": ["model preflight: host ai2 not checked (not in this play, or it failed before)"]}
    hv = _hostvars(ai1=[_stat("tp2")])
    assert mp.presence([TP2], hv, "ai1") == {"errors": [], "lines": not_checked}
    hv = _hostvars(ai1=[_stat("tp2")], ai2=[_stat("tp2", failed=True)])
    assert mp.presence([TP2], hv, "ai1")["lines"] == not_checked
    hv["ai2"] = "not a mapping"
    assert mp.presence([TP2], hv, "ai1")["errors"] == []


def test_the_copy_command_quotes_the_path():
    path = "/models/my model's dir"
    engine = dict(TP2, model_path=path)
    hv = _hostvars(ai1=[_stat(path)], ai2=[_stat(path, exists=False)])
    (error,) = mp.presence([engine], hv, "ai1")["errors"]
    command = error.split("on ai1: ", 1)[1].split("), or give", 1)[0]
    words = shlex.split(command)
    assert words == ["rsync", "-a", "--partial", path + "/", "ai2:" + path + "/"]
    # the shell reads it back as those words (nothing runs: echo)
    out = subprocess.run(["/bin/sh", "-c", "printf '%s\\n' " + command.split(" ", 3)[3]], capture_output=True,
                         text=True, check=True)  # fmt: skip
    assert out.stdout.splitlines() == [path + "/", "ai2:" + path + "/"]


@pytest.mark.parametrize("name", ["vllm_service_model_presence", "vllm_service_model_paths"])
def test_the_filters_are_registered(name):
    assert name in vs.FilterModule().filters()
