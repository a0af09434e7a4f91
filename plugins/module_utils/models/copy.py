# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Logic of ``uma.vllm.model_copy``: a model that rank 0 downloaded and verified, copied to the
other ranks of a multi-node engine over the cluster link (issue 21 item 3; private, stdlib only).

Two sides:

- **serve** (rank 0): the verified snapshot directory (``model_fetch``'s manifest names every file
  with its size and sha256) is served READ-ONLY over HTTP, bound to rank 0's cluster address only,
  for a bounded time: the server stops when every expected peer said it is done, after ``idle_s``
  without a request or a byte sent, or at ``timeout_s``, whichever comes first. Only the files the
  manifest names are served (a name is looked up in the manifest, never joined from the request;
  the opened file must be a regular file inside the directory, not through a symlink). Every
  request carries the engine's link key's HMAC over method, path, range, a fresh nonce and the
  time (``_link_auth.request_headers`` / ``RequestCheck``); a wrong or missing MAC, an old time or a
  replayed nonce is answered 401 and said once per peer and minute.
- **receive** (the other ranks): the expected files come from rank 0's model_fetch result through
  Ansible (names, sizes, sha256, commit), never from the network. A node whose manifest already
  has that commit and those files with those sizes and hashes copies nothing (no connection).
  Otherwise each missing file is fetched into ``<dest>/.uma-copy/<name>.part`` (resumed with an
  HTTP Range from its size), its size and sha256 compared with the expected ones, and renamed into
  place; then the manifest (the same format as model_fetch's) is written atomically.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import stat
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, List, Optional, Tuple
from urllib.parse import quote, unquote, urlsplit

from ansible_collections.uma.vllm.plugins.module_utils.models import fetch as mf
from ansible_collections.uma.vllm.plugins.module_utils.node.base.checks import number, secret_key
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError, atomic_write_json
from ansible_collections.uma.vllm.plugins.module_utils.node.cluster import link_auth as _link_auth

PART_DIR = ".uma-copy"
BLOCK = 4 << 20
SHA256_RE = re.compile(r"[0-9a-f]{64}")
# Rank 0's copy server is started as an async task just before the other ranks connect: a refused
# connection in this first stretch is the server still binding (seen under load in the fresh-clone
# run: the first request came before the listen), so it is tried again until then.
SERVER_START_S = 30.0
SOURCE_RE = re.compile(r"http://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):([0-9]{1,5})", re.ASCII)
DEFAULT_IDLE_S = 120.0
DEFAULT_TIMEOUT_S = 3600.0


def _bad(option: str, value: Any, problem: str, fix: str) -> UmaError:
    return UmaError(option, value, problem, fix)


def file_name(value: Any) -> str:
    """A file name of a snapshot: relative, no '..', '.' or empty parts, no control characters."""
    fix = "Give the file names of rank 0's manifest (relative paths inside the model directory)."
    if not isinstance(value, str) or not value or value.startswith("/") or len(value) > 512:
        raise _bad("files", value, "is not a relative file name", fix)
    parts = value.split("/")
    if any(p in ("", ".", "..") for p in parts) or any(ord(c) < 32 or c == "\\" for c in value):
        raise _bad("files", value, "is not a plain relative file name (no '..', '.', '\\' or control characters)", fix)
    if parts[0] in (PART_DIR, ".cache") or value == mf.MANIFEST:
        raise _bad("files", value, "is one of the directory's own bookkeeping files", fix)
    return value


def expected_files(value: Any) -> Dict[str, Dict[str, Any]]:
    """``files`` (a list of {name, size, sha256}, rank 0's model_fetch result) as name -> {size, sha256}."""
    fix = "Give rank 0's model_fetch result's files: [{name, size, sha256}, ...], every sha256 known."
    if not isinstance(value, list) or not value:
        raise _bad("files", value, "is not a non-empty list of files", fix)
    out: Dict[str, Dict[str, Any]] = {}
    for item in value:
        if not isinstance(item, dict):
            raise _bad("files", item, "is not a mapping with name, size and sha256", fix)
        name = file_name(item.get("name"))
        size, digest = item.get("size"), item.get("sha256")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise _bad("files", item, "has a size that is not a number of bytes", fix)
        if not isinstance(digest, str) or not SHA256_RE.fullmatch(digest):
            raise _bad("files", item, "has no sha256 (64 lowercase hex digits): rank 0 has not verified it", fix)
        if name in out:
            raise _bad("files", name, "is listed twice", fix)
        out[name] = {"size": size, "sha256": digest}
    return out


def source_url(value: Any) -> str:
    fix = "Give rank 0's copy server as http://ADDRESS:PORT (its cluster address, uma_cluster_addr)."
    if not isinstance(value, str) or not SOURCE_RE.fullmatch(value) or not 1 <= int(value.rsplit(":", 1)[1]) <= 65535:
        raise _bad("source", value, "is not http://ADDRESS:PORT", fix)
    return value


# --------------------------------------------------------------------------
# receive: plan (local only), execute (over the link), result


@dataclass
class Receive:
    dest: str
    repo_id: str
    revision: str
    commit: str
    files: Dict[str, Dict[str, Any]]
    source: str
    key_file: str
    verify: bool
    label: str
    timeout_s: float = 60.0


@dataclass
class ReceivePlan:
    request: Receive
    before: Optional[Dict[str, Any]]
    stale: List[str]
    need_bytes: int
    free_bytes: int
    verified: List[str]
    changed: bool
    copied: List[str] = field(default_factory=list)
    resumed: Dict[str, int] = field(default_factory=dict)


def validate_receive(params: Dict[str, Any]) -> Receive:
    verify = params.get("verify")
    if not isinstance(verify, bool):
        raise _bad("verify", verify, "is not a boolean", "Give true or false.")
    commit = params.get("commit")
    if not isinstance(commit, str) or not re.fullmatch(r"[0-9A-Za-z]{7,64}", commit):
        raise _bad("commit", commit, "is not a commit sha", "Give the commit rank 0's model_fetch returned.")
    timeout = params.get("timeout_s")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 1 <= timeout <= 3600:
        raise _bad("timeout_s", timeout, "is not 1-3600 seconds", "Give how long one request may wait, e.g. 60.")
    key_file = params.get("key_file")
    if not isinstance(key_file, str) or not key_file.startswith("/"):
        raise _bad("key_file", key_file, "is not an absolute path", "Give the engine's 0600 link key file.")
    return Receive(
        dest=mf._dest(params.get("dest")),
        repo_id=mf._repo_id(params.get("repo_id")),
        revision=mf._revision(params.get("revision") or "main"),
        commit=commit,
        files=expected_files(params.get("files")),
        source=source_url(params.get("source")),
        key_file=key_file,
        verify=verify,
        label=str(params.get("label") or "rank 0"),
        timeout_s=float(timeout),
    )


def _current(request: Receive, manifest: Optional[Dict[str, Any]]) -> bool:
    if not manifest or manifest.get("repo_id") != request.repo_id or manifest.get("commit") != request.commit:
        return False
    recorded = manifest.get("files") or {}
    return sorted(recorded) == sorted(request.files) and all(
        isinstance(recorded[n], dict) and recorded[n].get("sha256") == want["sha256"]
        for n, want in request.files.items()
    )


def plan_receive(request: Receive, free: Optional[Callable[[str], int]] = None) -> ReceivePlan:
    """What this node lacks compared with rank 0's verified files; touches nothing, opens no connection."""
    manifest = mf.read_manifest(request.dest) if os.path.isdir(request.dest) else None
    recorded = (manifest or {}).get("files") if isinstance((manifest or {}).get("files"), dict) else {}
    same_commit = bool(manifest) and manifest.get("commit") == request.commit
    stale = []
    for name, want in sorted(request.files.items(), key=lambda item: _copy_order(item[0])):
        have = recorded.get(name) if same_commit and isinstance(recorded.get(name), dict) else {}
        if mf._local_size(request.dest, name) != want["size"] or have.get("sha256") != want["sha256"]:
            stale.append(name)
    current = _current(request, manifest) and not stale
    need = sum(request.files[n]["size"] - _part_size(request.dest, n, request.files[n]["size"]) for n in stale)
    available = (free or mf.free_bytes)(request.dest)
    if need > available:
        raise _bad(
            "dest",
            request.dest,
            "the copy of %s at %s from %s needs %d bytes for %d files, the filesystem has %d free"
            % (request.repo_id, request.commit, request.label, need, len(stale), available),
            "Free space there or set vllm_service_models_dir to a larger filesystem; nothing was copied.",
        )
    verified = _verify_local(request) if current and request.verify else []
    return ReceivePlan(request, manifest, stale, need, available, verified, changed=not current)


def _copy_order(name: str) -> Tuple[int, str]:
    """config.json is copied last: a node that has it has the whole model (the role's presence check
    looks for config.json, so an interrupted copy is found again and resumed on the next run)."""
    return (1 if name == "config.json" else 0, name)


def _verify_local(request: Receive) -> List[str]:
    checked = []
    for name, want in sorted(request.files.items()):
        if not name.endswith(".safetensors"):
            continue
        path = os.path.join(request.dest, name)
        actual = mf.sha256_of(path)
        if actual != want["sha256"]:
            raise _bad(
                "verify",
                True,
                "%s has sha256 %s, %s's verified copy has %s: the file is damaged"
                % (path, actual, request.label, want["sha256"]),
                "Delete %s and run again to copy it again from rank 0." % path,
            )
        checked.append(name)
    return checked


def _part_path(dest: str, name: str) -> str:
    return os.path.join(dest, PART_DIR, quote(name, safe="") + ".part")


def _part_size(dest: str, name: str, size: int) -> int:
    """Bytes of a partial copy that a resume keeps (0 when absent, not a file or too long)."""
    try:
        info = os.lstat(_part_path(dest, name))
    except OSError:
        return 0
    return info.st_size if stat.S_ISREG(info.st_mode) and info.st_size <= size else 0


class Link:
    """Signed requests to rank 0's copy server."""

    def __init__(self, request: Receive) -> None:
        self.request = request
        self.key = secret_key("key_file", request.key_file, owners=(0, os.geteuid()))
        self.start_deadline = time.monotonic() + SERVER_START_S

    def _unreachable(self, err: BaseException) -> UmaError:
        return _bad(
            "source",
            self.request.source,
            "%s's copy server cannot be reached (%s)" % (self.request.label, err),
            "Check that rank 0's play reached its serve task (its model_fetch succeeded), that this node reaches "
            "rank 0's cluster address (uma_cluster_addr) and port, and run again (a partial copy resumes); or set "
            "vllm_service_model_source: hub to download on every node.",
        )

    def _open(self, method: str, path: str, start: int = 0) -> Tuple[http.client.HTTPConnection, Any]:
        span = "bytes=%d-" % start if start else ""
        match = SOURCE_RE.fullmatch(self.request.source)
        host, port = match.group(1).strip("[]"), int(match.group(2))
        while True:
            # signed anew for each try: a fresh nonce and time (the server refuses a replayed one)
            headers = _link_auth.request_headers(self.key, "%s|%s" % (path, span), method)[0]
            if span:
                headers["Range"] = span
            conn = http.client.HTTPConnection(host, port, timeout=self.request.timeout_s)
            try:
                conn.request(method, path, headers=headers)
                response = conn.getresponse()
                break
            except ConnectionRefusedError as err:
                conn.close()
                if time.monotonic() >= self.start_deadline:
                    raise self._unreachable(err) from None
                time.sleep(0.5)
            except (OSError, http.client.HTTPException) as err:
                conn.close()
                raise self._unreachable(err) from None
        if response.status not in (200, 206):
            conn.close()
            raise self._refused(response.status, path)
        return conn, response

    def _refused(self, code: int, path: str) -> UmaError:
        if code == 401:
            return _bad(
                "key_file",
                self.request.key_file,
                "%s refused the request for %s (401): this node's link key differs from rank 0's" % (
                    self.request.label, path),
                "Run the role for every node of the engine in one play (the key is made once on the controller, "
                "vllm_service_link_key_dir), then run again.",
            )  # fmt: skip
        return _bad(
            "source",
            self.request.source,
            "%s answered %d for %s" % (self.request.label, code, path),
            "Run again; rank 0 serves only the files of its verified snapshot of this commit.",
        )

    def fetch(self, name: str, part: str, start: int) -> None:
        conn, response = self._open("GET", "/f/" + quote(name, safe="/"), start)
        try:
            if start and response.status != 206:
                start = 0  # the server sent the whole file: start over
            with open(part, "r+b" if start else "wb") as handle:
                handle.seek(start)
                handle.truncate()
                while True:
                    try:
                        block = response.read(BLOCK)
                    except (OSError, http.client.HTTPException) as err:
                        raise self._unreachable(err) from None
                    if not block:
                        break
                    handle.write(block)
                handle.flush()
                os.fsync(handle.fileno())
        finally:
            conn.close()

    def done(self, ok: bool) -> None:
        try:
            self._open("POST", "/done/%s" % ("ok" if ok else "failed"))[0].close()
        except UmaError:
            pass  # the server stops on its own at its idle time


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def _copy_one(p: ReceivePlan, link: Link, name: str) -> None:
    request, want = p.request, p.request.files[name]
    part = _part_path(request.dest, name)
    start = _part_size(request.dest, name, want["size"])
    if not (start and start == want["size"] and _sha256(part) == want["sha256"]):  # else complete from a last run
        start = 0 if start == want["size"] else start
        if start:
            p.resumed[name] = start
        link.fetch(name, part, start)
    size, digest = os.path.getsize(part), _sha256(part)
    if size != want["size"] or digest != want["sha256"]:
        os.unlink(part)
        raise _bad(
            "source",
            request.source,
            "%s sent %s as %d bytes with sha256 %s, its manifest says %d bytes, sha256 %s (the copy is deleted)"
            % (request.label, name, size, digest, want["size"], want["sha256"]),
            "Run again; if it repeats, run model_fetch with verify: true on rank 0 (its copy may be damaged).",
        )
    target = os.path.join(request.dest, name)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.lexists(target) and not os.path.isfile(target):
        raise _bad("dest", request.dest, "holds %s, which is not a regular file" % target, "Remove it and run again.")
    os.replace(part, target)
    p.copied.append(name)


def execute_receive(p: ReceivePlan) -> Dict[str, Any]:
    """Copy what is stale from rank 0, verify each file, write the manifest; tell rank 0 when done."""
    request = p.request
    made = _missing_dirs(os.path.join(request.dest, PART_DIR))
    os.makedirs(os.path.join(request.dest, PART_DIR), mode=0o755, exist_ok=True)
    ok = False
    try:
        link = Link(request)
    except UmaError:
        _remove_empty(made)
        raise
    try:
        for name in p.stale:
            _copy_one(p, link, name)
        manifest = {
            "repo_id": request.repo_id,
            "revision": request.revision,
            "commit": request.commit,
            "endpoint": "copy from %s (%s)" % (request.label, request.source),
            "files": {n: dict(v) for n, v in sorted(request.files.items())},
        }
        atomic_write_json(os.path.join(request.dest, mf.MANIFEST), manifest)
        ok = True
    finally:
        link.done(ok)
        # a refusal leaves no directory it made; a partial file (a resume's start) keeps its directory
        _remove_empty([os.path.join(request.dest, PART_DIR)] if ok else made)
    return manifest


def _missing_dirs(path: str) -> List[str]:
    """The directories ``os.makedirs(path)`` would create, deepest first."""
    missing = []
    while path and not os.path.lexists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing


def _remove_empty(dirs: List[str]) -> None:
    for path in dirs:
        try:
            os.rmdir(path)  # only an empty directory goes
        except OSError:
            return


def result_receive(p: ReceivePlan, done: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    request = p.request
    return {
        "changed": p.changed,
        "repo_id": request.repo_id,
        "revision": request.revision,
        "commit": request.commit,
        "dest": request.dest,
        "source": request.source,
        "manifest": os.path.join(request.dest, mf.MANIFEST),
        "files": [dict(name=n, **v) for n, v in sorted(request.files.items())],
        "copy": {
            "files": list(p.stale),
            "bytes": p.need_bytes,
            "done": done is not None,
            "copied": list(p.copied),
            "resumed": dict(p.resumed),
        },
        "space": {"path": request.dest, "need_bytes": p.need_bytes, "free_bytes": p.free_bytes},
        "verified": list(p.verified),
    }


def diff_receive(p: ReceivePlan) -> Dict[str, str]:
    before = p.before or {}
    old = before.get("files") if isinstance(before.get("files"), dict) else {}

    def text(commit: Any, names: List[str]) -> str:
        return "commit: %s\n" % commit + "".join("%s\n" % n for n in sorted(names))

    header = os.path.join(p.request.dest, mf.MANIFEST)
    return {
        "before_header": header,
        "after_header": header,
        "before": text(before.get("commit"), list(old)) if p.before else "",
        "after": text(p.request.commit, list(p.request.files)),
    }


# --------------------------------------------------------------------------
# index: a local model_path on the node that has it (issue 34 item 3b)

MAX_INDEX_FILES = 100000


def index_digest(files: Dict[str, Dict[str, Any]]) -> str:
    """The content identity of an index: sha256 over every name, size and sha256 (the copy's "commit")."""
    digest = hashlib.sha256()
    for name, want in sorted(files.items()):
        digest.update(("%s\0%d\0%s\n" % (name, want["size"], want.get("sha256") or "")).encode("utf-8"))
    return digest.hexdigest()


def _skipped(name: str) -> bool:
    return name.split("/", 1)[0] in (PART_DIR, ".cache", ".git") or name == mf.MANIFEST


def index(root: str, hashed: bool, limit: int = MAX_INDEX_FILES) -> Dict[str, Any]:
    """Every file of the model directory ``root`` (regular files, and symlinks to regular files, as a
    Hugging Face cache snapshot has): name, size and, with ``hashed``, sha256; ``commit`` is the
    index's digest (None without hashes), ``bytes`` their sum. The directory's own bookkeeping
    (.uma-copy/, .cache/, .git/, the manifest) is left out. Read-only."""
    root = mf._dest(root)
    if not os.path.isfile(os.path.join(root, "config.json")):
        raise _bad("dest", root, "has no config.json", "Give the model directory (config.json beside the weights).")
    files: Dict[str, Dict[str, Any]] = {}
    for top, dirs, names in os.walk(root):
        dirs.sort()
        rel_top = os.path.relpath(top, root)
        for base in sorted(names):
            name = base if rel_top == "." else "%s/%s" % (rel_top, base)
            if _skipped(name):
                continue
            path = os.path.join(top, base)
            try:
                info = os.stat(path)
            except OSError as err:
                raise _bad("dest", root, "%s cannot be read (%s)" % (name, err.strerror or err),
                           "Fix or remove it (a dangling symlink?) and run again.") from None  # fmt: skip
            if not stat.S_ISREG(info.st_mode):
                raise _bad("dest", root, "%s is not a regular file" % name, "Remove it from the model directory.")
            file_name(name)
            files[name] = {"size": info.st_size, "sha256": mf.sha256_of(path) if hashed else None}
            if len(files) > limit:
                raise _bad("dest", root, "holds more than %d files" % limit,
                           "Give the model directory itself (config.json beside the weights).")  # fmt: skip
        dirs[:] = [d for d in dirs if not _skipped(d if rel_top == "." else "%s/%s" % (rel_top, d))]
        for base in dirs:
            if os.path.islink(os.path.join(top, base)):  # os.walk would pass over it without a word
                raise _bad("dest", root, "%s is a symlink to a directory, which the copy does not follow"
                           % (base if rel_top == "." else "%s/%s" % (rel_top, base)),
                           "Put the directory itself there (or the files), then run again.")  # fmt: skip
    return {
        "dest": root,
        "files": [dict(name=n, **v) for n, v in sorted(files.items())],
        "bytes": sum(v["size"] for v in files.values()),
        "commit": index_digest(files) if hashed else None,
    }


# --------------------------------------------------------------------------
# serve (rank 0)


class CopyServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: Tuple[str, int], root: str, files: Dict[str, Dict[str, Any]], key: bytes,
                 say: Callable[[str], None], follow: bool = False) -> None:  # fmt: skip
        self.root = os.path.realpath(root)
        self.files = files
        self.follow = follow
        self.check = _link_auth.RequestCheck(key)
        self.refusals = _link_auth.Refusals(say)
        self.lock = threading.Lock()
        self.last = time.monotonic()
        self.stats = {"requests": 0, "bytes": 0, "files": 0, "done_ok": 0, "done_failed": 0}
        super().__init__(address, CopyHandler)

    def touch(self, **counts: int) -> None:
        with self.lock:
            self.last = time.monotonic()
            for key, value in counts.items():
                self.stats[key] += value


class CopyHandler(BaseHTTPRequestHandler):
    server: CopyServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        return

    def _reply(self, code: int, text: str = "") -> None:
        body = text.encode("utf-8")
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.end_headers()
        self.wfile.write(body)

    def _allowed(self) -> bool:
        peer = "%s:%s" % self.client_address[:2]
        signed = "%s|%s" % (self.path, self.headers.get("Range") or "")
        problem = self.server.check.problem(self.command, signed, self.headers)[0]
        self.server.touch(requests=1)
        if problem:
            self.server.refusals.refuse(peer, problem)
            self._reply(401, "refused\n")
            return False
        return True

    def do_POST(self) -> None:
        if not self._allowed():
            return
        if self.path in ("/done/ok", "/done/failed"):
            self.server.touch(**{"done_" + self.path.rsplit("/", 1)[1]: 1})
            return self._reply(200, "ok\n")
        return self._reply(404, "no such route\n")

    def do_GET(self) -> None:
        if not self._allowed():
            return
        path = urlsplit(self.path).path
        name = unquote(path[3:]) if path.startswith("/f/") else None
        want = self.server.files.get(name) if name else None
        if want is None:
            return self._reply(404, "not a file of this snapshot\n")
        handle = self._open(name)
        if handle is None:
            return self._reply(404, "not a regular file inside the snapshot\n")
        with handle:
            size = os.fstat(handle.fileno()).st_size
            start = self._range_start(size)
            if start is None:
                return self._reply(416, "bad range\n")
            self.send_response(206 if start else 200)
            self.send_header("Content-Length", str(size - start))
            if start:
                self.send_header("Content-Range", "bytes %d-%d/%d" % (start, size - 1, size))
            self.end_headers()
            handle.seek(start)
            for block in iter(lambda: handle.read(BLOCK), b""):
                self.wfile.write(block)
                self.server.touch(bytes=len(block))
        self.server.touch(files=1)
        return None

    def _open(self, name: str) -> Any:
        path = os.path.join(self.server.root, name)
        follow = self.server.follow
        if not follow and os.path.commonpath([self.server.root, os.path.realpath(path)]) != self.server.root:
            return None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW))
        except OSError:
            return None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        return os.fdopen(fd, "rb")

    def _range_start(self, size: int) -> Optional[int]:
        span = self.headers.get("Range")
        if not span:
            return 0
        match = re.fullmatch(r"bytes=([0-9]{1,19})-", span)
        if not match or int(match.group(1)) >= size:
            return None
        return int(match.group(1))


