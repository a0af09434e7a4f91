# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the watchdog observes on a node: the engine's HTTP surface, the rank's processes,
the peers' published status; plus sd_notify (private to the collection, stdlib only).

Every function here does I/O and returns plain dicts; the decisions are in
``_watchdog_logic``. Used by ``uma_watchdog.py`` on the node and by the unit tests.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..cluster import link_auth as auth
from ..guard.watch import proc_start_time
from . import logic


def sd_notify(text: str) -> bool:
    """Send ``text`` to systemd's notify socket (no-op without one)."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.setblocking(False)  # a full or stuck notify queue must never stall the watchdog
            sock.connect(address)
            sock.send(text.encode("utf-8", "replace"))
        return True
    except OSError:
        return False


# --------------------------------------------------------------------------
# HTTP: the engine's surface and the peers' status (never through a proxy)

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http(
    url: str, timeout: float, body: Optional[Dict[str, Any]] = None, headers: Optional[Dict[str, str]] = None
) -> Tuple[Optional[int], str, float, Optional[str]]:
    """(status, text, latency, error). Any failure is an error string, never an exception."""
    started = time.monotonic()
    status, raw, _headers, error = _request(url, timeout, body, headers)
    return status, raw.decode("utf-8", "replace"), time.monotonic() - started, error


def _request(
    url: str, timeout: float, body: Optional[Dict[str, Any]] = None, headers: Optional[Dict[str, str]] = None
) -> Tuple[Optional[int], bytes, Any, Optional[str]]:
    """(status, body bytes (1 MiB at most), response headers (looked up case-insensitively), error)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    for key, value in (headers or {}).items():
        request.add_header(key, value)
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            return response.status, response.read(1 << 20), response.headers, None
    except urllib.error.HTTPError as err:
        return err.code, b"", {}, "HTTP %d" % err.code
    except Exception as err:  # timeouts, refused connections, resets
        return None, b"", {}, (str(err) or type(err).__name__)[:200]


def _auth(cfg: Dict[str, Any]) -> Dict[str, str]:
    key = os.environ.get(cfg["api_key_env"]) if cfg.get("api_key_env") else None
    return {"Authorization": "Bearer %s" % key} if key else {}


def probe_health(cfg: Dict[str, Any]) -> Dict[str, Any]:
    status, _text, latency, error = http(cfg["base_url"] + "/health", cfg["health_timeout_s"])
    ok = status == 200
    return {"ok": ok, "latency_s": round(latency, 3), "error": None if ok else (error or "HTTP %s" % status)}


def read_metrics(cfg: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    status, text, _latency, _error = http(cfg["base_url"] + "/metrics", cfg["health_timeout_s"], headers=_auth(cfg))
    if status != 200:
        return None
    return logic.metrics_view(logic.parse_prometheus(text))


def model_id(cfg: Dict[str, Any]) -> Optional[str]:
    if cfg.get("model"):
        return cfg["model"]
    status, text, _latency, _error = http(cfg["base_url"] + "/v1/models", cfg["health_timeout_s"], headers=_auth(cfg))
    try:
        return json.loads(text)["data"][0]["id"] if status == 200 else None
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def probe_completion(cfg: Dict[str, Any], model: Optional[str]) -> Dict[str, Any]:
    """A real 1-token completion within probe_timeout_s (the API key only in the header)."""
    if not model:
        return {"ok": False, "latency_s": None, "error": "no model id (GET /v1/models failed)"}
    # recognisable: vLLM takes X-Request-Id as its request id (its request log shows
    # cmpl-uma-vllm-watchdog-...); its Prometheus metrics have no per-client label (_watchdog_counters)
    body = {"model": model, "prompt": "ping", "max_tokens": 1, "temperature": 0, "user": logic.counters.PROBE_USER}
    request_id = "%s-%s-%d" % (logic.counters.PROBE_USER, cfg["engine"], time.time_ns())
    headers = dict(_auth(cfg), **{"X-Request-Id": request_id})
    status, text, latency, error = http(cfg["base_url"] + "/v1/completions", cfg["probe_timeout_s"], body=body,
                                        headers=headers)  # fmt: skip
    if status == 200:
        try:
            if json.loads(text)["choices"]:
                return {"ok": True, "latency_s": round(latency, 3), "error": None}
        except (ValueError, KeyError, TypeError):
            pass
        return {"ok": False, "latency_s": round(latency, 3), "error": "HTTP 200 without choices"}
    return {"ok": False, "latency_s": round(latency, 3), "error": error or "HTTP %s" % status}


class Pending:
    """A call running in a thread (the watchdog keeps looking at the ranks while a completion waits)."""

    def __init__(self, call: Any, *args: Any) -> None:
        self._result: Any = None
        self._thread = threading.Thread(target=self._run, args=(call, *args), name="uma-watchdog-probe", daemon=True)
        self._thread.start()

    def _run(self, call: Any, *args: Any) -> None:
        self._result = call(*args)

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self) -> Any:
        return self._result


