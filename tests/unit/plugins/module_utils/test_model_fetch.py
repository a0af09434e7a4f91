# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_model_fetch without a network: validation, the free-space refusal, the manifest, verify.

``StandInHubClient`` is a STAND-IN FOR THE HUB at the client's level (the methods
_model_fetch calls: ``listing``, ``read_file`` and ``download``) over local directories; the real client
against the HTTP stand-in is tests/integration/test_model_fetch_live.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from typing import Dict, Tuple

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.models import fetch as mf
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError


class RevisionNotFoundError(Exception):
    """Named like huggingface_hub's, so _hub_problem maps it as it maps the real one."""


class RepositoryNotFoundError(Exception):
    pass


class StandInHubClient:
    """A stand-in for the Hub: repos {id: (dir, gated)}; the commit is a hash over the files."""

    repos: Dict[str, Tuple[str, bool]] = {}

    def __init__(self, request: mf.Request) -> None:
        self.view = mf.HubRequestView.of(request)
        self.downloads = 0

    @staticmethod
    def _files(root: str):
        out = []
        for name in sorted(os.listdir(root)):
            path = os.path.join(root, name)
            if os.path.isfile(path) and not os.path.islink(path):
                sha = mf.sha256_of(path)
                out.append(mf.HubFile(name, os.path.getsize(path), sha if name.endswith(".safetensors") else None))
        return out

    def _repo(self, repo_id: str) -> Tuple[str, bool]:
        if repo_id not in self.repos:
            raise mf._hub_problem(RepositoryNotFoundError("404 Repository not found"), self.view)
        return self.repos[repo_id]

    def listing(self, repo_id: str, revision: str) -> mf.Listing:
        root, gated = self._repo(repo_id)
        files = self._files(root)
        commit = hashlib.sha1("".join(f.name + str(f.lfs_sha256) + str(f.size) for f in files).encode()).hexdigest()
        if revision not in ("main", commit):
            raise mf._hub_problem(RevisionNotFoundError("404 Invalid rev id: %s" % revision), self.view)
        return mf.Listing(commit, files, gated)

    def read_file(self, repo_id: str, commit: str, name: str) -> bytes:
        root, _gated = self._repo(repo_id)
        self.peeks = getattr(self, "peeks", 0) + 1
        with open(os.path.join(root, name), "rb") as handle:
            return handle.read()

    def download(self, repo_id: str, commit: str, dest: str, patterns, files=None) -> None:
        root, _gated = self._repo(repo_id)
        self.downloads += 1
        for item in self._files(root):
            if mf.matches(item.name, patterns) and not os.path.exists(os.path.join(dest, item.name)):
                shutil.copyfile(os.path.join(root, item.name), os.path.join(dest, item.name))


def make_repo(root: str) -> str:
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "config.json"), "w") as handle:
        json.dump({"model_type": "llama"}, handle)
    for index in (1, 2):
        with open(os.path.join(root, "model-0000%d-of-00002.safetensors" % index), "wb") as handle:
            handle.write(bytes(range(256)) * (64 * index))
    with open(os.path.join(root, "README.md"), "w") as handle:
        handle.write("not matched by the default patterns\n")
    return root


@pytest.fixture
def hub(tmp_path):
    StandInHubClient.repos = {"lab/tiny": (make_repo(str(tmp_path / "repo")), False)}
    yield StandInHubClient
    StandInHubClient.repos = {}


def params(dest, **kw):
    out = {
        "repo_id": "lab/tiny",
        "revision": "main",
        "dest": dest,
        "endpoint": None,
        "allow_patterns": None,
        "verify": False,
        "token_file": None,
    }
    out.update(kw)
    return out


def fetch(hub, dest, free=None, **kw):
    request = mf.validate(params(dest, **kw))
    client = hub(request)
    plan = mf.plan(request, client, free=free)
    done = mf.execute(plan, client) if plan.changed else None
    return plan, mf.result(plan, done), client


@pytest.mark.parametrize(
    "option,value,words",
    [
        ("repo_id", "llama", "OWNER/NAME"),
        ("repo_id", "a/b/c", "OWNER/NAME"),
        ("repo_id", "a--b/c", "'--'"),
        ("repo_id", "-a/b", "OWNER/NAME"),
        ("repo_id", 5, "OWNER/NAME"),
        ("revision", "", "branch"),
        ("revision", "a..b", "git reference"),
        ("revision", "main\n", "branch"),
        ("dest", "relative/dir", "absolute"),
        ("dest", "/", "root"),
        ("endpoint", "ftp://x", "http(s) URL"),
        ("endpoint", "https://user:pw@hub", "http(s) URL"),
        ("endpoint", "https://hub/?q=1", "http(s) URL"),
        ("allow_patterns", [], "list of 1-"),
        ("allow_patterns", ["a\nb"], "one-line"),
        ("verify", "yes", "boolean"),
        ("token_file", "relative", "absolute"),
    ],
)
def test_bad_input_names_option_value_and_fix(tmp_path, option, value, words):
    with pytest.raises(UmaError) as err:
        mf.validate(dict(params(str(tmp_path / "d")), **{option: value}))
    assert err.value.option == option and words in err.value.message and ". " in err.value.message