@dataclass
class Serve:
    root: str
    repo_id: str
    commit: str
    bind: str
    port: int
    key_file: str
    peers: int
    idle_s: float
    timeout_s: float
    files: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    # an index of a local model_path: its files may be symlinks (a Hugging Face cache snapshot's point
    # into ../../blobs); only the names the index holds are ever opened
    follow: bool = False


def validate_serve(params: Dict[str, Any]) -> Serve:
    """The serve side's options, and the snapshot's manifest: only a verified snapshot of the commit is served.
    With ``files`` (an index this node made of a local ``model_path``, mode index) those files are served,
    each checked against its size first and the commit being the index's digest."""
    root = mf._dest(params.get("dest"))
    commit = params.get("commit")
    if params.get("files"):
        files = _indexed_files(root, params.get("files"), commit)
        return _serve_options(params, root, commit, files, follow=True)
    manifest = mf.read_manifest(root) if os.path.isdir(root) else None
    if not manifest or manifest.get("commit") != commit or manifest.get("repo_id") != params.get("repo_id"):
        raise _bad(
            "dest",
            root,
            "holds no verified snapshot of %s at commit %s (its manifest says %s)"
            % (params.get("repo_id"), commit, (manifest or {}).get("commit")),
            "Run model_fetch on rank 0 first (the role does); only a verified snapshot is copied.",
        )
    files = expected_files([dict(name=n, **v) for n, v in (manifest.get("files") or {}).items()])
    for name, want in files.items():
        if mf._local_size(root, name) != want["size"]:
            raise _bad(
                "dest",
                root,
                "%s is not %d bytes as its manifest says" % (name, want["size"]),
                "Run model_fetch with verify: true on rank 0 (it downloads what is damaged), then again.",
            )
    return _serve_options(params, root, commit, files, follow=False)