def start_completion(cfg: Dict[str, Any], model: Optional[str]) -> Pending:
    """probe_completion in the background: ``.done()``, then ``.result()``."""
    return Pending(probe_completion, cfg, model)


# --------------------------------------------------------------------------
# This node's rank processes


def unit_pids(show: Dict[str, str], cgroup_root: str, proc_root: str) -> List[int]:
    """The unit's processes: its cgroup (recursively), else MainPID and its descendants."""
    group = show.get("ControlGroup") or ""
    base = os.path.join(cgroup_root, group.lstrip("/")) if group else ""
    pids: List[int] = []
    if base and os.path.isdir(base):
        for dirpath, _dirs, files in os.walk(base):
            if "cgroup.procs" in files:
                try:
                    with open(os.path.join(dirpath, "cgroup.procs"), encoding="ascii") as handle:
                        pids += [int(x) for x in handle.read().split()]
                except (OSError, ValueError):
                    continue
        return sorted(set(pids))
    try:
        main = int(show.get("MainPID") or 0)
    except ValueError:
        main = 0
    return descendants(main, proc_root) if main > 0 else []


def descendants(root: int, proc_root: str = "/proc") -> List[int]:
    """``root`` and every process below it (from the PPid of each /proc/<pid>/stat)."""
    children: Dict[int, List[int]] = {}
    for name in os.listdir(proc_root):
        if not name.isdigit():
            continue
        try:
            with open(os.path.join(proc_root, name, "stat"), encoding="ascii", errors="replace") as handle:
                text = handle.read()
            ppid = int(text[text.rfind(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in found or not os.path.exists(os.path.join(proc_root, str(pid))):
            continue
        found.append(pid)
        todo += children.get(pid, [])
    return sorted(found)


def proc_info(pid: int, proc_root: str = "/proc") -> Optional[Dict[str, Any]]:
    found = proc_start_time(pid, proc_root)
    if found is None:
        return None
    try:
        with open(os.path.join(proc_root, str(pid), "cmdline"), "rb") as handle:
            cmdline = handle.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        cmdline = ""
    return {"pid": pid, "state": found[1], "cmdline": cmdline}


def container_pids(cfg: Dict[str, Any], runner: Any) -> List[int]:
    """The container's init process and its descendants (docker/podman inspect .State.Pid)."""
    rc, out, _err = runner([cfg["container_bin"], "inspect", "-f", "{{.State.Pid}}", cfg["container"]])
    text = (out or "").strip()
    if rc != 0 or not text.isdigit() or int(text) <= 0:
        return []
    return descendants(int(text), cfg["proc_root"])


def check_local(cfg: Dict[str, Any], show: Dict[str, str], runner: Any = None) -> Dict[str, Any]:
    """Is this node's rank alive? Unit active, processes present, none stopped (SIGSTOP) or dead."""
    state = show.get("ActiveState")
    if state not in ("active", "reloading"):
        return {"ok": False, "reason": "unit %s is %s" % (cfg["unit"], state), "pids": []}
    if cfg.get("container") and runner is not None:
        pids = container_pids(cfg, runner)
    else:
        pids = unit_pids(show, cfg["cgroup_root"], cfg["proc_root"])
    found = (proc_info(p, cfg["proc_root"]) for p in pids)
    infos = [i for i in found if i and i["state"] not in ("Z", "X")]  # a zombie is a dead process
    if not infos:
        return {"ok": False, "reason": "no process left in unit %s" % cfg["unit"], "pids": []}
    stopped = [i for i in infos if i["state"] in ("T", "t")]
    if stopped:
        first = stopped[0]
        why = "process %d (%s) is stopped (state %s)" % (first["pid"], first["cmdline"][:80], first["state"])
        return {"ok": False, "reason": why, "pids": [i["pid"] for i in infos], "stopped": True}
    for want in cfg["processes"]:
        have = [i for i in infos if re.search(want["match"], i["cmdline"])]
        if len(have) < want.get("min", 1):
            return {"ok": False, "reason": "%d of %d processes matching %r alive" % (
                len(have), want.get("min", 1), want["match"]), "pids": [i["pid"] for i in infos]}  # fmt: skip
    return {"ok": True, "reason": "%d processes" % len(infos), "pids": [i["pid"] for i in infos]}


# --------------------------------------------------------------------------
# The status a node publishes (read-only HTTP)


class StatusServer:
    """GET /status: this node's published status. With the engine's link ``key`` only a request
    signed with it is answered (401 otherwise, its address named through ``say``), and the
    answer is signed over the request's nonce and the body (``_link_auth``)."""

    def __init__(
        self, bind: str, port: int, key: Optional[bytes] = None, say: Optional[Callable[[str], None]] = None
    ) -> None:
        self.published: Dict[str, Any] = {}
        self.check = auth.RequestCheck(key) if key is not None else None
        self.refusals = auth.Refusals(say or (lambda _text: None))
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0].rstrip("/") not in ("", "/status"):
                    self.send_error(404)
                    return
                nonce = None
                if owner.check is not None:
                    problem, nonce = owner.check.problem("GET", self.path, self.headers)
                    if problem:
                        owner.refusals.refuse("%s:%s" % self.client_address[:2], problem)
                        self.send_error(401)
                        return
                body = json.dumps(owner.published, sort_keys=True).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                if owner.check is not None and nonce is not None:
                    self.send_header(auth.HEADER_MAC, auth.response_mac(owner.check.key, nonce, body))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: Any) -> None:
                return

        self.server = ThreadingHTTPServer((bind, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, name="uma-watchdog-status", daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def fetch_status(
    url: str, timeout: float, key: Optional[bytes] = None, refusals: Optional[auth.Refusals] = None
) -> Optional[Dict[str, Any]]:
    """A peer's published status; None when it cannot be read or (with ``key``) its answer is not
    signed with the engine's key over this request's nonce (said through ``refusals``)."""
    if key is None:
        status, raw, _headers, _error = _request(url, timeout)
    else:
        parts = urllib.parse.urlsplit(url)
        path = (parts.path or "/") + ("?" + parts.query if parts.query else "")
        headers, nonce = auth.request_headers(key, path)
        # a 401 (the peer's key differs) or no answer: status is not 200, so None below
        status, raw, answer_headers, _error = _request(url, timeout, headers=headers)
        if status == 200 and not auth.response_ok(key, nonce, raw, answer_headers.get(auth.HEADER_MAC)):
            if refusals is not None:
                refusals.refuse(url, "a status answer not signed with this engine's key")
            return None
    if status != 200:
        return None
    try:
        data = json.loads(raw.decode("utf-8", "replace"))
    except ValueError:
        return None
    return data if isinstance(data, dict) else None