def test_dest_that_is_a_file_or_symlink_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path)
    for dest in (tmp_path / "f", tmp_path / "link", tmp_path / "f" / "below"):
        with pytest.raises(UmaError) as err:
            mf.validate(params(str(dest)))
        assert err.value.option == "dest"


def test_token_file_mode_content_never_shown(tmp_path):
    secret = "hf_" + "s3cr3t" * 4
    token = tmp_path / "tok"
    token.write_text(secret + "\n")
    token.chmod(0o640)
    with pytest.raises(UmaError) as err:
        mf.read_token(str(token))
    assert "0640" in err.value.message and "chmod 600" in err.value.message and secret not in err.value.message
    token.chmod(0o600)
    assert mf.read_token(str(token)) == secret
    token.write_text("two words here")
    with pytest.raises(UmaError) as err:
        mf.read_token(str(token))
    assert "two words" not in err.value.message and err.value.option == "token_file"


def test_token_file_missing_is_refused(tmp_path):
    with pytest.raises(UmaError) as err:
        mf.validate(params(str(tmp_path / "d"), token_file=str(tmp_path / "missing")))
    assert err.value.option == "token_file" and "cannot be read" in err.value.message


def test_fetch_then_idempotent_and_manifest(hub, tmp_path):
    dest = str(tmp_path / "dest")
    plan, res, client = fetch(hub, dest)
    assert plan.changed and client.downloads == 1
    names = sorted(f["name"] for f in res["files"])
    assert names == ["config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    manifest = json.load(open(os.path.join(dest, mf.MANIFEST)))
    assert manifest["commit"] == res["commit"] and sorted(manifest["files"]) == names
    assert all(f["sha256"] for f in res["files"])
    plan, res, client = fetch(hub, dest, verify=True)
    assert not plan.changed and client.downloads == 0 and res["verified"] == names[1:]


def test_too_little_space_refused_before_anything(hub, tmp_path):
    dest = str(tmp_path / "dest")
    with pytest.raises(UmaError) as err:
        fetch(hub, dest, free=lambda _path: 4096)
    msg = err.value.message
    assert err.value.option == "dest" and dest in msg and "needs 49175 bytes" in msg and "4096 bytes" in msg
    assert not os.path.exists(dest)


def test_space_counts_only_what_is_missing(hub, tmp_path):
    dest = str(tmp_path / "dest")
    fetch(hub, dest)
    os.unlink(os.path.join(dest, "model-00001-of-00002.safetensors"))
    plan, res, _client = fetch(hub, dest, free=lambda _path: 16384 + 1)
    assert plan.need_bytes == 16384 and res["download"]["files"] == ["model-00001-of-00002.safetensors"]


def test_verify_names_the_damaged_shard(hub, tmp_path):
    dest = str(tmp_path / "dest")
    fetch(hub, dest)
    shard = os.path.join(dest, "model-00002-of-00002.safetensors")
    data = bytearray(open(shard, "rb").read())
    data[100] ^= 1
    open(shard, "wb").write(bytes(data))
    plan, _res, _client = fetch(hub, dest)  # without verify: sizes agree, nothing to do
    assert not plan.changed
    with pytest.raises(UmaError) as err:
        fetch(hub, dest, verify=True)
    assert shard in err.value.message and err.value.option == "verify" and "Delete" in err.value.message


def test_download_that_delivers_wrong_bytes_fails_naming_file(hub, tmp_path, monkeypatch):
    dest = str(tmp_path / "dest")
    real = StandInHubClient.download

    def corrupting(self, repo_id, commit, dest, patterns, files=None):
        real(self, repo_id, commit, dest, patterns)
        path = os.path.join(dest, "model-00001-of-00002.safetensors")
        data = bytearray(open(path, "rb").read())
        data[0] ^= 1
        open(path, "wb").write(bytes(data))

    monkeypatch.setattr(StandInHubClient, "download", corrupting)
    with pytest.raises(UmaError) as err:
        fetch(hub, dest)
    assert "model-00001-of-00002.safetensors" in err.value.message and "Hub lists" in err.value.message
    assert not os.path.exists(os.path.join(dest, mf.MANIFEST))


def test_gated_without_token_refused(hub, tmp_path):
    root, _gated = hub.repos["lab/tiny"]
    hub.repos["lab/gated"] = (root, True)
    with pytest.raises(UmaError) as err:
        fetch(hub, str(tmp_path / "dest"), repo_id="lab/gated")
    assert err.value.option == "token_file" and "gated" in err.value.message


def test_unknown_revision_and_repo_name_their_option(hub, tmp_path):
    with pytest.raises(UmaError) as err:
        fetch(hub, str(tmp_path / "dest"), revision="v9")
    assert err.value.option == "revision"
    with pytest.raises(UmaError) as err:
        fetch(hub, str(tmp_path / "dest"), repo_id="lab/none")
    assert err.value.option == "repo_id"


def test_hub_problem_scrubs_the_token():
    view = mf.HubRequestView("a/b", "main", "https://hub", "/t", "hf_secretsecret")

    class HfHubHTTPError(Exception):
        pass

    err = mf._hub_problem(HfHubHTTPError("500 for url with hf_secretsecret in it"), view)
    assert "hf_secretsecret" not in err.message and err.option == "endpoint"


def test_patterns_that_match_nothing_refused(hub, tmp_path):
    with pytest.raises(UmaError) as err:
        fetch(hub, str(tmp_path / "dest"), allow_patterns=["*.gguf"])
    assert err.value.option == "allow_patterns"


def test_old_huggingface_hub_refused(monkeypatch, tmp_path):
    import types

    monkeypatch.setitem(__import__("sys").modules, "huggingface_hub", types.SimpleNamespace(__version__="0.20.3"))
    with pytest.raises(UmaError) as err:
        mf.HubClient(mf.validate(params(str(tmp_path / "d"))))
    assert "0.20.3" in err.value.message and ">= 0.23" in err.value.message
    assert mf._version_tuple("2.4.0") >= mf.MIN_HUB_VERSION and mf._version_tuple("0.23.0rc1") == (0, 23)


def test_listing_without_sizes_refused(monkeypatch, tmp_path):
    import types

    sibling = types.SimpleNamespace(rfilename="model.safetensors", size=None, lfs=None)
    info = types.SimpleNamespace(sha="a" * 40, siblings=[sibling], gated=False)
    api = types.SimpleNamespace(model_info=lambda *a, **kw: info)
    fake = types.SimpleNamespace(__version__="2.4.0", HfApi=lambda **kw: api)
    monkeypatch.setitem(__import__("sys").modules, "huggingface_hub", fake)
    client = mf.HubClient(mf.validate(params(str(tmp_path / "d"))))
    with pytest.raises(UmaError) as err:
        client.listing("lab/tiny", "main")
    assert err.value.option == "endpoint" and "without sizes" in err.value.message


def test_check_mode_peeks_at_config_json_and_writes_nothing(hub, tmp_path):
    """Issue 34 item 2: check mode on a node without the model returns the config.json of the commit and
    the listed safetensors bytes, so that the role plans the engine before the download."""
    dest = str(tmp_path / "models" / "lab" / "tiny")
    request = mf.validate(params(dest))
    client = hub(request)
    p = mf.plan(request, client, peek=True)
    assert p.config == {"model_type": "llama"} and p.weights_bytes == 256 * 64 * 3 and client.peeks == 1
    assert not os.path.exists(dest) and client.downloads == 0
    out = mf.result(p, None)
    assert out["config"] == {"model_type": "llama"} and out["weights_bytes"] == 256 * 64 * 3
    assert mf.result(mf.plan(request, client), None)["config"] is None  # a real run does not peek
    # downloaded: the local config.json is read, the Hub not asked for it again
    mf.execute(mf.plan(request, client), client)
    again = hub(request)
    assert mf.plan(request, again, peek=True).config == {"model_type": "llama"} and not getattr(again, "peeks", 0)


def test_a_config_json_that_is_not_json_is_refused_naming_the_model(hub, tmp_path):
    root, _gated = hub.repos["lab/tiny"]
    with open(os.path.join(root, "config.json"), "w") as handle:
        handle.write("[1, 2")
    request = mf.validate(params(str(tmp_path / "d")))
    with pytest.raises(UmaError) as err:
        mf.plan(request, hub(request), peek=True)
    assert err.value.option == "repo_id" and "config.json" in err.value.message and "not JSON" in err.value.message
