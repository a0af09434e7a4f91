"""Push an image of this machine's Docker into the lab registry (lab/registry.sh push runs this).

``docker push`` gzips every layer on one core: the lab's 3.9 GB engine image took 288 s here (2 vCPU,
2 Dec 2026), most of the set-up's spare time. This sends the same image through the registry's own
HTTP API (the distribution spec: a blob upload per layer, then the manifest) as Docker's image
manifest whose layers are uncompressed tars (``application/vnd.docker.image.rootfs.diff.tar``, which
the registry and Docker's pull accept): ``docker save``'s stream, read once, each layer uploaded while
it is hashed. A node's ``docker pull`` then runs Docker's real pull: the manifest, each blob fetched
and checked against its digest and the image config's diff_ids, the layers unpacked. What differs from
nvcr.io: its layers are gzip-compressed (the node's pull gunzips them), here they are not.

    python3 lab/registry_push.py IMAGE 127.0.0.1:PORT CA_FILE
    python3 lab/registry_push.py --retag REPOSITORY FROM_TAG TO_TAG KEY=VALUE 127.0.0.1:PORT CA_FILE

``--retag`` publishes under TO_TAG the image FROM_TAG names in the registry with one label more (or
changed) in its config: another config, so another image Id, on the same layers (nothing of the layers
sent again). Run again with another VALUE, TO_TAG moves, as a nightly or ``latest`` moves when its
publisher pushes a new build: what a pull policy ``always`` is for (issue 34 item 5).
"""

from __future__ import annotations

import hashlib
import http.client
import io
import json
import posixpath
import ssl
import subprocess
import sys
import tarfile
import urllib.parse

# Docker's image manifest (schema 2), what nvcr.io serves, with the uncompressed layer type of the
# distribution project's schema2 package (Docker's CLI reads it with `docker manifest inspect`; an OCI
# manifest it answers "no such manifest" in Docker 20.10)
MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG = "application/vnd.docker.container.image.v1+json"
LAYER = "application/vnd.docker.image.rootfs.diff.tar"
CHUNK = 1 << 20


class Hashing:
    """A file object read once by http.client, hashed (and counted) on the way."""

    def __init__(self, handle):
        self.handle, self.sha, self.size = handle, hashlib.sha256(), 0

    def read(self, amount=CHUNK):
        data = self.handle.read(amount)
        self.sha.update(data)
        self.size += len(data)
        return data


class Registry:
    def __init__(self, address, cafile):
        host, _sep, port = address.rpartition(":")
        self.host, self.port = host, int(port)
        self.context = ssl.create_default_context(cafile=cafile)

    def request(self, method, path, body=None, headers=None, want=(200,)):
        conn = http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=600, blocksize=CHUNK)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            text = response.body = response.read()
            if response.status not in want:
                said = text[:500].decode("utf-8", "replace")
                raise SystemExit("registry_push: %s %s answered %d: %s" % (method, path, response.status, said))
            return response
        finally:
            conn.close()

    def _path(self, location):
        parts = urllib.parse.urlsplit(location)
        return parts.path + ("?" + parts.query if parts.query else "")

    def upload(self, repository, handle, size):
        """One blob, streamed: POST (an upload session), PATCH (the bytes, hashed on the way), PUT with
        the digest. Returns (digest, size)."""
        started = self.request("POST", "/v2/%s/blobs/uploads/" % repository, want=(202,))
        body = Hashing(handle)
        patched = self.request(
            "PATCH", self._path(started.getheader("Location")), body=body,
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)}, want=(202,),
        )  # fmt: skip
        if body.size != size:
            raise SystemExit("registry_push: read %d bytes of a %d-byte blob from docker save" % (body.size, size))
        digest = "sha256:" + body.sha.hexdigest()
        location = self._path(patched.getheader("Location"))
        location += ("&" if "?" in location else "?") + "digest=" + urllib.parse.quote(digest)
        self.request("PUT", location, headers={"Content-Length": "0"}, want=(201,))
        return digest, size


def push(image, address, cafile):
    repository, _sep, tag = image.rpartition(":")
    registry = Registry(address, cafile)
    save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
    blobs, links, manifest = {}, {}, None
    with tarfile.open(fileobj=save.stdout, mode="r|") as stream:
        for member in stream:
            name = member.name
            if member.issym() or member.islnk():
                # docker save links a layer it already wrote under another name
                target = member.linkname
                if member.issym():
                    target = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
                links[name] = target
            elif name == "manifest.json":
                manifest = json.load(stream.extractfile(member))
            elif member.isfile() and (name.endswith("/layer.tar") or ("/" not in name and name.endswith(".json"))):
                blobs[name] = registry.upload(repository, stream.extractfile(member), member.size)
    if save.wait() != 0:
        raise SystemExit("registry_push: docker save %s failed (rc %d)" % (image, save.returncode))
    if not manifest or len(manifest) != 1:
        raise SystemExit("registry_push: docker save %s wrote no single-image manifest.json" % image)
    entry = manifest[0]

    def blob(name):
        return blobs[links.get(name, name)]

    config_digest, config_size = blob(entry["Config"])
    document = {
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": {"mediaType": CONFIG, "digest": config_digest, "size": config_size},
        "layers": [{"mediaType": LAYER, "digest": d, "size": s} for d, s in map(blob, entry["Layers"])],
    }
    registry.request(
        "PUT", "/v2/%s/manifests/%s" % (repository, tag), body=json.dumps(document).encode(),
        headers={"Content-Type": MANIFEST}, want=(201,),
    )  # fmt: skip
    total = sum(layer["size"] for layer in document["layers"])
    print("%s: config %s, %d layers, %.2f GB" % (image, config_digest, len(document["layers"]), total / 1e9))


def retag(repository, from_tag, to_tag, label, address, cafile):
    key, sep, value = label.partition("=")
    if not sep or not key:
        raise SystemExit("registry_push: --retag's label %r is not KEY=VALUE" % label)
    registry = Registry(address, cafile)
    document = json.loads(registry.request(
        "GET", "/v2/%s/manifests/%s" % (repository, from_tag), headers={"Accept": MANIFEST}).body)  # fmt: skip
    if document.get("mediaType") != MANIFEST:
        raise SystemExit("registry_push: %s:%s is not a Docker schema-2 manifest" % (repository, from_tag))
    config = json.loads(registry.request("GET", "/v2/%s/blobs/%s" % (repository, document["config"]["digest"])).body)
    labels = dict((config.get("config") or {}).get("Labels") or {})
    labels[key] = value
    config.setdefault("config", {})["Labels"] = labels
    body = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    digest, size = registry.upload(repository, io.BytesIO(body), len(body))
    document["config"] = dict(document["config"], digest=digest, size=size)
    registry.request(
        "PUT", "/v2/%s/manifests/%s" % (repository, to_tag), body=json.dumps(document).encode(),
        headers={"Content-Type": MANIFEST}, want=(201,),
    )  # fmt: skip
    print("%s:%s: config %s (%s:%s with %s)" % (repository, to_tag, digest, repository, from_tag, label))


if __name__ == "__main__":
    if len(sys.argv) == 8 and sys.argv[1] == "--retag":
        retag(*sys.argv[2:])
    elif len(sys.argv) == 4:
        push(*sys.argv[1:])
    else:
        raise SystemExit(
            "usage: registry_push.py IMAGE 127.0.0.1:PORT CA_FILE\n"
            "       registry_push.py --retag REPOSITORY FROM_TAG TO_TAG KEY=VALUE 127.0.0.1:PORT CA_FILE"
        )