def _indexed_files(root: str, value: Any, commit: Any) -> Dict[str, Dict[str, Any]]:
    files = expected_files(value)
    if commit != index_digest(files):
        raise _bad("commit", commit, "is not the digest of the files given (%s)" % index_digest(files),
                   "Give the commit and files of one index of this directory (mode: index).")  # fmt: skip
    for name, want in files.items():
        info, problem = None, ""
        try:
            info = os.stat(os.path.join(root, name))
        except OSError as err:
            problem = str(err.strerror or err)
        if info is None or not stat.S_ISREG(info.st_mode) or info.st_size != want["size"]:
            raise _bad(
                "dest", root,
                "%s is not a %d-byte file as when it was indexed (%s)" % (
                    name, want["size"], problem if info is None else "%d bytes" % info.st_size),
                "The model changed while it was copied: run again (it is indexed anew).",
            )  # fmt: skip
    return files


def _serve_options(params: Dict[str, Any], root: str, commit: Any, files: Dict[str, Dict[str, Any]],
                   follow: bool) -> Serve:  # fmt: skip
    numbers = {}
    for option, low, high in (("port", 1, 65535), ("peers", 1, 1024), ("idle_s", 1, 3600), ("timeout_s", 1, 86400)):
        numbers[option] = number(option, params.get(option), low, high, "Give a number from %s to %s." % (low, high),
                                 integer=option in ("port", "peers"), strings=True)  # fmt: skip
    bind = params.get("bind")
    if not isinstance(bind, str) or not bind or bind in ("0.0.0.0", "::") or any(c.isspace() for c in bind):
        raise _bad("bind", bind, "is not one address", "Give rank 0's cluster address (uma_cluster_addr).")
    key_file = params.get("key_file")
    secret_key("key_file", key_file, owners=(0, os.geteuid()))
    return Serve(root, str(params.get("repo_id")), str(commit), bind, int(numbers["port"]), str(key_file),
                 int(numbers["peers"]), float(numbers["idle_s"]), float(numbers["timeout_s"]), files,
                 follow)  # fmt: skip


