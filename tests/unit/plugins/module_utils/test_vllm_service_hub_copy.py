# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Issue 21 item 3: which node of a multi-node engine downloads its model and which copy it from
rank 0, and the arguments of their uma.vllm.model_copy tasks (service/hub_copy.py)."""

from __future__ import annotations

from ansible_collections.uma.vllm.plugins.filter import vllm_service as vs
from ansible_collections.uma.vllm.plugins.module_utils.service import hub_copy as hc

MODELS = "/var/lib/uma-vllm/models"
ENGINES_DIR = "/etc/uma-vllm/engines"
COMMIT = "a" * 40
FILES = [{"name": "model.safetensors", "size": 10, "sha256": "b" * 64}, {"name": "config.json", "size": 2,
                                                                         "sha256": "c" * 64}]  # fmt: skip
RAW = {"name": "tp", "port": 8000, "model": "a/b", "nodes": ["ai1", "ai2", "ai3"], "master_port": 29500,
       "plan": {"tensor_parallel_size": 3}}  # fmt: skip


def engine(host):
    (found,) = vs.hub_engines(vs.host_engines([RAW], host, "mp"), MODELS)
    return found


def hostvars(files=None, commit=COMMIT, need=("ai2",)):
    files = FILES if files is None else files
    rank0 = {"item": engine("ai1"), "commit": commit, "files": files, "changed": False}
    out = {
        "ai1": {"__vllm_service_node": {"addr": "10.0.0.1"}, "__vllm_service_fetched": {"results": [rank0]}},
        "ai2": {"uma_cluster_addr": "10.0.0.2"},
        "ai3": {"uma_cluster_addr": "10.0.0.3"},
    }
    for host in ("ai2", "ai3"):
        out[host]["__vllm_service_copy_need"] = {"results": [{"item": {"name": "tp"}, "changed": host in need}]}
    return out


def test_only_the_other_ranks_copy_and_only_rank0_serves():
    assert [hc.copies_from_rank0(engine(h), "rank0") for h in ("ai1", "ai2", "ai3")] == [False, True, True]
    assert [hc.serves_copies(engine(h), "rank0") for h in ("ai1", "ai2", "ai3")] == [True, False, False]
    assert not any(hc.copies_from_rank0(engine(h), "hub") or hc.serves_copies(engine(h), "hub")
                   for h in ("ai1", "ai2"))  # fmt: skip
    single = dict(RAW, nodes=None, name="one")
    (one,) = vs.hub_engines(vs.host_engines([single], "ai1", "mp"), MODELS)
    assert not hc.copies_from_rank0(one, "rank0") and not hc.serves_copies(one, "rank0")


def test_a_copying_rank_gets_rank0_s_files_commit_and_address():
    found = vs.hub_copy_receives([engine("ai2")], hostvars(), "rank0", ENGINES_DIR)
    assert found["errors"] == [] and found["pending"] == []
    (item,) = found["items"]
    assert item == {
        "name": "tp", "dest": MODELS + "/a/b", "repo_id": "a/b", "revision": "main", "commit": COMMIT,
        "files": FILES, "source": "http://10.0.0.1:29512", "label": "engine tp, rank 0 on ai1",
        "key_file": ENGINES_DIR + "/tp.link.key",
    }  # fmt: skip


def test_an_ipv6_cluster_address_is_bracketed():
    hv = hostvars()
    hv["ai1"]["__vllm_service_node"] = {"addr": "fd00::1"}
    (item,) = vs.hub_copy_receives([engine("ai2")], hv, "rank0", ENGINES_DIR)["items"]
    assert item["source"] == "http://[fd00::1]:29512"


def test_rank0_without_a_verified_snapshot_is_named_with_the_fix():
    for hv in (hostvars(files=[dict(FILES[0], sha256=None)]), hostvars(commit=None), {"ai1": {}}):
        found = vs.hub_copy_receives([engine("ai2")], hv, "rank0", ENGINES_DIR)
        assert found["items"] == [] and found["pending"] == ["tp"]
        (err,) = found["errors"]
        assert "engine tp: rank 0 (ai1) has no verified snapshot of a/b" in err
        assert "vllm_service_model_source: hub" in err


def test_rank0_serves_once_for_the_ranks_that_lack_the_model():
    fetched = hostvars()["ai1"]["__vllm_service_fetched"]["results"]
    (server,) = vs.hub_copy_servers([engine("ai1")], hostvars(), "rank0", ENGINES_DIR, fetched)
    assert server == {"name": "tp", "dest": MODELS + "/a/b", "repo_id": "a/b", "commit": COMMIT,
                      "bind": "10.0.0.1", "port": 29512, "peers": 1,
                      "key_file": ENGINES_DIR + "/tp.link.key"}  # fmt: skip
    both = vs.hub_copy_servers([engine("ai1")], hostvars(need=("ai2", "ai3")), "rank0", ENGINES_DIR, fetched)
    assert both[0]["peers"] == 2
    # every rank has it already: no server at all
    assert vs.hub_copy_servers([engine("ai1")], hostvars(need=()), "rank0", ENGINES_DIR, fetched) == []
    # rank 0's own download did not run (check mode without a token): nothing to serve
    assert (
        vs.hub_copy_servers(
            [engine("ai1")], hostvars(), "rank0", ENGINES_DIR, [{"item": {"name": "tp"}, "skipped": True}]
        )
        == []
    )
    assert vs.hub_copy_servers([engine("ai2")], hostvars(), "rank0", ENGINES_DIR, fetched) == []
    assert vs.hub_copy_servers([engine("ai1")], hostvars(), "hub", ENGINES_DIR, fetched) == []


def test_the_copy_result_carries_the_commit_into_the_engine():
    (item,) = vs.hub_copy_receives([engine("ai2")], hostvars(), "rank0", ENGINES_DIR)["items"]
    (done,) = vs.hub_fetched([engine("ai2")], [{"item": engine("ai2"), "skipped": True},
                                               {"item": item, "commit": COMMIT, "changed": True}])  # fmt: skip
    assert done["env"]["UMA_MODEL_COMMIT"] == COMMIT and done["hub"]["commit"] == COMMIT


def test_source_values():
    assert hc.source_errors("rank0") == [] and hc.source_errors("hub") == []
    assert "vllm_service_model_source = 'Rank0' is not one of rank0, hub. Fix:" in hc.source_errors("Rank0")[0]


CONFIG = {"model_type": "llama", "hidden_size": 8}


def _peeked(download_files, config="the model's"):
    config = dict(CONFIG) if config == "the model's" else config
    return {"item": {"name": "tp"}, "commit": COMMIT, "files": FILES, "config": config, "weights_bytes": 10,
            "download": {"files": download_files}}  # fmt: skip


def test_check_mode_plans_a_model_not_yet_here_from_the_peeked_config():
    """Issue 34 item 2: --check on fresh nodes plans each Hub engine from model_fetch's peek (rank 0's
    for a rank that copies), and a model already whole on the node from its directory."""
    want = {"tp": {"config": CONFIG, "weights_bytes": 10}}
    # rank 0 (it downloads): a model still to download is planned from the peek, a whole one is not
    assert hc.stand_ins([engine("ai1")], {}, "rank0", [_peeked(["config.json"])], [], []) == want
    assert hc.stand_ins([engine("ai1")], {}, "rank0", [_peeked([])], [], []) == {}
    # a rank that copies: from rank 0's peek when it lacks the model, or rank 0 has none to copy yet
    hv = hostvars()
    hv["ai1"]["__vllm_service_fetched"]["results"] = [dict(_peeked(["config.json"]), item=engine("ai1"))]
    lacking = [{"item": {"name": "tp"}, "changed": True}]
    whole = [{"item": {"name": "tp"}, "changed": False}]
    assert hc.stand_ins([engine("ai2")], hv, "rank0", [], lacking, []) == want
    assert hc.stand_ins([engine("ai2")], hv, "rank0", [], [], ["tp"]) == want
    assert hc.stand_ins([engine("ai2")], hv, "rank0", [], whole, []) == {}
    # every node downloads itself (source hub): its own peek; no peek (a real run): nothing
    assert hc.stand_ins([engine("ai2")], hv, "hub", [_peeked(["m.safetensors"])], [], []) == want
    assert hc.stand_ins([engine("ai2")], hv, "hub", [_peeked(["m.safetensors"], config=None)], [], []) == {}
    assert "vllm_service_hub_stand_ins" in vs.FilterModule().filters()
