# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A Hugging Face Hub client in Python's standard library (urllib): nothing to install on a node (private).

``model_fetch``'s default client (``client: builtin``). It makes the calls the Hub's own
client makes for a model download:

- ``GET {endpoint}/api/models/{repo_id}/revision/{revision}?blobs=True``: the commit, the
  gated flag and every file with its size and, for LFS files, its sha256;
- ``GET {endpoint}/{repo_id}/resolve/{commit}/{name}``: one file; the Hub answers LFS (and
  Xet) files with a redirect to a CDN's signed URL. The token (``Authorization: Bearer``)
  goes to the endpoint's own origin only, never to a host a redirect names (as ``httpx``
  and ``requests`` do for the Hub's client).

Each file goes into ``dest/.cache/uma-hub/NAME.part`` and is renamed into place when it has
the listed size; an interrupted download (a lost connection, a killed run) resumes from the
``.part`` file with a ``Range`` request. Connection failures, 5xx and 429 answers are tried
again (with a pause that doubles) before the run fails. An HTTP error is mapped as
``huggingface_hub.utils.hf_raise_for_status`` maps it (its ``X-Error-Code`` header:
``RepoNotFound``, ``RevisionNotFound``, ``GatedRepo``, ``EntryNotFound``), so the
refusals name the same option and fix whichever client ran.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import socket
import ssl
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional
from urllib.parse import quote, urljoin, urlsplit

STAGING = os.path.join(".cache", "uma-hub")
MAX_REDIRECTS = 10
BLOCK = 1 << 20
COMMIT_RE = re.compile(r"[0-9a-f]{40}")
RETRY_STATUS = (429, 500, 502, 503, 504)
USER_AGENT = "uma.vllm-model_fetch (python-urllib)"
MAX_PEEK_BYTES = 4 << 20  # a config.json is a few KiB


@dataclass
class HubFile:
    """One file of the repository at the commit: name, size, LFS sha256 where the Hub lists one."""

    name: str
    size: int
    lfs_sha256: Optional[str] = None


@dataclass
class Listing:
    commit: str
    files: List[HubFile]
    gated: bool = False


class HubHTTPError(Exception):
    """An HTTP error of the Hub; the subclasses carry huggingface_hub's names (fetch._hub_problem maps them)."""

    def __init__(self, message: str, status: Optional[int]) -> None:
        super().__init__(message)
        self.response = _Status(status)


class _Status:  # pylint: disable=too-few-public-methods
    def __init__(self, status: Optional[int]) -> None:
        self.status_code = status


class RepositoryNotFoundError(HubHTTPError):
    pass


class RevisionNotFoundError(HubHTTPError):
    pass


class GatedRepoError(HubHTTPError):
    pass


class EntryNotFoundError(HubHTTPError):
    pass


class BadListing(Exception):
    """The endpoint answered something that is not the Hub's model info (or sent more than it listed)."""


_BY_CODE = {
    "RepoNotFound": RepositoryNotFoundError,
    "RevisionNotFound": RevisionNotFoundError,
    "GatedRepo": GatedRepoError,
    "EntryNotFound": EntryNotFoundError,
}


def http_error(status: int, headers: Any, url: str) -> HubHTTPError:
    """An HTTP error answer as huggingface_hub's hf_raise_for_status classifies it."""
    code = (headers.get("X-Error-Code") if headers is not None else None) or ""
    message = (headers.get("X-Error-Message") if headers is not None else None) or ""
    text = "%d Client Error for %s%s" % (status, _no_query(url), (": " + message) if message else "")
    klass = _BY_CODE.get(code)
    if klass is None and status == 401 and message != "Invalid credentials in Authorization header":
        klass = RepositoryNotFoundError
    return (klass or HubHTTPError)(text, status)


def _no_query(url: str) -> str:
    """A URL without its query (a CDN's signed URL carries its signature there)."""
    return url.split("?", 1)[0]


def origin(url: str) -> tuple:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return (parts.scheme, (parts.hostname or "").lower(), port)


def safe_name(name: Any) -> bool:
    """A repository file name that stays inside dest (no absolute path, no '..', not our own bookkeeping)."""
    if not isinstance(name, str) or not name or len(name) > 1024 or name.startswith("/"):
        return False
    if any(ord(c) < 32 for c in name) or "\\" in name:
        return False
    parts = name.split("/")
    return all(part not in ("", ".", "..") for part in parts) and parts[0] != ".cache"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are followed by ``BuiltinHubClient._open`` itself (to drop the token on another origin)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


