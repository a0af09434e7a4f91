# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Logic of ``uma.vllm.model_fetch``: a model from the Hugging Face Hub into a directory (private).

validate -> plan (ask the Hub for the commit and the file listing, compare with the
manifest in dest, check the free space, optionally hash the safetensors) -> execute
(download the missing files into dest, hash every file, compare with the Hub's sizes
and LFS sha256, write the manifest atomically) -> result.

The Hub client (:func:`make_client`) is the built-in one by default
(``hub_http.BuiltinHubClient``: Python's urllib, nothing to install on the node) or,
with ``client: huggingface_hub``, :class:`HubClient` (the node's ``huggingface_hub``,
imported only then); tests pass a stand-in with the same three methods. The
token is read from a 0600 file into memory and handed to the client as an argument:
it is never in argv, the environment of other processes, a result or a message.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import stat
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional
from urllib.error import URLError

from ansible_collections.uma.vllm.plugins.module_utils.models.hub_http import (
    MAX_PEEK_BYTES,
    BuiltinHubClient,
    HubFile,
    Listing,
)
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError, atomic_write_json

DEFAULT_ENDPOINT = "https://huggingface.co"
MANIFEST = ".uma-model-manifest.json"
DEFAULT_PATTERNS = [
    "*.safetensors",
    "*.safetensors.index.json",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "preprocessor_config.json",
    "chat_template.jinja",
    "chat_template.json",
]
# The Hub's own rule (huggingface_hub.utils.validate_repo_id): owner/name, letters, digits, - _ .
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?"
REPO_ID_RE = re.compile(r"(%s)/(%s)" % (_NAME, _NAME))
REVISION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,199}")
ENDPOINT_RE = re.compile(r"https?://[A-Za-z0-9.-]+(?::[0-9]{1,5})?(?:/[A-Za-z0-9._~/-]*)?", re.ASCII)
TOKEN_RE = re.compile(r"[\x21-\x7e]{8,1024}")
MAX_PATTERNS = 100
HASH_BLOCK = 4 << 20


@dataclass
class Request:
    repo_id: str
    revision: str
    dest: str
    endpoint: str
    allow_patterns: List[str]
    verify: bool
    token_file: Optional[str] = None
    client: str = "builtin"
    token: Optional[str] = field(default=None, repr=False)


@dataclass
class Plan:
    request: Request
    listing: Listing
    wanted: List[HubFile]
    before: Optional[Dict[str, Any]]
    stale: List[str]
    need_bytes: int
    free_bytes: int
    verified: List[str]
    changed: bool
    warnings: List[str] = field(default_factory=list)
    # check mode (peek): the model's config.json and the listed bytes of its safetensors, so that the
    # role plans an engine whose model is not downloaded yet (None otherwise)
    config: Optional[Dict[str, Any]] = None
    weights_bytes: Optional[int] = None


def _bad(option: str, value: Any, problem: str, fix: str) -> UmaError:
    return UmaError(option, value, problem, fix)


def _text(option: str, value: Any, regex: re.Pattern[str], what: str, fix: str) -> str:
    if not isinstance(value, str) or not regex.fullmatch(value):
        raise _bad(option, value, "is not %s" % what, fix)
    return value


def _repo_id(value: Any) -> str:
    fix = "Give the model's Hugging Face id as OWNER/NAME, for example meta-llama/Llama-3.1-8B-Instruct."
    text = _text("repo_id", value, REPO_ID_RE, "a Hugging Face model id (OWNER/NAME)", fix)
    if "--" in text or ".." in text or len(text) > 96:
        raise _bad("repo_id", value, "contains '--' or '..' or is longer than 96 characters", fix)
    return text


def _revision(value: Any) -> str:
    fix = "Give a branch, a tag or a 40-character commit sha, for example main."
    text = _text("revision", value, REVISION_RE, "a branch, tag or commit name", fix)
    if ".." in text or "//" in text or text.endswith(("/", ".lock")):
        raise _bad("revision", value, "is not a valid git reference name", fix)
    return text


def _dest(value: Any) -> str:
    fix = "Give an absolute directory path (not /), for example /models/llama-3.1-8b."
    if not isinstance(value, str) or not value.startswith("/") or any(c in value for c in "\x00\n\r"):
        raise _bad("dest", value, "is not an absolute path", fix)
    path = os.path.normpath(value)
    if path == "/" or len(path) > 1024:
        raise _bad("dest", value, "is the root directory or longer than 1024 characters", fix)
    if os.path.lexists(path) and (os.path.islink(path) or not os.path.isdir(path)):
        raise _bad("dest", value, "exists and is not a directory (or is a symlink)", fix)
    parent = os.path.dirname(path)
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise _bad("dest", value, "has %r above it, which is not a directory" % parent, fix)
    return path