def serve(s: Serve, say: Callable[[str], None], clock: Callable[[], float] = time.monotonic) -> Dict[str, Any]:
    """Serve until every peer said done, idle_s passed without activity, or timeout_s; always stop."""
    key = secret_key("key_file", s.key_file, owners=(0, os.geteuid()))
    try:
        server = CopyServer((s.bind, s.port), s.root, s.files, key, say, s.follow)
    except OSError as err:
        raise _bad("port", s.port, "cannot be bound on %s (%s)" % (s.bind, err.strerror or err),
                   "Free the port (master_port + 12 of the engine) or check uma_cluster_addr.") from None  # fmt: skip
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    thread.start()
    started, reason = clock(), "timeout"
    try:
        while clock() - started < s.timeout_s:
            with server.lock:
                stats, last = dict(server.stats), server.last
            if stats["done_ok"] + stats["done_failed"] >= s.peers:
                reason = "peers done"
                break
            if time.monotonic() - last > s.idle_s:
                reason = "idle"
                break
            time.sleep(0.2)
    finally:
        server.shutdown()
        server.server_close()
    with server.lock:
        stats = dict(server.stats)
    seconds = round(clock() - started, 1)
    return dict(stats, stopped=reason, refused=server.refusals.count, peers=s.peers, seconds=seconds)
