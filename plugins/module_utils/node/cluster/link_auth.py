# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Who may speak on the cluster link: an HMAC-SHA256 over every message of the launchers'
rank link and of the watchdogs' status, with a per-engine key (node side, stdlib only).

The key is made once on the controller (roles/vllm_service: ``vllm_service_link_key_dir``)
and delivered to every rank of the engine as a 0600 root file; its path is in the
launcher's and the watchdog's config (``key_file``), never in argv or the environment.

- **Rank link** (``node/cluster/ranks.py``): rank 0 sends a fresh challenge on each connection; the
  joining rank's hello carries it and a nonce of its own, under the key; rank 0's answer
  carries both. After that handshake every message is signed with a session key
  (HMAC(key, both nonces)) and numbered: a message from an older session, a repeated or
  reordered one, or one with a wrong or missing MAC is refused and its peer named.
- **Watchdog status** (``node/watchdog/probes.py``): a GET /status carries a fresh nonce, the
  time and their MAC; the answer carries a MAC over the nonce and the body. A request with
  a wrong or missing MAC, an old time or a nonce already seen is answered 401.

Refusals are said once per peer address and minute (a stranger cannot flood the journal).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
import time
from typing import Any, Callable, Dict, Optional, Tuple

MAC_FIELD = "mac"
STATUS_SKEW_S = 60.0  # a status request's time may differ from this node's clock by this much
SAY_EVERY_S = 60.0
_MAX_NONCES = 4096


def new_nonce() -> str:
    return secrets.token_hex(16)


def canonical(message: Dict[str, Any]) -> bytes:
    body = {k: v for k, v in message.items() if k != MAC_FIELD}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def mac(key: bytes, data: bytes) -> str:
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def sign(key: bytes, message: Dict[str, Any]) -> Dict[str, Any]:
    """``message`` with its MAC (over its canonical JSON without the MAC)."""
    return dict(message, **{MAC_FIELD: mac(key, canonical(message))})


def verified(key: bytes, message: Any) -> bool:
    """Does ``message`` (a decoded JSON object) carry the right MAC?"""
    if not isinstance(message, dict):
        return False
    given = message.get(MAC_FIELD)
    if not isinstance(given, str):
        return False
    return hmac.compare_digest(given, mac(key, canonical(message)))


def session_key(key: bytes, challenge: str, nonce: str) -> bytes:
    return hmac.new(key, ("uma-rank-link-session|%s|%s" % (challenge, nonce)).encode("ascii", "replace"),
                    hashlib.sha256).digest()  # fmt: skip


class Refusals:
    """Says each refusal, at most once per peer address and SAY_EVERY_S; counts them all."""

    def __init__(self, say: Callable[[str], None], clock: Callable[[], float] = time.monotonic) -> None:
        self.say = say
        self.clock = clock
        self.count = 0
        self._said: Dict[str, float] = {}
        self._lock = threading.Lock()

    def refuse(self, peer: str, what: str) -> None:
        address = peer.rsplit(":", 1)[0] if peer.count(":") == 1 else peer
        with self._lock:
            self.count += 1
            now = self.clock()
            last = self._said.get(address)
            if last is not None and now - last < SAY_EVERY_S:
                return
            if len(self._said) > _MAX_NONCES:
                self._said.clear()
            self._said[address] = now
        self.say("refused %s from %s (%d refusal(s) so far)" % (what, peer, self.count))


# --------------------------------------------------------------------------
# The watchdogs' status over HTTP

HEADER_NONCE = "X-Uma-Nonce"
HEADER_TIME = "X-Uma-Time"
HEADER_MAC = "X-Uma-Mac"


def _request_data(method: str, path: str, nonce: str, when: str) -> bytes:
    return ("uma-status-request|%s|%s|%s|%s" % (method, path, nonce, when)).encode("ascii", "replace")


def _response_data(nonce: str, body: bytes) -> bytes:
    return ("uma-status-response|%s|" % nonce).encode("ascii", "replace") + body


def request_headers(key: bytes, path: str = "/status", method: str = "GET") -> Tuple[Dict[str, str], str]:
    """(headers, nonce) of a signed status request."""
    nonce, when = new_nonce(), "%.3f" % time.time()
    signature = mac(key, _request_data(method, path, nonce, when))
    return {HEADER_NONCE: nonce, HEADER_TIME: when, HEADER_MAC: signature}, nonce


def response_mac(key: bytes, nonce: str, body: bytes) -> str:
    return mac(key, _response_data(nonce, body))


def response_ok(key: bytes, nonce: str, body: bytes, given: Optional[str]) -> bool:
    return isinstance(given, str) and hmac.compare_digest(given, response_mac(key, nonce, body))


class RequestCheck:
    """The status server's check of a request: MAC, time within STATUS_SKEW_S, nonce unseen."""

    def __init__(self, key: bytes, clock: Callable[[], float] = time.time) -> None:
        self.key = key
        self.clock = clock
        self._seen: Dict[str, float] = {}
        self._lock = threading.Lock()

    def problem(self, method: str, path: str, headers: Any) -> Tuple[Optional[str], Optional[str]]:
        """(what is wrong or None, the request's nonce)."""
        nonce, when, given = (headers.get(h) for h in (HEADER_NONCE, HEADER_TIME, HEADER_MAC))
        if not (isinstance(nonce, str) and isinstance(when, str) and isinstance(given, str)):
            return "a status request without a MAC", None
        if len(nonce) > 128 or len(when) > 32:
            return "a status request with a malformed nonce", None
        if not hmac.compare_digest(given, mac(self.key, _request_data(method, path, nonce, when))):
            return "a status request with a wrong MAC", None
        try:
            skew = abs(self.clock() - float(when))
        except ValueError:
            return "a status request with a malformed time", None
        if not skew <= STATUS_SKEW_S:
            return "a status request %.0fs away from this node's clock (a replay, or the clocks differ)" % skew, None
        with self._lock:
            now = self.clock()
            if nonce in self._seen:
                return "a replayed status request", None
            if len(self._seen) >= _MAX_NONCES:
                self._seen = {n: t for n, t in self._seen.items() if now - t <= 2 * STATUS_SKEW_S}
            self._seen[nonce] = now
        return None, nonce