def _endpoint(value: Any) -> str:
    if value is None or value == "":
        return DEFAULT_ENDPOINT
    fix = "Give the Hub's base URL without credentials, query or fragment, for example https://hf-mirror.example:8443."
    text = _text("endpoint", value, ENDPOINT_RE, "an http(s) URL of a Hub", fix)
    return text.rstrip("/")


def _patterns(value: Any) -> List[str]:
    if value is None:
        return list(DEFAULT_PATTERNS)
    fix = "Give a list of 1-%d glob patterns such as '*.safetensors' and 'config.json'." % MAX_PATTERNS
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_PATTERNS:
        raise _bad("allow_patterns", value, "is not a list of 1-%d patterns" % MAX_PATTERNS, fix)
    for item in value:
        if not isinstance(item, str) or not item.strip() or len(item) > 200 or any(ord(c) < 32 for c in item):
            raise _bad("allow_patterns", value, "has the entry %r, which is not a one-line pattern" % (item,), fix)
    return list(value)


def read_token(path: Any) -> str:
    """The token from a 0600 file; every refusal names the file, never its content."""
    fix = "Write the token alone into a file owned by the connecting user, mode 0600 (chmod 600 FILE)."
    if not isinstance(path, str) or not path.startswith("/") or "\x00" in path:
        raise _bad("token_file", path, "is not an absolute path", fix)
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise _bad("token_file", path, "is not a regular file", fix)
        if info.st_mode & 0o077:
            raise _bad("token_file", path, "has mode %04o: group or others can read it" % (info.st_mode & 0o7777), fix)
        with open(path, "rb") as handle:
            raw = handle.read(4097)
    except OSError as err:
        raise _bad("token_file", path, "cannot be read (%s)" % (err.strerror or err), fix) from None
    try:
        token = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        token = ""
    if not TOKEN_RE.fullmatch(token):
        raise _bad("token_file", path, "does not hold one token (8-1024 printable ASCII characters, no spaces)", fix)
    return token


CLIENTS = ("builtin", "huggingface_hub")


def validate(params: Dict[str, Any]) -> Request:
    verify = params.get("verify")
    if not isinstance(verify, bool):
        raise _bad("verify", verify, "is not a boolean", "Give true or false.")
    client = params.get("client") or "builtin"
    if client not in CLIENTS:
        raise _bad("client", client, "is not a Hub client this module has", "Give builtin or huggingface_hub.")
    token_file = params.get("token_file")
    request = Request(
        repo_id=_repo_id(params.get("repo_id")),
        revision=_revision(params.get("revision")),
        dest=_dest(params.get("dest")),
        endpoint=_endpoint(params.get("endpoint")),
        allow_patterns=_patterns(params.get("allow_patterns")),
        verify=verify,
        token_file=token_file,
        client=client,
    )
    if token_file is not None:
        request.token = read_token(token_file)
    return request


def free_bytes(path: str) -> int:
    """Free bytes for an unprivileged writer on the filesystem that holds path (or its nearest parent)."""
    while not os.path.exists(path):
        path = os.path.dirname(path)
    info = os.statvfs(path)
    return info.f_bavail * info.f_frsize


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(HASH_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def _gib(value: int) -> str:
    return "%d bytes (%.2f GiB)" % (value, value / float(1 << 30))


def read_manifest(dest: str) -> Optional[Dict[str, Any]]:
    """The manifest of the last fetch, None when absent or not a manifest (then everything is checked anew)."""
    path = os.path.join(dest, MANIFEST)
    if not os.path.lexists(path):
        return None
    if os.path.islink(path) or not os.path.isfile(path):
        raise _bad("dest", dest, "holds %s, which is not a regular file" % MANIFEST, "Remove %s and run again." % path)
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        return None
    return data


def _local_size(dest: str, name: str) -> Optional[int]:
    """Size of dest/name; None when absent; a refusal when something else is in its place."""
    path = os.path.join(dest, name)
    if not os.path.lexists(path):
        return None
    info = os.lstat(path)
    if not stat.S_ISREG(info.st_mode):
        raise _bad(
            "dest",
            dest,
            "holds %s, which is not a regular file (a directory or symlink)" % name,
            "Remove %s and run again; the module downloads it." % path,
        )
    return info.st_size


def matches(name: str, patterns: List[str]) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in patterns)


