# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Issue 21 item 3: an engine's `model` (a Hub id) in the vllm_service role -- where it lands,
served_model_name, the refusals, the commit in the engine's environment (so in its launcher
config and fingerprint) and the ranks' commits (plugins/module_utils/service/hub.py)."""

from __future__ import annotations

import pytest

from ansible_collections.uma.vllm.plugins.filter import vllm_service as vs
from ansible_collections.uma.vllm.plugins.module_utils.service import hub

MODELS = "/var/lib/uma-vllm/models"
SETTINGS = {"models_dir": MODELS, "endpoint": None, "verify": True, "allow_patterns": None}
COMMIT = "a" * 40
NATIVE = {"runtime": "native", "native_command": ["vllm", "serve"]}


def engines(*raw, hostname="ai1"):
    return vs.hub_engines(vs.host_engines(list(raw), hostname, "mp"), MODELS)


def errors(*raw, settings=None, hostname="ai1"):
    found = engines(*raw, hostname=hostname)
    settings = SETTINGS if settings is None else settings
    return vs.hub_errors(found, settings, list(raw), hostname) + vs.check(found, NATIVE, ["ai1", "ai2"], {})


def test_model_lands_in_the_models_dir_and_is_served_by_its_id():
    (e,) = engines({"name": "q", "port": 8000, "model": "Qwen/Qwen3-0.6B", "plan": {"extra_args": ["--enforce-eager"]}})
    assert e["model_path"] == MODELS + "/Qwen/Qwen3-0.6B"
    assert e["hub"] == {"repo_id": "Qwen/Qwen3-0.6B", "revision": "main", "dest": e["model_path"],
                        "model_path_given": False}  # fmt: skip
    assert e["plan"]["extra_args"] == ["--enforce-eager", "--served-model-name", "Qwen/Qwen3-0.6B"]


def test_served_model_name_given_wins_and_a_model_path_engine_has_none_by_default():
    (e,) = engines({"name": "q", "port": 8000, "model": "Qwen/Qwen3-0.6B", "served_model_name": ["qwen", "q3"]})
    assert e["plan"]["extra_args"] == ["--served-model-name", "qwen", "q3"]
    (p,) = engines({"name": "p", "port": 8000, "model_path": "/models/x"})
    assert "hub" not in p and p["plan"] == {} and p["model_path"] == "/models/x"
    (n,) = engines({"name": "p", "port": 8000, "model_path": "/models/x", "served_model_name": "x"})
    assert n["plan"]["extra_args"] == ["--served-model-name", "x"]
    # the flag already in extra_args: not added twice (without served_model_name it is the user's own)
    (f,) = engines({"name": "q", "port": 8000, "model": "a/b", "plan": {"extra_args": ["--served-model-name", "z"]}})
    assert f["plan"]["extra_args"] == ["--served-model-name", "z"]


def test_a_good_engine_has_no_errors():
    found = errors({"name": "q", "port": 8000, "host": "127.0.0.1", "model": "lab/tiny-llama", "revision": "v1"})
    assert found == []


REFUSALS = [
    ("both", {"model": "a/b", "model_path": "/models/b"}, "vllm_service_engines[q].model_path = '/models/b' is given"
     " as well as model 'a/b'. Fix: Give one"),
    ("neither", {}, "vllm_service_engines[q].model_path = None is not an absolute path. Fix: Give the model directory"
     " on the node (e.g. /models/Qwen3-32B), or model: a Hub id."),
    ("bad id", {"model": "../etc"}, "vllm_service_engines[q].model = '../etc' is not a Hugging Face model id"),
    ("id without owner", {"model": "gpt2"}, "vllm_service_engines[q].model = 'gpt2' is not a Hugging Face model id"),
    ("id with --", {"model": "a/b--c"}, "vllm_service_engines[q].model = 'a/b--c' is not a Hugging Face model id"),
    ("revision alone", {"model_path": "/m", "revision": "main"}, "vllm_service_engines[q].revision = 'main' is given"
     " without model"),
    ("bad revision", {"model": "a/b", "revision": "../x"}, "vllm_service_engines[q].revision = '../x' is not a branch"),
    ("served name list empty", {"model": "a/b", "served_model_name": []}, ".served_model_name = [] is not a name"),
    ("served name flag-like", {"model": "a/b", "served_model_name": "--x"}, "has '--x', which is not a name"),
    ("served name twice", {"model": "a/b", "served_model_name": "x", "plan": {"extra_args": ["--served-model-name",
     "y"]}}, "vllm_service_engines[q].plan.extra_args = '--served-model-name' is given as well as served_model_name"),
    ("commit env", {"model": "a/b", "env": {"UMA_MODEL_COMMIT": "x"}}, ".env = 'UMA_MODEL_COMMIT' is set by the role"),
    ("token with a space", {"model": "a/b", "secrets": {"HF_TOKEN": "hf_abc def ghi"}}, "vllm_service_engines[q]"
     ".secrets.HF_TOKEN is not one Hugging Face token"),
]  # fmt: skip


