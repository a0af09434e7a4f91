"""The lab's image registry (lab/registry.sh, lab/registry_push.py): the stand-in for nvcr.io that the
quick-start test's empty nodes pull the engine image from. Run against the real thing: Debian's
docker-registry on a free port with its own storage and CA in a temporary directory, this machine's
Docker, a small image made here (one file in one layer)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import socket
import ssl
import subprocess
import tarfile
import urllib.request

import pytest
from test_vllm_parser_oracle import ROOT

SCRIPT = ROOT / "lab" / "registry.sh"
IMAGE = "itest-registry/tiny-%d:1" % os.getpid()


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    missing = [tool for tool in ("docker", "docker-registry", "openssl", "curl") if not shutil.which(tool)]
    reason = "needs root and %s" % ", ".join(missing) if missing or os.geteuid() != 0 else None
    if not reason and subprocess.run(["docker", "info"], capture_output=True, check=False).returncode != 0:
        reason = "needs a running Docker engine"
    if reason:
        if os.environ.get("UMA_REQUIRE_TOOLS") == "1":
            pytest.fail("UMA_REQUIRE_TOOLS=1 but the registry test %s" % reason)
        pytest.skip(reason)
    cache = tmp_path_factory.mktemp("registry-cache")
    env = dict(os.environ, UMA_LAB_CACHE=str(cache), UMA_LAB_REGISTRY_PORT=str(_free_port()))
    # a one-layer image: a file whose bytes the test knows
    payload = b"uma.vllm lab registry test %d\n" % os.getpid()
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        info = tarfile.TarInfo("hello.txt")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    subprocess.run(["docker", "import", "-", IMAGE], input=layer.getvalue(), check=True, capture_output=True)
    try:
        yield {"env": env, "cache": cache, "payload": payload, "port": env["UMA_LAB_REGISTRY_PORT"]}
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, check=False, capture_output=True)
        subprocess.run(["docker", "rmi", "-f", IMAGE], check=False, capture_output=True)


def _script(registry, *args):
    return subprocess.run(["bash", str(SCRIPT), *args], env=registry["env"], capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip


def _get(registry, path, accept=None):
    context = ssl.create_default_context(cafile=str(registry["cache"] / "registry" / "certs" / "ca.crt"))
    request = urllib.request.Request("https://127.0.0.1:%s%s" % (registry["port"], path))
    if accept:
        request.add_header("Accept", accept)
    with urllib.request.urlopen(request, context=context, timeout=30) as response:
        return response.read()


def test_a_pushed_image_is_served_with_its_layers_whole_and_a_second_push_sends_nothing(registry):
    pushed = _script(registry, "push", IMAGE)
    assert pushed.returncode == 0 and "pushed %s" % IMAGE in pushed.stderr, pushed.stderr
    repository, tag = IMAGE.rsplit(":", 1)
    manifest = json.loads(_get(registry, "/v2/%s/manifests/%s" % (repository, tag),
                               "application/vnd.docker.distribution.manifest.v2+json"))  # fmt: skip
    image_id = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", IMAGE], check=True,
                              capture_output=True, text=True).stdout.strip()  # fmt: skip
    assert manifest["mediaType"] == "application/vnd.docker.distribution.manifest.v2+json"
    assert manifest["config"]["digest"] == image_id
    [layer] = manifest["layers"]
    assert layer["mediaType"] == "application/vnd.docker.image.rootfs.diff.tar"
    blob = _get(registry, "/v2/%s/blobs/%s" % (repository, layer["digest"]))
    assert "sha256:" + hashlib.sha256(blob).hexdigest() == layer["digest"] and len(blob) == layer["size"]
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        assert tar.extractfile("hello.txt").read() == registry["payload"]
    config = json.loads(_get(registry, "/v2/%s/blobs/%s" % (repository, image_id)))
    assert config["rootfs"]["diff_ids"] == [layer["digest"]]
    before = _script(registry, "requests").stdout.splitlines()
    again = _script(registry, "push", IMAGE)
    assert again.returncode == 0 and "holds %s" % IMAGE in again.stderr, again.stderr
    sent = [line for line in _script(registry, "requests").stdout.splitlines()[len(before) :] if " GET " not in line]
    assert sent == [], sent
    address = _script(registry, "address").stdout.strip()
    assert address.endswith(":" + registry["port"]) and not address.startswith("127."), address


def test_bad_input_is_named_with_its_fix(registry):
    missing = _script(registry, "push", "itest-registry/none-%d:1" % os.getpid())
    assert missing.returncode == 1 and "has no image itest-registry/none" in missing.stderr, missing.stderr
    untagged = _script(registry, "push", "no tag here")
    assert untagged.returncode == 1 and "is not NAME:TAG" in untagged.stderr, untagged.stderr
    port = subprocess.run(["bash", str(SCRIPT), "start"], env=dict(registry["env"], UMA_LAB_REGISTRY_PORT="80x"),
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert port.returncode == 1 and "UMA_LAB_REGISTRY_PORT='80x' is not a port number" in port.stderr, port.stderr
    usage = _script(registry, "pull")
    assert usage.returncode == 1 and "usage: registry.sh" in usage.stderr, usage.stderr