def verify_files(dest: str, wanted: List[HubFile], manifest: Dict[str, Any]) -> List[str]:
    """Hash every safetensors file; a mismatch with the manifest or the Hub's LFS sha256 fails naming it."""
    checked = []
    for item in wanted:
        if not item.name.endswith(".safetensors"):
            continue
        path = os.path.join(dest, item.name)
        actual = sha256_of(path)
        recorded = (manifest.get("files", {}).get(item.name) or {}).get("sha256")
        for source, expected in (("the manifest", recorded), ("the Hub's LFS sha256", item.lfs_sha256)):
            if expected and actual != expected:
                raise _bad(
                    "verify",
                    True,
                    "%s has sha256 %s, %s says %s: the file is damaged" % (path, actual, source, expected),
                    "Delete %s and run again to download it again." % path,
                )
        checked.append(item.name)
    return checked


def _peek_config(request: Request, client: Any, listing: Listing, stale: List[str]) -> Dict[str, Any]:
    """config.json of the commit: the local file when it is current, else read from the Hub (nothing written)."""
    if "config.json" not in stale:
        path = os.path.join(request.dest, "config.json")
        with open(path, "rb") as handle:
            blob = handle.read()
    else:
        blob = client.read_file(request.repo_id, listing.commit, "config.json")
    try:
        config = json.loads(blob.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise _bad("repo_id", request.repo_id, "has a config.json at %s that is not JSON (%s)" % (listing.commit, err),
                   "Give a Hugging Face model (a transformers config.json beside the weights).") from None  # fmt: skip
    if not isinstance(config, dict):
        raise _bad("repo_id", request.repo_id, "has a config.json that is not a JSON object",
                   "Give a Hugging Face model (a transformers config.json beside the weights).")  # fmt: skip
    return config


def plan(request: Request, client: Any, free: Optional[Callable[[str], int]] = None, peek: bool = False) -> Plan:
    """What to download; with ``peek`` (check mode) also the model's config.json and weight bytes."""
    listing = client.listing(request.repo_id, request.revision)
    wanted = [f for f in listing.files if matches(f.name, request.allow_patterns)]
    if not wanted:
        raise _bad(
            "allow_patterns",
            request.allow_patterns,
            "matches none of the %d files of %s at %s" % (len(listing.files), request.repo_id, request.revision),
            "Give patterns that match the model's files (its safetensors and config.json).",
        )
    if listing.gated and request.token is None:
        raise _bad(
            "token_file",
            None,
            "%s is a gated model: the Hub serves its files only with an access token" % request.repo_id,
            "Accept the model's terms on the Hub, then give token_file: a 0600 file holding HF_TOKEN.",
        )
    manifest = read_manifest(request.dest) if os.path.isdir(request.dest) else None
    stale = [f.name for f in wanted if _local_size(request.dest, f.name) != f.size]
    recorded = manifest.get("files", {}) if manifest else {}
    current = (
        manifest is not None
        and manifest.get("repo_id") == request.repo_id
        and manifest.get("commit") == listing.commit
        and sorted(recorded) == sorted(f.name for f in wanted)
        and not stale
    )
    need = sum(f.size for f in wanted if f.name in stale)
    available = (free or free_bytes)(request.dest)
    if need > available:
        raise _bad(
            "dest",
            request.dest,
            "%s at %s needs %s for %d files, the filesystem of %s has %s free"
            % (request.repo_id, listing.commit, _gib(need), len(stale), request.dest, _gib(available)),
            "Free space there or give a dest on a larger filesystem; nothing was downloaded.",
        )
    verified = verify_files(request.dest, wanted, manifest or {}) if current and request.verify else []
    out = Plan(request, listing, wanted, manifest, stale, need, available, verified, changed=not current)
    if peek and any(f.name == "config.json" for f in wanted):
        out.config = _peek_config(request, client, listing, stale)
        out.weights_bytes = sum(f.size for f in wanted if f.name.endswith(".safetensors"))
    return out


def execute(p: Plan, client: Any) -> Dict[str, Any]:
    """Download what is missing, hash everything, check it against the Hub's listing, write the manifest."""
    dest = p.request.dest
    os.makedirs(dest, exist_ok=True)
    for name in p.stale:
        path = os.path.join(dest, name)
        if os.path.lexists(path):
            os.unlink(path)  # a file of the wrong size is damaged or from another commit: fetch it again
    client.download(p.request.repo_id, p.listing.commit, dest, p.request.allow_patterns, files=p.wanted)
    files = {}
    for item in p.wanted:
        path = os.path.join(dest, item.name)
        size = _local_size(dest, item.name)
        if size != item.size:
            raise _bad(
                "dest",
                dest,
                "%s is %s bytes after the download, the Hub lists %d" % (path, size, item.size),
                "Check the endpoint and the disk, delete %s and run again." % path,
            )
        digest = sha256_of(path)
        if item.lfs_sha256 and digest != item.lfs_sha256:
            raise _bad(
                "dest",
                dest,
                "%s has sha256 %s after the download, the Hub lists %s" % (path, digest, item.lfs_sha256),
                "Check the endpoint, delete %s and run again." % path,
            )
        files[item.name] = {"size": item.size, "sha256": digest}
    manifest = {
        "repo_id": p.request.repo_id,
        "revision": p.request.revision,
        "commit": p.listing.commit,
        "endpoint": p.request.endpoint,
        "files": files,
    }
    atomic_write_json(os.path.join(dest, MANIFEST), manifest)
    return manifest


def result(p: Plan, done: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    manifest = done or p.before or {}
    recorded = manifest.get("files", {}) if manifest.get("commit") == p.listing.commit else {}
    return {
        "changed": p.changed,
        "repo_id": p.request.repo_id,
        "revision": p.request.revision,
        "commit": p.listing.commit,
        "dest": p.request.dest,
        "manifest": os.path.join(p.request.dest, MANIFEST),
        "files": [
            {"name": f.name, "size": f.size, "sha256": (recorded.get(f.name) or {}).get("sha256")} for f in p.wanted
        ],
        "download": {"files": list(p.stale), "bytes": p.need_bytes, "done": done is not None},
        "space": {"path": p.request.dest, "need_bytes": p.need_bytes, "free_bytes": p.free_bytes},
        "verified": list(p.verified),
        "gated": p.listing.gated,
        "config": p.config,
        "weights_bytes": p.weights_bytes,
    }


def diff(p: Plan) -> Dict[str, str]:
    before = p.before or {}
    old = before.get("files", {}) if isinstance(before.get("files"), dict) else {}

    def text(commit: Any, names: List[str]) -> str:
        return "commit: %s\n" % commit + "".join("%s\n" % name for name in sorted(names))

    after = text(p.listing.commit, [f.name for f in p.wanted])
    return {
        "before_header": os.path.join(p.request.dest, MANIFEST),
        "after_header": os.path.join(p.request.dest, MANIFEST),
        "before": text(before.get("commit"), list(old)) if p.before else "",
        "after": after if p.changed else (text(before.get("commit"), list(old)) if p.before else after),
    }


def _hub_problem(err: BaseException, request: HubRequestView) -> UmaError:
    """A huggingface_hub error as a refusal naming the option to fix (the token scrubbed from any text)."""
    names = {klass.__name__ for klass in type(err).__mro__}
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    if request.token:
        text = text.replace(request.token, "***")
    status = getattr(getattr(err, "response", None), "status_code", None)
    if "GatedRepoError" in names or status in (401, 403):
        return _bad(
            "token_file",
            request.token_file,
            "the Hub refused %s without a valid token (%s)" % (request.repo_id, text),
            "Accept the model's terms on the Hub and give token_file: a 0600 file holding a token with read access.",
        )
    if "RevisionNotFoundError" in names:
        return _bad(
            "revision",
            request.revision,
            "is not a branch, tag or commit of %s" % request.repo_id,
            "Give an existing revision (main, a tag, or a commit sha).",
        )
    if "BadListing" in names:
        return _bad(
            "endpoint",
            request.endpoint,
            "is not answering as the Hugging Face Hub does: it %s" % text,
            "Use the Hub (unset endpoint) or a mirror that serves the Hub's API"
            " (/api/models/ID/revision/REV?blobs=True).",
        )
    if "RepositoryNotFoundError" in names:
        return _bad(
            "repo_id",
            request.repo_id,
            "the Hub at %s has no such model (%s)" % (request.endpoint, text),
            "Check the id (OWNER/NAME) and the endpoint; a private model also needs token_file.",
        )
    return _bad(
        "endpoint",
        request.endpoint,
        "the Hub could not be used (%s: %s)" % (type(err).__name__, text),
        "Check that the node reaches the endpoint (proxy, DNS, firewall) and run again.",
    )


MIN_HUB_VERSION = (0, 23)


def _version_tuple(version: str) -> tuple:
    parts = []
    for piece in version.split(".")[:2]:
        digits = re.match(r"[0-9]+", piece)
        parts.append(int(digits.group(0)) if digits else 0)
    return tuple(parts)


class HubRequestView:
    """What an error message may show about the request (the token only to scrub it)."""

    def __init__(self, repo_id: str, revision: str, endpoint: str, token_file: Optional[str], token: Optional[str]):
        self.repo_id, self.revision, self.endpoint = repo_id, revision, endpoint
        self.token_file, self.token = token_file, token

    @classmethod
    def of(cls, request: Request) -> HubRequestView:
        return cls(request.repo_id, request.revision, request.endpoint, request.token_file, request.token)


def make_client(request: Request) -> Any:
    """The client ``request.client`` names: the built-in one (stdlib, nothing to install) or huggingface_hub."""
    if request.client == "huggingface_hub":
        return HubClient(request)
    view = HubRequestView.of(request)

    def problem(err: BaseException) -> BaseException:
        if isinstance(err, UmaError):
            return err
        if isinstance(err, OSError) and not isinstance(err, (ConnectionError, TimeoutError, URLError)):
            return err  # the disk (dest), not the Hub: the module names the path
        return _hub_problem(err, view)

    return BuiltinHubClient(request.endpoint, request.token, problem=problem)


class HubClient:
    """The real Hugging Face Hub through the node's ``huggingface_hub`` (imported only here)."""

    def __init__(self, request: Request) -> None:
        self.view = HubRequestView.of(request)
        self.token: Any = request.token if request.token is not None else False
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
        try:
            import huggingface_hub  # pylint: disable=import-outside-toplevel
        except ImportError:
            raise _bad(
                "repo_id",
                request.repo_id,
                "needs the huggingface_hub package in the node's Python, which does not have it",
                "Install it on the node (pip install huggingface_hub, or the distribution's package).",
            ) from None
        version = str(getattr(huggingface_hub, "__version__", "0"))
        if _version_tuple(version) < MIN_HUB_VERSION:
            raise _bad(
                "repo_id",
                request.repo_id,
                "needs huggingface_hub >= 0.23 on the node (older releases put symlinks into dest), it has %s"
                % version,
                "Upgrade it on the node (pip install -U huggingface_hub).",
            )
        self.hub = huggingface_hub

    def listing(self, repo_id: str, revision: str) -> Listing:
        try:
            api = self.hub.HfApi(endpoint=self.view.endpoint, token=self.token)
            info = api.model_info(repo_id, revision=revision, files_metadata=True)
        except Exception as err:
            raise _hub_problem(err, self.view) from None
        siblings = list(info.siblings or [])
        unsized = [s.rfilename for s in siblings if not isinstance(s.size, int)]
        if unsized:
            raise _bad(
                "endpoint",
                self.view.endpoint,
                "listed %s without sizes (e.g. %s); the free-space check needs them" % (repo_id, unsized[0]),
                "Use an endpoint that answers /api/models/ID/revision/REV?blobs=true with file sizes (the Hub does).",
            )
        files = [HubFile(s.rfilename, s.size, getattr(s.lfs, "sha256", None) if s.lfs else None) for s in siblings]
        return Listing(commit=str(info.sha), files=files, gated=bool(getattr(info, "gated", False)))

    def read_file(self, repo_id: str, commit: str, name: str) -> bytes:
        """One small file of the commit (config.json in check mode), downloaded into a temporary directory
        that is removed again: nothing is written where the model goes."""
        with tempfile.TemporaryDirectory(prefix="uma-peek-") as tmp:
            try:
                path = self.hub.hf_hub_download(repo_id, name, revision=commit, cache_dir=tmp,
                                                endpoint=self.view.endpoint, token=self.token)  # fmt: skip
                with open(path, "rb") as handle:
                    return handle.read(MAX_PEEK_BYTES)
            except Exception as err:
                raise _hub_problem(err, self.view) from None

    def download(self, repo_id: str, commit: str, dest: str, patterns: List[str], files: Any = None) -> None:
        del files  # snapshot_download lists the commit itself
        try:
            self.hub.snapshot_download(
                repo_id,
                revision=commit,
                local_dir=dest,
                cache_dir=os.path.join(dest, ".cache", "huggingface", "hub"),
                allow_patterns=patterns,
                endpoint=self.view.endpoint,
                token=self.token,
                max_workers=4,
            )
        except Exception as err:
            raise _hub_problem(err, self.view) from None