def default_opener() -> urllib.request.OpenerDirector:
    """urllib's opener (the environment's proxies, the system's CA certificates) without its redirects."""
    context = ssl.create_default_context()
    return urllib.request.build_opener(urllib.request.HTTPSHandler(context=context), _NoRedirect())


_TRANSIENT = (urllib.error.URLError, http.client.HTTPException, ConnectionError, socket.timeout, TimeoutError)


class BuiltinHubClient:
    """``listing``, ``read_file`` and ``download`` over urllib. ``token`` None sends no token."""

    def __init__(
        self,
        endpoint: str,
        token: Optional[str] = None,
        *,
        problem: Callable[[BaseException], Exception],
        opener: Optional[urllib.request.OpenerDirector] = None,
        timeout: float = 60.0,
        retries: int = 4,
        pause: float = 1.0,
        workers: int = 4,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.token = token
        self.problem = problem  # maps an exception to the refusal (fetch._hub_problem with the request)
        self.opener = opener or default_opener()
        self.timeout, self.retries, self.pause, self.workers, self.sleep = timeout, retries, pause, workers, sleep
        self.origin = origin(self.endpoint)

    # -- HTTP ---------------------------------------------------------------------------------
    def _open(self, url: str, headers: Optional[Dict[str, str]] = None) -> Any:
        """GET url, following redirects; the token only to the endpoint's origin. HTTP errors raise HubHTTPError."""
        for _hop in range(MAX_REDIRECTS + 1):
            request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT, **(headers or {})})
            if self.token is not None and origin(url) == self.origin:
                request.add_unredirected_header("Authorization", "Bearer %s" % self.token)
            try:
                return self.opener.open(request, timeout=self.timeout)
            except urllib.error.HTTPError as err:
                status, answer = err.code, err.headers
                err.close()
                location = answer.get("Location") if answer is not None else None
                if status in (301, 302, 303, 307, 308) and location:
                    url = urljoin(url, location)
                    if urlsplit(url).scheme not in ("http", "https"):
                        raise BadListing("redirected to %s, which is not http(s)" % _no_query(url)) from None
                    continue
                raise http_error(status, answer, url) from None
        raise BadListing("more than %d redirects from %s" % (MAX_REDIRECTS, _no_query(url)))

    def _retrying(self, action: Callable[[], Any]) -> Any:
        """action(), tried again after a lost connection, a timeout, a 5xx or a 429 (pauses 1, 2, 4 ... s)."""
        attempt = 0
        while True:
            try:
                return action()
            except HubHTTPError as err:
                if err.response.status_code not in RETRY_STATUS or attempt >= self.retries:
                    raise
            except _TRANSIENT as err:
                if attempt >= self.retries or isinstance(getattr(err, "reason", None), socket.gaierror):
                    raise  # tried often enough, or a name that does not resolve (no use asking again)
            self.sleep(self.pause * (2**attempt))
            attempt += 1

    def _url(self, repo_id: str, revision: str, name: str) -> str:
        return "%s/%s/resolve/%s/%s" % (self.endpoint, repo_id, quote(revision, safe=""), quote(name))

    def _json(self, url: str) -> Any:
        def get() -> Any:
            with self._open(url, {"Accept": "application/json"}) as answer:
                return answer.read(64 << 20)

        raw = self._retrying(get)
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as err:
            raise BadListing("answered %s with something that is not JSON (%s)" % (url, err)) from None

    # -- the three calls fetch makes ------------------------------------------------------------
    def listing(self, repo_id: str, revision: str) -> Listing:
        url = "%s/api/models/%s/revision/%s?blobs=True" % (self.endpoint, repo_id, quote(revision, safe=""))
        try:
            info = self._json(url)
            return parse_listing(info, url)
        except Exception as err:  # pylint: disable=broad-except
            raise self.problem(err) from None

    def read_file(self, repo_id: str, commit: str, name: str) -> bytes:
        def get() -> bytes:
            with self._open(self._url(repo_id, commit, name)) as answer:
                return answer.read(MAX_PEEK_BYTES)

        try:
            return self._retrying(get)
        except Exception as err:  # pylint: disable=broad-except
            raise self.problem(err) from None

    def download(self, repo_id: str, commit: str, dest: str, patterns: List[str], files: List[HubFile]) -> None:
        """Every file of ``files`` (the plan's, already matched by patterns) not in dest at its listed size."""
        del patterns  # fetch matched them when it planned
        todo = [f for f in files if _size(os.path.join(dest, f.name)) != f.size]
        try:
            if len(todo) <= 1 or self.workers <= 1:
                for item in todo:
                    self._one(repo_id, commit, dest, item)
            else:
                with ThreadPoolExecutor(max_workers=min(self.workers, len(todo))) as pool:
                    for future in [pool.submit(self._one, repo_id, commit, dest, item) for item in todo]:
                        future.result()
        except Exception as err:  # pylint: disable=broad-except
            raise self.problem(err) from None
        _remove_empty(os.path.join(dest, STAGING), stop=dest)

    def _one(self, repo_id: str, commit: str, dest: str, item: HubFile) -> None:
        final = os.path.join(dest, item.name)
        part = os.path.join(dest, STAGING, item.name + ".part")
        os.makedirs(os.path.dirname(part), exist_ok=True)
        url = self._url(repo_id, commit, item.name)

        def fetch_rest() -> None:
            have = _size(part) or 0
            if have > item.size:
                os.unlink(part)
                have = 0
            if have == item.size and os.path.exists(part):
                return
            headers = {"Range": "bytes=%d-" % have} if have else {}
            with self._open(url, headers) as answer:
                status = getattr(answer, "status", 200)
                start = _range_start(answer.headers.get("Content-Range")) if status == 206 else 0
                if status == 206 and start != have:
                    raise BadListing(
                        "answered a range from byte %s when asked from %d: %s" % (start, have, _no_query(url))
                    )
                with open(part, "ab" if status == 206 else "wb") as out:
                    written = have if status == 206 else 0
                    while True:
                        block = answer.read(BLOCK)
                        if not block:
                            break
                        written += len(block)
                        if written > item.size:
                            raise BadListing("sent more than the %d bytes it lists for %s" % (item.size, item.name))
                        out.write(block)
                    out.flush()
                    os.fsync(out.fileno())
            if written < item.size:
                raise ConnectionError(
                    "the connection ended after %d of %d bytes of %s" % (written, item.size, item.name)
                )

        self._retrying(fetch_rest)
        os.makedirs(os.path.dirname(final), exist_ok=True)
        os.replace(part, final)


