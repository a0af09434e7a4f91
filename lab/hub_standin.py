# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A STAND-IN FOR THE HUGGING FACE HUB: serves local model directories over HTTP (stdlib only).

No model hub is reachable from the lab, so the lab and the tests point the real
``huggingface_hub`` client (``endpoint=``) at this server. It answers the calls that
``HfApi.model_info(files_metadata=True)`` and ``snapshot_download`` make (checked
against huggingface_hub 2.4.0):

- ``GET /api/models/OWNER/NAME[/revision/REV]``: the model info - ``id``, ``sha`` (the
  commit), ``gated``, ``siblings`` with ``rfilename``, ``size``, ``blobId`` and, for LFS
  files (``*.safetensors``, ``*.bin`` and files over 10 MiB), ``lfs`` {sha256, size,
  pointerSize};
- ``GET /api/models/OWNER/NAME/tree/REV?recursive=...``: the file listing (``type``,
  ``oid``, ``size``, ``path``, ``lfs`` {oid, size, pointerSize});
- ``HEAD``/``GET /OWNER/NAME/resolve/REV/PATH``: the file, with ``X-Repo-Commit``,
  ``ETag`` (the LFS sha256, or the git blob id), ``Content-Length``, ``Accept-Ranges``
  and ``Range`` requests (206) so an interrupted download resumes.

REV is ``main`` or the commit (a sha1 over the served files' names and sha256s, so
changing a file makes a new commit, as a push would). Unknown repositories answer 404
``X-Error-Code: RepoNotFound``, unknown revisions 404 ``RevisionNotFound``. A gated
repository (``--gated``) lists its info without a token, as the Hub does, but answers
the tree and every file with 401 ``X-Error-Code: GatedRepo`` unless the request carries
``Authorization: Bearer TOKEN``. Each request is recorded (method, path, whether it was
authorised - never the token itself).

  python3 lab/hub_standin.py --repo lab/tiny-llama=/tmp/tiny-llama --port 8765 \\
      [--gated lab/tiny-llama --token-file /root/hf_token]

With ``cdn=True`` (``--cdn``) it redirects as the Hub does: ``GET .../resolve/...`` of an
LFS file answers ``302`` (with ``X-Repo-Commit``, ``X-Linked-Size``, ``X-Linked-Etag``) to a
signed URL on another origin (``http://CDN_HOST:PORT/cdn/...?sig=...``: the same server
under another host name, ``localhost`` unless ``cdn_host`` names one the clients resolve to
it), which refuses a request that carries an ``Authorization`` header (400, as S3's signed
URLs do: a client must not forward the Hub token to a CDN) or a wrong signature (403).

What it does NOT do: xet storage, pagination, private repos, datasets/spaces, uploads.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, List, Optional, Tuple
from urllib.parse import quote, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
LFS_MIN = 10 * 1024 * 1024
_REPO = r"(?P<repo>[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*)"
INFO_RE = re.compile(r"^/api/models/%s(?:/revision/(?P<rev>[^/]+))?/?$" % _REPO)
TREE_RE = re.compile(r"^/api/models/%s/tree/(?P<rev>[^/]+)(?:/(?P<sub>.*))?$" % _REPO)
RESOLVE_RE = re.compile(r"^/%s/resolve/(?P<rev>[^/]+)/(?P<path>.+)$" % _REPO)
CDN_RE = re.compile(r"^/cdn/%s/(?P<rev>[0-9a-f]{40})/(?P<path>.+)$" % _REPO)


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _git_blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Repo:
    """One served model directory: its files, their hashes and the commit they make."""

    def __init__(self, repo_id: str, root: str, gated: bool = False) -> None:
        self.repo_id = repo_id
        self.root = os.path.abspath(root)
        self.gated = gated
        self.files: Dict[str, Dict[str, object]] = {}
        self.commit = ""
        self.rescan()

    def rescan(self) -> None:
        """Re-read the directory (a test that changes a file calls this: a new commit)."""
        files = {}
        for base, dirs, names in os.walk(self.root):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in sorted(names):
                full = os.path.join(base, name)
                rel = os.path.relpath(full, self.root).replace(os.sep, "/")
                if name.startswith(".") or not os.path.isfile(full):
                    continue
                size = os.path.getsize(full)
                sha = _sha256(full)
                lfs = rel.endswith(LFS_SUFFIXES) or size >= LFS_MIN
                if lfs:
                    pointer = (
                        "version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n" % (sha, size)
                    ).encode()
                    oid, etag = _git_blob(pointer), sha
                else:
                    with open(full, "rb") as handle:
                        oid = _git_blob(handle.read())
                    etag, pointer = oid, b""
                files[rel] = {
                    "size": size,
                    "sha256": sha,
                    "oid": oid,
                    "etag": etag,
                    "lfs": lfs,
                    "pointer": len(pointer),
                }
        self.files = files
        listing = "".join("%s %s\n" % (name, files[name]["sha256"]) for name in sorted(files))
        self.commit = hashlib.sha1(listing.encode()).hexdigest()

    def revision_ok(self, rev: str) -> bool:
        return rev in ("main", self.commit)

    def sibling(self, name: str) -> Dict[str, object]:
        meta = self.files[name]
        out: Dict[str, object] = {"rfilename": name, "size": meta["size"], "blobId": meta["oid"]}
        if meta["lfs"]:
            out["lfs"] = {"sha256": meta["sha256"], "size": meta["size"], "pointerSize": meta["pointer"]}
        return out

    def tree_entry(self, name: str) -> Dict[str, object]:
        meta = self.files[name]
        out: Dict[str, object] = {"type": "file", "oid": meta["oid"], "size": meta["size"], "path": name}
        if meta["lfs"]:
            out["lfs"] = {"oid": meta["sha256"], "size": meta["size"], "pointerSize": meta["pointer"]}
        return out