@pytest.mark.parametrize("raw, expected", [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_refusals_name_the_option_the_value_and_the_fix(raw, expected):
    found = errors(dict({"name": "q", "port": 8000, "host": "127.0.0.1"}, **raw))
    assert any(expected in err for err in found), found
    assert "hf_abc" not in " ".join(found)


ROLE_REFUSALS = [
    ("models_dir relative", {"models_dir": "models"}, "vllm_service_models_dir = 'models' is not an absolute"),
    ("models_dir root", {"models_dir": "/"}, "vllm_service_models_dir = '/' is not an absolute"),
    ("endpoint", {"endpoint": "ftp://hub"}, "vllm_service_hub_endpoint = 'ftp://hub' is not an http(s) URL"),
    ("endpoint with credentials", {"endpoint": "https://u:p@hub"}, "vllm_service_hub_endpoint = 'https://u:p@hub'"),
    ("verify", {"verify": "maybe"}, "vllm_service_model_verify = 'maybe' is not a boolean"),
    ("patterns", {"allow_patterns": "*.safetensors"}, "vllm_service_model_allow_patterns = '*.safetensors' is not"),
    ("patterns empty", {"allow_patterns": []}, "vllm_service_model_allow_patterns = [] is not"),
    ("source", {"source": "rank1"}, "vllm_service_model_source = 'rank1' is not one of rank0, hub. Fix:"),
    ("source none", {"source": None}, "vllm_service_model_source = None is not one of rank0, hub"),
]


@pytest.mark.parametrize("settings, expected", [r[1:] for r in ROLE_REFUSALS], ids=[r[0] for r in ROLE_REFUSALS])
def test_role_variables_are_checked_when_an_engine_has_a_model(settings, expected):
    raw = {"name": "q", "port": 8000, "host": "127.0.0.1", "model": "a/b"}
    found = errors(raw, settings=dict(SETTINGS, **settings))
    assert any(expected in err for err in found), found
    # an inventory without `model` is not bothered by the Hub variables
    raw = {"name": "q", "port": 8000, "host": "127.0.0.1", "model_path": "/m"}
    found = errors(raw, settings=dict(SETTINGS, **settings))
    assert found == []


def test_a_bad_models_dir_gives_no_model_path():
    found = vs.hub_engines(vs.host_engines([{"name": "q", "port": 1, "model": "a/b"}], "ai1"), "relative")
    assert found[0].get("model_path") is None and found[0]["hub"]["dest"] is None


def test_two_engines_of_one_model_with_different_revisions_on_one_host_are_refused():
    found = errors(
        {"name": "q1", "port": 8000, "host": "127.0.0.1", "model": "a/b"},
        {"name": "q2", "port": 8001, "host": "127.0.0.1", "model": "a/b", "revision": "v2"},
    )
    assert any("vllm_service_engines[q2].revision = 'v2' differs from engine q1's 'main'" in e for e in found), found


def test_the_commit_goes_into_env_so_a_new_commit_changes_the_launcher_config():
    (e,) = engines({"name": "q", "port": 8000, "model": "a/b", "env": {"X": "1"}})
    results = [{"item": e, "commit": COMMIT, "changed": True}]
    (done,) = vs.hub_fetched([e], results)
    assert done["env"] == {"X": "1", "UMA_MODEL_COMMIT": COMMIT} and done["hub"]["commit"] == COMMIT
    assert e["env"] == {"X": "1"}  # the input is not changed
    plan = {"argv": ["vllm", "serve", done["model_path"], "--served-model-name", "a/b"], "env": done["env"]}
    first = vs.launch_config(done, plan, NATIVE, {})
    (newer,) = vs.hub_fetched([e], [{"item": e, "commit": "b" * 40}])
    second = vs.launch_config(newer, dict(plan, env=newer["env"]), NATIVE, {})
    assert first["env"]["UMA_MODEL_COMMIT"] == COMMIT and second["env"]["UMA_MODEL_COMMIT"] == "b" * 40
    assert first != second and first["model_path"] == second["model_path"] == MODELS + "/a/b"


def test_a_skipped_fetch_keeps_no_commit():
    (e,) = engines({"name": "q", "port": 8000, "model": "a/b"})
    (done,) = vs.hub_fetched([e], [{"item": e, "skipped": True, "changed": False}])
    assert "commit" not in done["hub"] and "UMA_MODEL_COMMIT" not in done["env"]
    assert vs.hub_commits([done]) == {"q": None}


def _ranks():
    raw = {"name": "tp", "port": 8000, "model": "a/b", "nodes": ["ai1", "ai2"], "plan": {"tensor_parallel_size": 2}}
    (e,) = engines(raw)
    (done,) = vs.hub_fetched([e], [{"item": e, "commit": COMMIT}])
    return done


def test_ranks_with_the_same_commit_pass():
    assert vs.hub_rank_errors([_ranks()], {"ai2": {"__vllm_service_model_commits": {"tp": COMMIT}}}, "ai1") == []


def test_a_rank_with_another_commit_is_refused_naming_hosts_and_commits():
    found = vs.hub_rank_errors([_ranks()], {"ai2": {"__vllm_service_model_commits": {"tp": "b" * 40}}}, "ai1")
    assert len(found) == 1 and "resolved to commit %s on ai1 but %s on ai2" % (COMMIT, "b" * 40) in found[0]


def test_a_rank_whose_fetch_failed_is_refused():
    found = vs.hub_rank_errors([_ranks()], {"ai2": {}}, "ai1")
    assert len(found) == 1 and "host ai2 (rank 1) has no commit of a/b" in found[0]
    assert vs.hub_rank_errors([_ranks()], {}, "ai1")  # a host not in hostvars at all


def test_a_rank_not_fetched_in_check_mode_is_not_compared():
    assert vs.hub_rank_errors([_ranks()], {"ai2": {"__vllm_service_model_commits": {"tp": None}}}, "ai1") == []


def test_model_dir():
    assert hub.model_dir("/srv/models/", "Qwen/Qwen3-0.6B") == "/srv/models/Qwen/Qwen3-0.6B"