def _range_start(value: Optional[str]) -> Optional[int]:
    match = re.match(r"bytes (\d+)-\d+/(?:\d+|\*)$", value or "")
    return int(match.group(1)) if match else None


def _size(path: str) -> Optional[int]:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def _remove_empty(path: str, stop: str) -> None:
    """The staging directory once it holds nothing (a failed run leaves its .part files for the next)."""
    if not os.path.isdir(path) or any(names for _base, _dirs, names in os.walk(path)):
        return
    shutil.rmtree(path, ignore_errors=True)
    parent = os.path.dirname(path)
    while parent != stop and parent.startswith(stop) and os.path.isdir(parent) and not os.listdir(parent):
        os.rmdir(parent)
        parent = os.path.dirname(parent)


def parse_listing(info: Any, url: str) -> Listing:
    """The Hub's model info (``?blobs=True``) as a fetch.Listing; anything else is refused as not the Hub."""
    if not isinstance(info, dict) or not isinstance(info.get("siblings"), list):
        raise BadListing("answered %s without a list of files (siblings)" % _no_query(url))
    commit = info.get("sha")
    if not isinstance(commit, str) or not COMMIT_RE.fullmatch(commit):
        raise BadListing("answered %s without a commit sha (sha: %r)" % (_no_query(url), commit))
    files = []
    for sibling in info["siblings"]:
        name = sibling.get("rfilename") if isinstance(sibling, dict) else None
        if not safe_name(name):
            raise BadListing("lists a file named %r, which would land outside dest" % (name,))
        size = sibling.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise BadListing(
                "listed %s without sizes (e.g. %s); the free-space check needs them" % (_no_query(url), name)
            )
        lfs = sibling.get("lfs") if isinstance(sibling.get("lfs"), dict) else {}
        sha = lfs.get("sha256") if isinstance(lfs.get("sha256"), str) else None
        files.append(HubFile(name, size, sha))
    return Listing(commit=commit, files=files, gated=bool(info.get("gated", False)))
