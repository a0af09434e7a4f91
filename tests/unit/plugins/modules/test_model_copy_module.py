"""uma.vllm.model_copy as Ansible runs it, in-process (the conftest's run_module).

Receive mode against the module's REAL copy server on 127.0.0.1 (the Server helper of
tests/unit/plugins/module_utils/test_model_copy.py: mc.serve in a thread, a real socket): check mode
predicts and writes nothing (and opens no connection: its source is a closed port), the run copies
what check mode predicted, the re-run changes nothing, --diff shows the manifest's commit and files,
the link key is in no result. Serve mode: check mode binds nothing; bad numbers are refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.models import copy as mc
from ansible_collections.uma.vllm.plugins.modules import model_copy

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "module_utils"))
from test_model_copy import COMMIT, KEY, Server, _free_port, receive_params

from ansible_collections.uma.vllm.plugins.module_utils.models import fetch as mf
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import atomic_write_json


@pytest.fixture
def rank0(tmp_path):
    """Rank 0's verified snapshot as model_fetch leaves it (files + manifest with sizes and sha256)."""
    root = tmp_path / "rank0" / "lab" / "tiny"
    (root / "sub").mkdir(parents=True)
    data = {"model.safetensors": os.urandom(mc.BLOCK + 99), "config.json": b"{}", "sub/tokenizer.json": b"{}"}
    files = {}
    for name, blob in data.items():
        (root / name).write_bytes(blob)
        files[name] = {"size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
    manifest = {"repo_id": "lab/tiny", "revision": "main", "commit": COMMIT, "endpoint": "x", "files": files}
    atomic_write_json(str(root / mf.MANIFEST), manifest)
    return root, files, data


def _closed_port() -> int:
    return _free_port()  # nothing listens there: a connection attempt fails at once


def _args(tmp_path, files, port, **kw):
    params = receive_params(tmp_path, files, port)
    return dict(params, mode="receive", **kw)


def _no_key(*results):
    text = json.dumps(results, default=str)
    assert KEY not in text


def test_check_mode_predicts_writes_nothing_and_connects_nowhere(tmp_path, rank0, run_module):
    _root, files, _data = rank0
    failed, result = run_module(model_copy, _args(tmp_path, files, _closed_port()), check_mode=True, diff=True)
    assert not failed and result["changed"] is True
    assert sorted(result["copy"]["files"]) == sorted(files) and result["copy"]["done"] is False
    assert result["copy"]["bytes"] == sum(v["size"] for v in files.values())
    assert result["diff"]["before"] == "" and result["diff"]["after"].startswith("commit: %s\n" % COMMIT)
    assert not (tmp_path / "rank1").exists()
    _no_key(result)


def test_the_run_copies_what_check_mode_predicted_and_the_rerun_changes_nothing(tmp_path, rank0, run_module):
    root, files, data = rank0
    server = Server(tmp_path, root)
    failed, check = run_module(model_copy, _args(tmp_path, files, server.port), check_mode=True)
    failed, first = run_module(model_copy, _args(tmp_path, files, server.port), diff=True)
    served = server.stop()
    assert not failed and first["changed"] is True and first["copy"]["done"] is True
    assert sorted(first["copy"]["copied"]) == sorted(check["copy"]["files"]) == sorted(files)
    assert served["stopped"] == "peers done" and served["done_ok"] == 1
    dest = tmp_path / "rank1" / "lab" / "tiny"
    assert all((dest / name).read_bytes() == blob for name, blob in data.items())
    assert first["diff"]["after"] == "commit: %s\n" % COMMIT + "".join("%s\n" % n for n in sorted(files))
    # the re-run (rank 0's server is gone: a second copy would fail) and its check mode: nothing to do
    for check_mode in (True, False):
        failed, again = run_module(model_copy, _args(tmp_path, files, _closed_port()), check_mode=check_mode,
                                   diff=True)  # fmt: skip
        assert not failed and again["changed"] is False and again["copy"]["files"] == []
        assert again["diff"]["before"] == again["diff"]["after"]
    _no_key(check, first, again)


def test_a_wrong_key_fails_naming_key_file_without_the_key(tmp_path, rank0, run_module):
    root, files, _data = rank0
    server = Server(tmp_path, root, idle_s=1)
    params = _args(tmp_path, files, server.port)
    (tmp_path / "client.key").write_text("ef" * 32 + "\n")
    failed, result = run_module(model_copy, params)
    served = server.stop()
    assert failed and result["msg"].startswith("option 'key_file' = ") and "(401)" in result["msg"]
    assert served["refused"] >= 1
    assert not (tmp_path / "rank1").exists()  # nothing of the failed copy is left
    _no_key(result, served)
    assert "ef" * 32 not in json.dumps(result)


def test_serve_check_mode_binds_nothing(tmp_path, rank0, run_module):
    root, _files, _data = rank0
    port = _free_port()
    key = tmp_path / "server.key"
    key.write_text(KEY + "\n")
    key.chmod(0o600)
    params = {"mode": "serve", "dest": str(root), "repo_id": "lab/tiny", "commit": COMMIT, "key_file": str(key),
              "bind": "127.0.0.1", "port": str(port), "peers": 1}  # fmt: skip
    failed, result = run_module(model_copy, params, check_mode=True)
    assert not failed and result["changed"] is False and result["served"] == {}
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # still free
    _no_key(result)


@pytest.mark.parametrize(
    "option, value",
    [("peers", "inf"), ("port", "inf"), ("port", "nan"), ("peers", 0), ("port", 70000), ("port", True),
     ("port", "29512x"), ("peers", 1.5)],
)  # fmt: skip
def test_serve_refuses_a_bad_number_naming_it(tmp_path, rank0, run_module, option, value):
    """Regression ('inf', 'nan'): port/peers were type int, and ansible-core's int check raised OverflowError
    on 'inf' (a traceback); they are checked by the module now, naming the option and the range."""
    root, _files, _data = rank0
    key = tmp_path / "server.key"
    key.write_text(KEY + "\n")
    key.chmod(0o600)
    params = {"mode": "serve", "dest": str(root), "repo_id": "lab/tiny", "commit": COMMIT, "key_file": str(key),
              "bind": "127.0.0.1", "port": 29512, "peers": 1, option: value}  # fmt: skip
    failed, result = run_module(model_copy, params, check_mode=True)
    assert failed and result["msg"].startswith("option '%s' = " % option), result["msg"]
    assert "Give a number from" in result["msg"]


def test_an_unreachable_rank0_leaves_no_directory_behind(tmp_path, rank0, run_module, monkeypatch):
    """Regression: a refused copy into a new dest left dest/.uma-copy (and dest) behind."""
    _root, files, _data = rank0
    monkeypatch.setattr(mc, "SERVER_START_S", 1.0)  # a refused connection is tried again this long
    failed, result = run_module(model_copy, _args(tmp_path, files, _closed_port()))
    assert failed and result["msg"].startswith("option 'source' = ") and "cannot be reached" in result["msg"]
    assert not (tmp_path / "rank1").exists()


def test_a_directory_in_place_of_a_file_is_refused_before_copying(tmp_path, rank0, run_module):
    """The plan refuses it (model_fetch's _local_size): no connection (the source is a closed port), nothing written."""
    _root, files, _data = rank0
    dest = tmp_path / "rank1" / "lab" / "tiny"
    (dest / "config.json").mkdir(parents=True)
    failed, result = run_module(model_copy, _args(tmp_path, files, _closed_port()))
    assert failed and result["msg"].startswith("option 'dest' = ") and "not a regular file" in result["msg"]
    assert sorted(p.name for p in dest.iterdir()) == ["config.json"] and (dest / "config.json").is_dir()


def test_index_mode_reads_only_and_returns_what_the_planner_needs(tmp_path, run_module):
    """mode index on a local model directory (issue 34 item 3b): files, sizes, sha256, a digest, the
    config.json and the weight bytes; nothing written, in check mode too (hash: false there)."""
    root = tmp_path / "models" / "tiny"
    root.mkdir(parents=True)
    header = json.dumps({"w": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, 32]}}).encode()
    shard = len(header).to_bytes(8, "little") + header + b"\0" * 32
    (root / "model.safetensors").write_bytes(shard)
    (root / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 4}))
    before = sorted(os.listdir(root))
    failed, result = run_module(model_copy, {"mode": "index", "dest": str(root)})
    assert not failed and result["changed"] is False, result
    assert [f["name"] for f in result["files"]] == ["config.json", "model.safetensors"]
    assert result["files"][1]["sha256"] == hashlib.sha256(shard).hexdigest() and len(result["commit"]) == 64
    assert result["weights_bytes"] == 32 and result["config"]["model_type"] == "llama"
    failed, quick = run_module(model_copy, {"mode": "index", "dest": str(root), "hash": False}, check_mode=True)
    assert not failed and quick["commit"] is None and quick["bytes"] == result["bytes"]
    assert sorted(os.listdir(root)) == before
    failed, result = run_module(model_copy, {"mode": "index", "dest": str(tmp_path / "none")})
    assert failed and result["msg"].startswith("option 'dest' = ") and "has no config.json" in result["msg"]


def test_serve_and_receive_still_require_what_they_need(tmp_path, run_module):
    failed, result = run_module(model_copy, {"mode": "serve", "dest": str(tmp_path), "bind": "127.0.0.1",
                                             "port": 1})  # fmt: skip
    assert failed and "repo_id" in result["msg"] and "commit" in result["msg"] and "key_file" in result["msg"]