class HubStandIn(ThreadingHTTPServer):
    """The stand-in server: ``repos`` by id, the bearer ``token`` of gated repos, the request log."""

    daemon_threads = True

    def __init__(
        self,
        address: Tuple[str, int],
        repos: Dict[str, Repo],
        token: Optional[str] = None,
        cdn: bool = False,
        cdn_host: str = "localhost",
    ) -> None:
        super().__init__(address, Handler)
        self.repos = repos
        self.token = token
        self.cdn = cdn
        self.cdn_host = cdn_host
        self.cdn_key = os.urandom(16)
        # a test sets cut_after: the first whole-file GET of each file ends after that many bytes (a lost
        # connection); the names cut so far are in ``cut``
        self.cut_after: Optional[int] = None
        self.cut: List[str] = []
        self.log: List[Dict[str, object]] = []
        self.lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        host, port = self.server_address[:2]
        return "http://%s:%d" % (host, port)

    def signature(self, path: str) -> str:
        return hmac.new(self.cdn_key, path.encode(), hashlib.sha256).hexdigest()


class Handler(BaseHTTPRequestHandler):
    server: HubStandIn
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        return

    def _send(self, code: int, body: bytes = b"", headers: Optional[Dict[str, str]] = None, head: bool = False) -> None:
        self.send_response(code)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if "Content-Length" not in (headers or {}):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and not head:
            self.wfile.write(body)

    def _json(self, code: int, data: object, head: bool = False) -> None:
        self._send(code, json.dumps(data).encode(), {"Content-Type": "application/json"}, head)

    def _error(self, code: int, error_code: str, message: str, head: bool = False) -> None:
        headers = {"Content-Type": "application/json", "X-Error-Code": error_code, "X-Error-Message": message}
        self._send(code, json.dumps({"error": message}).encode(), headers, head)

    def _authorised(self) -> bool:
        token = self.server.token
        given = self.headers.get("Authorization", "")
        return bool(token) and given == "Bearer %s" % token

    def _route(self, head: bool) -> None:
        parts = urlsplit(self.path)
        path = unquote(parts.path)
        with self.server.lock:
            self.server.log.append({"method": self.command, "path": path, "authorised": self._authorised(),
                                    "range": self.headers.get("Range"), "client": self.client_address[0]})  # fmt: skip
        cdn = CDN_RE.match(path)
        if cdn:
            return self._cdn(cdn, parts.query, head)
        kind, match = "", None
        for regex, name in ((INFO_RE, "info"), (TREE_RE, "tree"), (RESOLVE_RE, "resolve")):
            match = regex.match(path)
            if match:
                kind = name
                break
        if match is None:
            return self._error(404, "EntryNotFound", "no such route: %s" % path, head)
        repo = self.server.repos.get(match.group("repo"))
        if repo is None:
            return self._error(404, "RepoNotFound", "Repository not found", head)
        rev = match.group("rev") or "main"
        if not repo.revision_ok(rev):
            return self._error(404, "RevisionNotFound", "Invalid rev id: %s" % rev, head)
        if kind == "info":
            siblings = [repo.sibling(name) for name in sorted(repo.files)]
            data = {"id": repo.repo_id, "modelId": repo.repo_id, "sha": repo.commit, "private": False}
            data.update(gated="manual" if repo.gated else False, siblings=siblings)
            return self._json(200, data, head)
        if repo.gated and not self._authorised():
            return self._error(401, "GatedRepo", "Access to model %s is restricted." % repo.repo_id, head)
        if kind == "tree":
            return self._json(200, [repo.tree_entry(name) for name in sorted(repo.files)], head)
        meta = repo.files.get(match.group("path"))
        if self.server.cdn and meta is not None and meta["lfs"]:
            return self._redirect(repo, match.group("path"), meta, head)
        return self._file(repo, match.group("path"), head)

    def _redirect(self, repo: Repo, name: str, meta: Dict[str, object], head: bool) -> None:
        """302 to a signed URL on another origin (the cdn_host name instead of the endpoint's address), as the
        Hub does."""
        path = "/cdn/%s/%s/%s" % (repo.repo_id, repo.commit, name)
        port = self.server.server_address[1]
        location = "http://%s:%d%s?sig=%s" % (self.server.cdn_host, port, quote(path), self.server.signature(path))
        headers = {
            "Location": location,
            "X-Repo-Commit": repo.commit,
            "X-Linked-Size": str(meta["size"]),
            "X-Linked-Etag": '"%s"' % meta["etag"],
            "ETag": '"%s"' % meta["oid"],
        }
        self._send(302, b"", headers, head)

    def _cdn(self, match: re.Match[str], query: str, head: bool) -> None:
        if self.headers.get("Authorization"):
            return self._send(400, b"<Error><Code>InvalidArgument</Code><Message>Only one auth mechanism allowed"
                              b"</Message></Error>", {"Content-Type": "application/xml"}, head)  # fmt: skip
        path = "/cdn/%s/%s/%s" % (match.group("repo"), match.group("rev"), match.group("path"))
        given = dict(item.split("=", 1) for item in query.split("&") if "=" in item).get("sig", "")
        repo = self.server.repos.get(match.group("repo"))
        if (
            repo is None
            or not hmac.compare_digest(given, self.server.signature(path))
            or repo.commit != match.group("rev")
        ):
            return self._send(
                403, b"<Error><Code>AccessDenied</Code></Error>", {"Content-Type": "application/xml"}, head
            )
        return self._file(repo, match.group("path"), head)

    def _file(self, repo: Repo, name: str, head: bool) -> None:
        meta = repo.files.get(name)
        if meta is None:
            return self._error(404, "EntryNotFound", "Entry not found", head)
        size = int(meta["size"])  # type: ignore[call-overload]
        headers = {
            "X-Repo-Commit": repo.commit,
            "ETag": '"%s"' % meta["etag"],
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        start, end, code = 0, size - 1, 200
        ranged = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", "") or "")
        if ranged and not head:
            start = int(ranged.group(1))
            end = int(ranged.group(2)) if ranged.group(2) else size - 1
            if start >= size:
                return self._send(416, b"", {"Content-Range": "bytes */%d" % size})
            end, code = min(end, size - 1), 206
            headers["Content-Range"] = "bytes %d-%d/%d" % (start, end, size)
        headers["Content-Length"] = str(max(0, end - start + 1))
        self._send(code, b"", headers, head=True)
        if head:
            return None
        left = end - start + 1
        key = "%s/%s" % (repo.repo_id, name)
        cut = self.server.cut_after
        if cut is not None and code == 200 and cut < left:
            with self.server.lock:
                first = key not in self.server.cut
                self.server.cut.append(key)
            if first:
                left, self.close_connection = cut, True
        with open(os.path.join(repo.root, name), "rb") as handle:
            handle.seek(start)
            while left > 0:
                block = handle.read(min(left, 1 << 20))
                if not block:
                    break
                self.wfile.write(block)
                left -= len(block)
        return None

    def do_GET(self) -> None:
        self._route(head=False)

    def do_HEAD(self) -> None:
        self._route(head=True)


def serve(
    repos: Dict[str, str],
    gated: Tuple[str, ...] = (),
    token: Optional[str] = None,
    port: int = 0,
    cdn: bool = False,
    host: str = "127.0.0.1",
    cdn_host: str = "localhost",
) -> HubStandIn:
    """Start the stand-in on host (127.0.0.1) in a background thread; ``.endpoint`` is its URL. With cdn, LFS
    files redirect to http://CDN_HOST:PORT/cdn/... (a name the clients resolve to this server)."""
    served = {repo_id: Repo(repo_id, root, repo_id in gated) for repo_id, root in repos.items()}
    server = HubStandIn((host, port), served, token, cdn, cdn_host)
    threading.Thread(target=server.serve_forever, name="hub-standin", daemon=True).start()
    return server


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="A stand-in for the Hugging Face Hub (lab and tests only).")
    parser.add_argument("--repo", action="append", required=True, help="OWNER/NAME=DIR (repeatable)")
    parser.add_argument("--gated", action="append", default=[], help="OWNER/NAME that needs the bearer token")
    parser.add_argument("--token-file", help="file holding the bearer token of gated repos")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--cdn", action="store_true", help="redirect LFS files to a signed URL on another origin")
    args = parser.parse_args(argv)
    repos = dict(item.split("=", 1) for item in args.repo)
    token = None
    if args.token_file:
        with open(args.token_file, encoding="utf-8") as handle:
            token = handle.read().strip()
    server = serve(repos, tuple(args.gated), token, args.port, args.cdn)
    sys.stdout.write("hub stand-in on %s serving %s\n" % (server.endpoint, ", ".join(sorted(repos))))
    sys.stdout.flush()
    threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
