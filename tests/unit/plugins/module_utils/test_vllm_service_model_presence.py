"""Issue 34 item 3b: an engine's model_path on some of its nodes only is copied to the others from
the lowest rank that has it (vllm_service_model_path_copy: true) or refused on all of them, before
anything changes, naming where it is, where it is not, and the fix."""

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
    assert mp.presence([TP2, ONE, HUB], hv, "ai1") == {"errors": [], "lines": {}, "copies": []}


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
    assert mp.presence([TP2], hv, "ai1") == {"errors": [], "lines": not_checked, "copies": []}
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


# --------------------------------------------------------------------------
# the copy (vllm_service_model_path_copy: true)

TP3 = {
    "name": "tp3",
    "model_path": "/models/tiny",
    "cluster": {"nodes": ["ai1", "ai2", "ai3"], "rank": 1, "master_port": 29501},
}
FILES = [
    {"name": "config.json", "size": 2, "sha256": "a" * 64},
    {"name": "m.safetensors", "size": 9, "sha256": "b" * 64},
]


def _index(host_result, **extra):
    return {mp.INDEX_VAR: {"results": [dict({"item": {"name": "tp3"}}, **host_result)]}, **extra}


def test_a_model_on_some_nodes_is_copied_from_the_lowest_rank_that_has_it():
    hv = _hostvars(ai1=[_stat("/models/tiny", exists=False)], ai2=[_stat("/models/tiny")],
                   ai3=[_stat("/models/tiny", exists=False)])  # fmt: skip
    for host in ("ai1", "ai2", "ai3"):
        found = mp.presence([TP3], hv, host, True)
        assert found["errors"] == []
        assert found["copies"] == [{"name": "tp3", "engines": ["tp3"], "path": "/models/tiny", "source": "ai2",
                                    "lack": ["ai1", "ai3"], "port": 29513}]  # fmt: skip
        assert found["lines"]["tp3"] == ["model: /models/tiny is on ai2 only; the role copies it from ai2 to ai1, ai3"
                                         " over the cluster link (checked: names, sizes, sha256)"]  # fmt: skip
    # copy false (or not a boolean true) keeps the refusal; a model on no node is refused either way
    (error,) = mp.presence([TP3], hv, "ai1", False)["errors"]
    assert "is on ai2 but not on ai1, ai3" in error and "vllm_service_model_path_copy: true" in error
    assert mp.presence([TP3], hv, "ai1", "yes")["copies"] == []
    none = _hostvars(**{h: [_stat("/models/tiny", exists=False)] for h in ("ai1", "ai2", "ai3")})
    (error,) = mp.presence([TP3], none, "ai1", True)["errors"]
    assert "has no config.json on ai1, ai2, ai3" in error


def test_engines_that_share_the_directory_share_one_copy():
    """Regression (the lab's tp2 and tp2-ray): two engines on one model_path were two copies of the same
    directory into the same place, each indexed (hashed) on the source."""
    twin = dict(TP3, name="twin", cluster=dict(TP3["cluster"], master_port=29601))
    hv = _hostvars(ai1=[_stat("/models/tiny", exists=False)], ai2=[_stat("/models/tiny")],
                   ai3=[_stat("/models/tiny", exists=False)])  # fmt: skip
    (copy,) = mp.presence([TP3, twin], hv, "ai1", True)["copies"]
    assert copy["engines"] == ["tp3", "twin"] and copy["port"] == 29513
    hv["ai2"].update(_index({"files": FILES, "commit": "c" * 64, "config": {"a": 1}, "weights_bytes": 9}))
    assert sorted(mp.stand_ins([copy], hv, "ai3")) == ["tp3", "twin"]


def _copies(hv):
    return mp.presence([TP3], hv, "ai1", True)["copies"]


def test_the_source_serves_its_index_and_the_others_receive_it():
    hv = _hostvars(ai1=[_stat("/models/tiny", exists=False)], ai2=[_stat("/models/tiny")],
                   ai3=[_stat("/models/tiny", exists=False)])  # fmt: skip
    copies = _copies(hv)
    assert mp.indexes(copies, "ai2") == copies and mp.indexes(copies, "ai1") == []
    # before the source indexed: nothing to serve, an error where a node would receive
    assert mp.servers(copies, hv, "ai2", "/etc/uma-vllm/engines") == []
    (error,) = mp.receives(copies, hv, "ai1", "/etc/uma-vllm/engines")["errors"]
    assert "engine tp3: ai2 has no index of /models/tiny" in error
    hv["ai2"].update(_index({"files": FILES, "commit": "c" * 64, "config": {"a": 1}, "weights_bytes": 9}),
                     uma_cluster_addr="10.0.0.2")  # fmt: skip
    (server,) = mp.servers(copies, hv, "ai2", "/etc/uma-vllm/engines")
    assert server == {"name": "tp3", "dest": "/models/tiny", "repo_id": "local/tp3", "commit": "c" * 64,
                      "files": FILES, "bind": "10.0.0.2", "port": 29513, "peers": 2,
                      "key_file": "/etc/uma-vllm/engines/tp3.link.key"}  # fmt: skip
    received = mp.receives(copies, hv, "ai3", "/etc/uma-vllm/engines")
    assert received["errors"] == [] and received["items"][0]["source"] == "http://10.0.0.2:29513"
    assert received["items"][0]["files"] == FILES and received["items"][0]["commit"] == "c" * 64
    assert mp.receives(copies, hv, "ai2", "/etc/uma-vllm/engines") == {"items": [], "errors": []}
    # check mode: the planner on a node without the model reads the source's config and weight bytes
    assert mp.stand_ins(copies, hv, "ai1") == {"tp3": {"config": {"a": 1}, "weights_bytes": 9}}
    assert mp.stand_ins(copies, hv, "ai2") == {}
    # a failed index is no index
    hv["ai2"].update(_index({"files": FILES, "commit": "c" * 64, "failed": True}))
    assert mp.servers(copies, hv, "ai2", "/e") == [] and mp.stand_ins(copies, hv, "ai1") == {}


@pytest.mark.parametrize(
    "name",
    [
        "vllm_service_model_presence",
        "vllm_service_model_paths",
        "vllm_service_model_path_indexes",
        "vllm_service_model_path_receives",
        "vllm_service_model_path_servers",
        "vllm_service_model_path_stand_ins",
    ],
)
def test_the_filters_are_registered(name):
    assert name in vs.FilterModule().filters()
