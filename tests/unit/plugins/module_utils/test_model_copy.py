# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_model_copy: rank 0's verified snapshot served over real HTTP on 127.0.0.1 (the real server
and client of the module, a real socket), copied, resumed, verified; wrong keys, foreign names
and path traversal refused; the server always stops (peers done, idle)."""

from __future__ import annotations

import hashlib
import http.client
import os
import socket
import threading
import time

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.models import copy as mc
from ansible_collections.uma.vllm.plugins.module_utils.models import fetch as mf
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError, atomic_write_json
from ansible_collections.uma.vllm.plugins.module_utils.node.cluster import link_auth as _link_auth

KEY = "ab" * 32
COMMIT = "c0ffee" * 6 + "abcd"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _key(path, text=KEY):
    path.write_text(text + "\n")
    path.chmod(0o600)
    return str(path)


@pytest.fixture
def rank0(tmp_path):
    """A verified snapshot as model_fetch leaves it: files + manifest with sizes and sha256."""
    root = tmp_path / "rank0" / "lab" / "tiny"
    (root / "sub").mkdir(parents=True)
    data = {
        "model-00001-of-00002.safetensors": os.urandom(3 * mc.BLOCK // 2 + 17),
        "model-00002-of-00002.safetensors": os.urandom(1000),
        "config.json": b'{"model_type": "llama"}',
        "sub/tokenizer.json": b"{}",
    }
    files = {}
    for name, blob in data.items():
        (root / name).write_bytes(blob)
        files[name] = {"size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
    (root / "secret.txt").write_text("not part of the snapshot")
    (tmp_path / "outside").write_text("outside the snapshot")
    manifest = {"repo_id": "lab/tiny", "revision": "main", "commit": COMMIT, "endpoint": "x", "files": files}
    atomic_write_json(str(root / mf.MANIFEST), manifest)
    return root, files, data


class Server:
    def __init__(self, tmp_path, root, peers=1, idle_s=30.0, key=KEY, port=None):
        self.port = port or _free_port()
        self.said = []
        params = {
            "dest": str(root), "repo_id": "lab/tiny", "commit": COMMIT, "bind": "127.0.0.1", "port": self.port,
            "key_file": _key(tmp_path / "server.key", key), "peers": peers, "idle_s": idle_s, "timeout_s": 60,
        }  # fmt: skip
        self.request = mc.validate_serve(params)
        self.result = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        for _attempt in range(100):
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.1).close()
                break
            except OSError:
                threading.Event().wait(0.05)

    def _run(self):
        self.result = mc.serve(self.request, self.said.append)

    def stop(self, timeout=40):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the copy server did not stop"
        return self.result


def receive_params(tmp_path, files, port, key=KEY, verify=False):
    return {
        "dest": str(tmp_path / "rank1" / "lab" / "tiny"), "repo_id": "lab/tiny", "revision": "main",
        "commit": COMMIT, "files": [dict(name=n, **v) for n, v in files.items()],
        "source": "http://127.0.0.1:%d" % port, "key_file": _key(tmp_path / "client.key", key),
        "verify": verify, "label": "engine tp, rank 0 on ai1", "timeout_s": 10,
    }  # fmt: skip


def test_copy_verifies_every_file_then_nothing_to_do(tmp_path, rank0):
    root, files, data = rank0
    server = Server(tmp_path, root)
    p = mc.plan_receive(mc.validate_receive(receive_params(tmp_path, files, server.port)))
    assert p.changed and sorted(p.stale) == sorted(files) and p.need_bytes == sum(v["size"] for v in files.values())
    manifest = mc.execute_receive(p)
    served = server.stop()
    assert served["stopped"] == "peers done" and served["done_ok"] == 1 and served["refused"] == 0
    assert served["files"] == 4 and served["bytes"] == sum(len(b) for b in data.values())
    dest = tmp_path / "rank1" / "lab" / "tiny"
    for name, blob in data.items():
        assert (dest / name).read_bytes() == blob
    assert not (dest / "secret.txt").exists() and not (dest / mc.PART_DIR).exists()
    assert manifest["commit"] == COMMIT and manifest["files"] == files
    # model_fetch reads the manifest the copy wrote (switching the source keeps the files)
    assert mf.read_manifest(str(dest))["files"] == files

    again = mc.plan_receive(mc.validate_receive(receive_params(tmp_path, files, 9, verify=True)))
    assert not again.changed and again.stale == [] and sorted(again.verified) == sorted(
        n for n in files if n.endswith(".safetensors"))  # fmt: skip


def test_a_damaged_local_shard_is_found_by_verify_and_copied_again(tmp_path, rank0):
    root, files, data = rank0
    server = Server(tmp_path, root, peers=2)
    mc.execute_receive(mc.plan_receive(mc.validate_receive(receive_params(tmp_path, files, server.port))))
    shard = tmp_path / "rank1" / "lab" / "tiny" / "model-00002-of-00002.safetensors"
    shard.write_bytes(b"\0" * 1000)  # same size, other bytes
    params = receive_params(tmp_path, files, server.port, verify=True)
    with pytest.raises(UmaError) as err:
        mc.plan_receive(mc.validate_receive(params))
    assert "option 'verify'" in err.value.message and "damaged" in err.value.message and str(shard) in err.value.message
    shard.unlink()
    p = mc.plan_receive(mc.validate_receive(params))
    assert p.stale == ["model-00002-of-00002.safetensors"]
    mc.execute_receive(p)
    assert shard.read_bytes() == data["model-00002-of-00002.safetensors"]
    assert server.stop()["done_ok"] == 2


def test_a_partial_copy_resumes_with_a_range(tmp_path, rank0):
    root, files, data = rank0
    name = "model-00001-of-00002.safetensors"
    server = Server(tmp_path, root)
    params = receive_params(tmp_path, files, server.port)
    part = mc._part_path(params["dest"], name)
    os.makedirs(os.path.dirname(part))
    kept = mc.BLOCK + 5
    with open(part, "wb") as handle:
        handle.write(data[name][:kept])
    p = mc.plan_receive(mc.validate_receive(params))
    assert p.need_bytes == sum(v["size"] for v in files.values()) - kept
    mc.execute_receive(p)
    assert p.resumed == {name: kept}
    served = server.stop()
    assert served["bytes"] == sum(len(b) for b in data.values()) - kept
    assert (tmp_path / "rank1" / "lab" / "tiny" / name).read_bytes() == data[name]


def test_a_damaged_partial_file_fails_naming_it_and_is_deleted(tmp_path, rank0):
    root, files, _data = rank0
    name = "model-00001-of-00002.safetensors"
    server = Server(tmp_path, root)
    params = receive_params(tmp_path, files, server.port)
    part = mc._part_path(params["dest"], name)
    os.makedirs(os.path.dirname(part))
    with open(part, "wb") as handle:
        handle.write(b"\xff" * 100)  # not what rank 0 has
    with pytest.raises(UmaError) as err:
        mc.execute_receive(mc.plan_receive(mc.validate_receive(params)))
    assert "sent %s as" % name in err.value.message and "engine tp, rank 0 on ai1" in err.value.message
    assert not os.path.exists(part)
    assert not os.path.exists(os.path.join(params["dest"], mf.MANIFEST))
    assert server.stop()["done_failed"] == 1


def test_a_wrong_key_is_refused_and_said(tmp_path, rank0):
    root, files, _data = rank0
    server = Server(tmp_path, root)
    params = receive_params(tmp_path, files, server.port, key="cd" * 32)
    with pytest.raises(UmaError) as err:
        mc.execute_receive(mc.plan_receive(mc.validate_receive(params)))
    msg = err.value.message
    assert "option 'key_file'" in msg and "(401)" in msg and "link key differs from rank 0's" in msg
    assert not os.path.exists(os.path.join(params["dest"], files and "config.json"))
    # the right key still works on the same server (a refusal does not stop it)
    mc.execute_receive(mc.plan_receive(mc.validate_receive(receive_params(tmp_path, files, server.port))))
    served = server.stop()
    assert served["refused"] >= 1 and any("wrong MAC" in line for line in server.said), server.said
    assert served["done_ok"] == 1


def _signed_get(port, path):
    headers = _link_auth.request_headers(KEY.encode(), "%s|" % path, "GET")[0]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path, headers=headers)
        return conn.getresponse().status
    finally:
        conn.close()


@pytest.mark.parametrize(
    "path", ["/f/secret.txt", "/f/../outside", "/f/%2e%2e/outside", "/f/sub/../secret.txt", "/f/" + mf.MANIFEST,
             "/f//etc/passwd", "/etc/passwd", "/f/"],
)  # fmt: skip
def test_only_the_snapshot_s_files_are_served(tmp_path, rank0, path):
    root = rank0[0]
    server = Server(tmp_path, root, idle_s=1)
    assert _signed_get(server.port, path) == 404
    assert _signed_get(server.port, "/f/config.json") == 200
    assert server.stop()["stopped"] == "idle"


def test_a_symlink_in_place_of_a_file_is_not_served(tmp_path, rank0):
    root = rank0[0]
    (root / "config.json").unlink()
    (root / "config.json").symlink_to(tmp_path / "outside")
    with pytest.raises(UmaError):  # its size no longer matches the manifest
        Server(tmp_path, root, idle_s=1)


def test_an_unreachable_rank0_names_the_engine_node_and_fix(tmp_path, rank0, monkeypatch):
    files = rank0[1]
    monkeypatch.setattr(mc, "SERVER_START_S", 1.0)
    params = receive_params(tmp_path, files, _free_port())
    started = time.monotonic()
    with pytest.raises(UmaError) as err:
        mc.execute_receive(mc.plan_receive(mc.validate_receive(params)))
    assert 1.0 <= time.monotonic() - started < 8.0  # tried again while the server could be starting
    msg = err.value.message
    assert "engine tp, rank 0 on ai1's copy server cannot be reached" in msg
    assert "vllm_service_model_source: hub" in msg and "uma_cluster_addr" in msg


def test_a_copy_server_that_starts_late_is_waited_for(tmp_path, rank0):
    """Rank 0's server is an async task started just before the other ranks connect; under load the
    first request came before it listened (fresh-clone run, 28 Nov). A refused connection is tried
    again for SERVER_START_S: here the server starts 2 s after the receive began."""
    root, files, data = rank0
    port = _free_port()
    params = receive_params(tmp_path, files, port)
    servers = []

    def late():
        time.sleep(2.0)
        servers.append(Server(tmp_path, root, port=port))

    starter = threading.Thread(target=late, daemon=True)
    starter.start()
    started = time.monotonic()
    mc.execute_receive(mc.plan_receive(mc.validate_receive(params)))
    assert time.monotonic() - started >= 2.0
    starter.join(10)
    assert (tmp_path / "rank1" / "lab" / "tiny" / "config.json").read_bytes() == data["config.json"]
    assert servers[0].stop()["done_ok"] == 1


def test_serve_refuses_a_snapshot_of_another_commit(tmp_path, rank0):
    root = rank0[0]
    params = {"dest": str(root), "repo_id": "lab/tiny", "commit": "f" * 40, "bind": "127.0.0.1", "port": 1,
              "key_file": _key(tmp_path / "k"), "peers": 1, "idle_s": 1, "timeout_s": 1}  # fmt: skip
    with pytest.raises(UmaError) as err:
        mc.validate_serve(params)
    assert "holds no verified snapshot of lab/tiny at commit" in err.value.message


@pytest.mark.parametrize(
    "change, option",
    [
        ({"files": [{"name": "../x", "size": 1, "sha256": "a" * 64}]}, "files"),
        ({"files": [{"name": "/etc/passwd", "size": 1, "sha256": "a" * 64}]}, "files"),
        ({"files": [{"name": "x", "size": 1, "sha256": None}]}, "files"),
        ({"files": [{"name": ".uma-copy/x", "size": 1, "sha256": "a" * 64}]}, "files"),
        ({"files": []}, "files"),
        ({"source": "http://127.0.0.1:0"}, "source"),
        ({"source": "https://user:pw@h:1"}, "source"),
        ({"commit": "x y"}, "commit"),
        ({"key_file": "relative"}, "key_file"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"verify": "yes"}, "verify"),
    ],
)
def test_bad_receive_options_are_refused_naming_them(tmp_path, rank0, change, option):
    files = rank0[1]
    params = dict(receive_params(tmp_path, files, 1), **change)
    with pytest.raises(UmaError) as err:
        mc.validate_receive(params)
    assert "option '%s'" % option in err.value.message


def test_too_little_space_copies_nothing(tmp_path, rank0):
    files = rank0[1]
    with pytest.raises(UmaError) as err:
        mc.plan_receive(mc.validate_receive(receive_params(tmp_path, files, 1)), free=lambda _p: 10)
    assert "option 'dest'" in err.value.message and "nothing was copied" in err.value.message
    assert not (tmp_path / "rank1").exists()


# --------------------------------------------------------------------------
# a local model_path on one node: index, serve the index, copy it (issue 34 item 3b)


@pytest.fixture
def local_model(tmp_path):
    """A Hugging Face cache snapshot as `hf download` leaves it: files are symlinks into ../../blobs."""
    repo = tmp_path / "hub" / "models--lab--tiny"
    snap, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    (snap / "sub").mkdir(parents=True)
    blobs.mkdir()
    data = {
        "config.json": b'{"model_type": "llama"}',
        "model.safetensors": os.urandom(2 * mc.BLOCK + 5),
        "sub/tokenizer.json": b"{}",
    }
    for name, blob in data.items():
        digest = hashlib.sha256(blob).hexdigest()
        (blobs / digest).write_bytes(blob)
        (snap / name).symlink_to(os.path.relpath(blobs / digest, (snap / name).parent))
    (snap / mc.PART_DIR).mkdir()
    (snap / mc.PART_DIR / "left.part").write_bytes(b"x")
    (snap / ".cache").mkdir()
    (snap / ".cache" / "huggingface").write_bytes(b"y")
    return snap, data


def test_an_index_lists_every_file_with_its_hash_and_a_digest(local_model):
    snap, data = local_model
    found = mc.index(str(snap), hashed=True)
    assert [f["name"] for f in found["files"]] == sorted(data)  # bookkeeping (.uma-copy, .cache) left out
    assert {f["name"]: f["sha256"] for f in found["files"]} == {n: hashlib.sha256(b).hexdigest()
                                                                for n, b in data.items()}  # fmt: skip
    assert found["bytes"] == sum(len(b) for b in data.values()) and len(found["commit"]) == 64
    assert mc.index(str(snap), hashed=True)["commit"] == found["commit"]
    quick = mc.index(str(snap), hashed=False)
    assert quick["commit"] is None and all(f["sha256"] is None for f in quick["files"])
    # a changed byte changes the digest
    (snap / "sub" / "tokenizer.json").unlink()
    (snap / "sub" / "tokenizer.json").write_bytes(b"[]")
    assert mc.index(str(snap), hashed=True)["commit"] != found["commit"]


@pytest.mark.parametrize("breakage, problem", [
    ("no_config", "has no config.json"),
    ("dangling", "cannot be read"),
    ("fifo", "is not a regular file"),
    ("linked_dir", "sub2 is a symlink to a directory, which the copy does not follow"),
])  # fmt: skip
def test_an_index_refuses_what_cannot_be_copied(local_model, breakage, problem):
    snap, _data = local_model
    if breakage == "no_config":
        (snap / "config.json").unlink()
    elif breakage == "dangling":
        (snap / "gone.json").symlink_to("nowhere")
    elif breakage == "linked_dir":
        (snap / "sub2").symlink_to("sub")
    else:
        os.mkfifo(str(snap / "pipe"))
    with pytest.raises(UmaError) as err:
        mc.index(str(snap), hashed=False)
    assert err.value.option == "dest" and problem in err.value.message


def _index_server(tmp_path, snap, found, **change):
    port = _free_port()
    params = dict({
        "dest": str(snap), "repo_id": "local/tp2", "commit": found["commit"], "files": found["files"],
        "bind": "127.0.0.1", "port": port, "key_file": _key(tmp_path / "server.key"), "peers": 1, "idle_s": 30,
        "timeout_s": 60,
    }, **change)  # fmt: skip
    return port, params


def test_an_index_is_served_through_its_symlinks_and_copied_config_json_last(tmp_path, local_model, monkeypatch):
    snap, data = local_model
    found = mc.index(str(snap), hashed=True)
    port, params = _index_server(tmp_path, snap, found)
    request = mc.validate_serve(params)
    result = {}
    thread = threading.Thread(target=lambda: result.update(mc.serve(request, print)), daemon=True)
    thread.start()
    dest = tmp_path / "ai2" / "models" / "tiny"
    receive = {
        "dest": str(dest), "repo_id": "local/tp2", "revision": "local", "commit": found["commit"],
        "files": found["files"], "source": "http://127.0.0.1:%d" % port, "key_file": _key(tmp_path / "client.key"),
        "verify": True, "label": "engine tp2, /models/tiny on ai1", "timeout_s": 10,
    }  # fmt: skip
    p = mc.plan_receive(mc.validate_receive(receive))
    assert p.stale[-1] == "config.json" and sorted(p.stale) == sorted(data)
    order = []
    real_replace = os.replace
    monkeypatch.setattr(mc.os, "replace", lambda a, b: (order.append(os.path.relpath(b, dest)), real_replace(a, b)))
    mc.execute_receive(p)
    thread.join(40)
    assert result["stopped"] == "peers done" and result["files"] == 3
    assert order[-1] == "config.json" and order[:2] == ["model.safetensors", "sub/tokenizer.json"]
    for name, blob in data.items():
        assert (dest / name).read_bytes() == blob and not (dest / name).is_symlink()
    assert not (dest / mc.PART_DIR).exists()
    assert not mc.plan_receive(mc.validate_receive(receive)).changed  # its manifest says it is whole


def test_an_index_with_another_digest_or_a_file_changed_since_is_not_served(tmp_path, local_model):
    snap, _data = local_model
    found = mc.index(str(snap), hashed=True)
    _port, params = _index_server(tmp_path, snap, found, commit="d" * 64)
    with pytest.raises(UmaError) as err:
        mc.validate_serve(params)
    assert err.value.option == "commit" and "is not the digest of the files given" in err.value.message
    (snap / "sub" / "tokenizer.json").unlink()
    (snap / "sub" / "tokenizer.json").write_bytes(b"[1]")
    _port, params = _index_server(tmp_path, snap, found)
    with pytest.raises(UmaError) as err:
        mc.validate_serve(params)
    assert "sub/tokenizer.json is not a 2-byte file as when it was indexed (3 bytes)" in err.value.message
    assert "run again" in err.value.message
