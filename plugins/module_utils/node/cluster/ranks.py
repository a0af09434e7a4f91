# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ranks of one multi-node engine, as the node-local launcher sees them (node side).

vLLM's ranks of a multi-node engine know nothing of each other's lifecycle: a stopped rank 0
leaves a headless rank 1 (and its ``VLLM::Worker_TP1``) running and holding memory, and a
dead rank 1 leaves rank 0 answering ``/health`` 200 (evidence: docs/BENCHMARKS.md, section
'The two-node engine: one engine, stopped and started whole').
The launchers of the ranks therefore hold a *rank link*: every rank > 0 keeps one TCP
connection to rank 0's launcher (``head_addr:link_port``, on the cluster link).

- **Before anything loads** the ranks meet on the link and compare the fingerprint of the
  configuration they would run (the engine's argv and environment without what is per rank
  or per host). A rank that starts first waits for the others (bounded); ranks whose
  configurations differ are refused (exit 78) with the words that differ.
- **Only the engine's ranks** speak on the link: every message is signed with the engine's
  key (``cluster.key_file``, a 0600 root file the role delivers; ``node/cluster/link_auth.py``). A hello
  that is not signed with it (a stranger's, or another engine's) is refused, its address
  named in the journal, and rank 0 keeps waiting for the real rank; a forged stop changes
  nothing. Rank 0 listens on its cluster address (``cluster.bind_addr``) where one is given.
- **While it runs** each side sends a heartbeat every few seconds. A launcher that stops
  tells its peers why: a deliberate stop (a signal from ``systemctl stop`` or a play) makes
  the peers stop too and exit 0; a failure (its engine died, a rank process died, a peer
  was lost) makes them stop and exit 69 so that systemd's ``Restart=on-failure`` brings the
  whole engine back, every rank waiting for the others again. A connection that drops or
  falls silent counts as a lost peer.

Pure stdlib; runs with the node's python3 beside uma_launch.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..base import checks as _checks
from ..base.common import UmaError
from . import link_auth as auth

HEARTBEAT_S = 2.0
SILENCE_S = 15.0
# Words of the argv that legitimately differ between the ranks of one engine, or between
# hosts of different size (the planner sizes memory per host).
PER_RANK_WITH_VALUE = ("--node-rank", "--host", "--gpu-memory-utilization", "--kv-cache-memory-bytes")
PER_RANK_BARE = ("--headless",)
PER_HOST_ENV = (
    "VLLM_HOST_IP",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "TP_SOCKET_IFNAME",
    "UCX_NET_DEVICES",
    "OMPI_MCA_btl_tcp_if_include",
    "RAY_NODE_IP_ADDRESS",
    "RAY_OVERRIDE_NODE_IP_ADDRESS",
    # the cluster link's RDMA devices and GID index, read on each node (issue 35 item 2): the GID
    # index is where that node's kernel put the address's entry
    "NCCL_IB_HCA",
    "NCCL_IB_GID_INDEX",
)


class PeerRefused(Exception):
    """The ranks' configurations differ (or the engine names do): nothing may start."""


class PeerTimeout(Exception):
    """Not every rank arrived within the rendezvous deadline."""


def validate_cluster(cluster: Any) -> Optional[Dict[str, Any]]:
    """The launcher config's ``cluster`` mapping, checked; None for a single-node engine."""
    if cluster is None:
        return None
    if not isinstance(cluster, dict):
        raise UmaError("cluster", cluster, "is not a mapping", "Give rank, nnodes, head_addr and link_port, or null.")
    out = dict(cluster)
    nnodes, rank, port = out.get("nnodes"), out.get("rank"), out.get("link_port")
    if isinstance(nnodes, bool) or not isinstance(nnodes, int) or not 2 <= nnodes <= 1024:
        raise UmaError("cluster.nnodes", nnodes, "is not a node count from 2 to 1024", "Give the engine's node count.")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < nnodes:
        raise UmaError("cluster.rank", rank, "is not a rank from 0 to nnodes - 1", "Give this node's rank.")
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise UmaError("cluster.link_port", port, "is not a TCP port", "Use a number from 1 to 65535.")
    addr = out.get("head_addr")
    if not isinstance(addr, str) or not addr or any(c.isspace() for c in addr):
        raise UmaError("cluster.head_addr", addr, "is not an address", "Give rank 0's address on the cluster link.")
    timeout = out.get("peer_timeout_s", 600.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 86400:
        raise UmaError("cluster.peer_timeout_s", timeout, "is not a number of seconds in (0, 86400]", "Give e.g. 600.")
    out["peer_timeout_s"] = float(timeout)
    if not isinstance(out.get("compare", True), bool):  # exactly: bool("false") is True
        raise UmaError("cluster.compare", out["compare"], "is not a boolean", "Give true or false (not a string).")
    out["compare"] = out.get("compare", True)
    out["key_file"] = _checks.path(
        "cluster.key_file",
        out.get("key_file"),
        "Give the absolute path of the engine's link key (a 0600 root file), or null for an unauthenticated link.",
        optional=True,
    )
    bind = out.get("bind_addr")
    if bind is not None and (not isinstance(bind, str) or not bind or any(c.isspace() for c in bind)):
        raise UmaError("cluster.bind_addr", bind, "is not an address", "Give rank 0's cluster-link address, or null.")
    return out


def link_key(cluster: Dict[str, Any], say: Callable[[str], None]) -> bytes:
    """The engine's link key from ``cluster.key_file`` (UmaError when it is unsafe or unreadable);
    without one the link is signed with an empty key: integrity only, no authentication."""
    if not cluster.get("key_file"):
        say("WARNING: the rank link is not authenticated (no cluster.key_file): any host that reaches "
            "port %s can join or stop this engine" % cluster["link_port"])  # fmt: skip
        return b""
    return _checks.secret_key("cluster.key_file", cluster["key_file"], owners=(0, os.geteuid()))


def strip_flags(argv: List[str], with_value: Tuple[str, ...], bare: Tuple[str, ...]) -> List[str]:
    """``argv`` without the flags ``with_value`` (``--f V`` or ``--f=V``) and ``bare`` (``--f``)."""
    out: List[str] = []
    skip = False
    for word in argv:
        if skip:
            skip = False
            continue
        flag = word.split("=", 1)[0]
        if flag in with_value:
            skip = "=" not in word
            continue
        if flag in bare:
            continue
        out.append(word)
    return out


def strip_per_rank(argv: List[str]) -> List[str]:
    """The argv without the words that differ between ranks or hosts."""
    return strip_flags(argv, PER_RANK_WITH_VALUE, PER_RANK_BARE)


def fingerprint(config: Dict[str, Any]) -> Tuple[str, Dict[str, Any]]:
    """(short hash, what it covers) of the configuration every rank must share."""
    shared = {
        "engine": config.get("engine"),
        "argv": strip_per_rank([str(w) for w in config.get("command") or []]),
        "env": {k: str(v) for k, v in sorted((config.get("env") or {}).items()) if k not in PER_HOST_ENV},
    }
    digest = hashlib.sha256(json.dumps(shared, sort_keys=True).encode("utf-8")).hexdigest()[:16]
    return digest, shared


def differences(mine: Dict[str, Any], theirs: Dict[str, Any]) -> List[str]:
    """Readable differences between two ``fingerprint`` coverages."""
    out = []
    if mine.get("engine") != theirs.get("engine"):
        out.append("engine %r vs %r" % (mine.get("engine"), theirs.get("engine")))
    a, b = mine.get("argv") or [], theirs.get("argv") or []
    if a != b:
        only_a = [w for w in a if w not in b]
        only_b = [w for w in b if w not in a]
        out.append("argv: here %s, there %s" % (only_a or "(same words, other order)", only_b or "-"))
    ea, eb = mine.get("env") or {}, theirs.get("env") or {}
    for key in sorted(set(ea) | set(eb)):
        if ea.get(key) != eb.get(key):
            out.append("env %s: here %r, there %r" % (key, ea.get(key), eb.get(key)))
    return out


class _Conn:
    """One line-delimited JSON connection to a peer launcher."""

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock = sock
        self.peer = peer
        self.buf = b""
        self.lock = threading.Lock()
        # after the handshake: every message signed with the session key and numbered
        self.session: Optional[bytes] = None
        self.sent = 0
        self.received = 0

    def start_session(self, key: bytes) -> None:
        self.session, self.sent, self.received = key, 0, 0

    def check(self, message: Dict[str, Any]) -> Optional[str]:
        """What is wrong with a message of the session (wrong or missing MAC, replayed), or None."""
        if self.session is None:
            return None
        if not auth.verified(self.session, message):
            return "a message with a wrong or missing MAC"
        seq = message.get("seq")
        if isinstance(seq, bool) or not isinstance(seq, int) or seq <= self.received:
            return "a replayed or reordered message (seq %r after %d)" % (seq, self.received)
        self.received = seq
        return None

    def send(self, message: Dict[str, Any]) -> bool:
        with self.lock:
            if self.session is not None:
                self.sent += 1
                message = auth.sign(self.session, dict(message, seq=self.sent))
            data = (json.dumps(message, sort_keys=True) + "\n").encode("utf-8")
            try:
                self.sock.sendall(data)
                return True
            except OSError:
                return False

    def recv(self, timeout: float) -> Optional[Dict[str, Any]]:
        """The next message; None on EOF. Raises socket.timeout when nothing came in time."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("no message within %.1fs" % timeout)
            self.sock.settimeout(left)
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buf += chunk
            if len(self.buf) > 1 << 20:
                raise OSError("peer %s sent more than 1 MiB without a newline" % self.peer)
        line, self.buf = self.buf.split(b"\n", 1)
        message = json.loads(line.decode("utf-8"))
        if not isinstance(message, dict):
            raise ValueError("peer %s sent %r, not a JSON object" % (self.peer, message))
        return message

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class RankLink:
    """This rank's end of the link: rendezvous, heartbeats, and what the peers said."""

    def __init__(self, config: Dict[str, Any], say: Callable[[str], None]) -> None:
        self.cluster: Dict[str, Any] = config["cluster"]
        self.engine = config["engine"]
        self.rank = int(self.cluster["rank"])
        self.say = say
        self.digest, self.shared = fingerprint(config)
        self.key = link_key(self.cluster, say)
        self.refusals = auth.Refusals(say)
        self.conns: List[_Conn] = []
        self.server: Optional[socket.socket] = None
        # (reason, deliberate) once a peer stopped or was lost
        self.lost: Optional[Tuple[str, bool]] = None
        self._stop = threading.Event()
        self._lost_lock = threading.Lock()
        # rank 0's rendezvous: handshakes run side by side (a silent connection holds only its own
        # thread for its 10 s, never the wait of a real rank); what they found, under this lock
        self._greet_lock = threading.Lock()
        self._greeting = 0
        self._refused: Optional[PeerRefused] = None
        self._met = False

    def _hello(self) -> Dict[str, Any]:
        return {"hello": self.engine, "rank": self.rank, "fingerprint": self.digest, "shared": self.shared}

    def _check(self, hello: Dict[str, Any]) -> Optional[str]:
        if hello.get("hello") != self.engine:
            return "engine %r met engine %r on the link" % (self.engine, hello.get("hello"))
        if self.cluster["compare"] and hello.get("fingerprint") != self.digest:
            diff = differences(self.shared, hello.get("shared") or {})
            return "rank %s runs another configuration than rank %s (%s)" % (
                hello.get("rank"), self.rank, "; ".join(diff) or "fingerprints %s vs %s" % (
                    self.digest, hello.get("fingerprint")))  # fmt: skip
        return None

    # ---- rendezvous
    def rendezvous(self, should_stop: Callable[[], bool]) -> float:
        """Wait until every rank is on the link with the same configuration; seconds waited."""
        started = time.monotonic()
        deadline = started + self.cluster["peer_timeout_s"]
        if self.rank == 0:
            self._serve(deadline, should_stop)
        else:
            self._join(deadline, should_stop)
        for conn in self.conns:
            threading.Thread(target=self._reader, args=(conn,), name="rank-link-read", daemon=True).start()
        threading.Thread(target=self._heartbeat, name="rank-link-beat", daemon=True).start()
        return time.monotonic() - started

    def _serve(self, deadline: float, should_stop: Callable[[], bool]) -> None:
        server = socket.socket(socket.AF_INET6 if ":" in self.cluster["head_addr"] else socket.AF_INET)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        bind = self.cluster.get("bind_addr") or ""
        try:
            server.bind((bind, int(self.cluster["link_port"])))
        except OSError as err:
            server.close()
            raise PeerTimeout("cannot listen on the rank link %s:%s: %s" % (
                bind or "*", self.cluster["link_port"], err)) from err  # fmt: skip
        server.listen(16)
        self.server = server
        want = int(self.cluster["nnodes"]) - 1
        said = 0.0
        while len(self.conns) < want:
            if should_stop():
                raise PeerTimeout("stopped while waiting for the other ranks")
            now = time.monotonic()
            if now >= deadline:
                raise PeerTimeout("%d of %d other ranks arrived within %.0fs" % (
                    len(self.conns), want, self.cluster["peer_timeout_s"]))  # fmt: skip
            if now - said >= 10:
                said = now
                self.say("waiting on port %s for %d more rank(s) of engine %s" % (
                    self.cluster["link_port"], want - len(self.conns), self.engine))  # fmt: skip
            server.settimeout(min(0.2, max(0.05, deadline - now)))
            try:
                sock, addr = server.accept()
            except socket.timeout:
                self._raise_refused()
                continue
            self._start_greeting(_Conn(sock, "%s:%s" % addr[:2]))
            self._raise_refused()
        with self._greet_lock:
            self._met = True  # a handshake still going on is turned away
        server.close()
        self.server = None

    GREETINGS_AT_ONCE = 8

    def _start_greeting(self, conn: _Conn) -> None:
        """Rank 0: this connection's handshake in a thread of its own, at most GREETINGS_AT_ONCE
        at a time (more connections at once are closed unread, and named)."""
        with self._greet_lock:
            busy = self._greeting >= self.GREETINGS_AT_ONCE
            if not busy:
                self._greeting += 1
        if busy:
            self.say("ignored a connection from %s: %d handshakes already under way" % (
                conn.peer, self.GREETINGS_AT_ONCE))  # fmt: skip
            conn.close()
            return
        threading.Thread(target=self._greet_one, args=(conn,), name="rank-link-greet", daemon=True).start()

    def _greet_one(self, conn: _Conn) -> None:
        try:
            self._greet(conn)
        except PeerRefused as err:
            with self._greet_lock:
                self._refused = self._refused or err
        except Exception as err:  # one connection's trouble never ends the wait
            self.say("ignored a connection from %s: %s" % (conn.peer, err))
            conn.close()
        finally:
            with self._greet_lock:
                self._greeting -= 1

    def _raise_refused(self) -> None:
        with self._greet_lock:
            refused = self._refused
        if refused is not None:
            raise refused

    def _greet(self, conn: _Conn) -> None:
        """Rank 0: one connection's handshake. A hello not signed with the engine's key over this
        connection's challenge is refused and named, and the wait goes on; a signed hello with
        another configuration stops this rank (PeerRefused)."""
        challenge = auth.new_nonce()
        conn.send({"challenge": challenge, "engine": self.engine})
        try:
            hello = conn.recv(10.0)
        except (OSError, ValueError) as err:
            self.say("ignored a connection from %s: %s" % (conn.peer, err))
            conn.close()
            return
        if not hello or "hello" not in hello:
            conn.close()
            return
        nonce = hello.get("nonce")
        if not auth.verified(self.key, hello) or hello.get("challenge") != challenge or not isinstance(nonce, str):
            self.refusals.refuse(
                conn.peer,
                "a hello as rank %r of engine %r not signed with this engine's key"
                % (hello.get("rank"), hello.get("hello")),
            )
            conn.send({"refused": "the hello is not signed with this engine's link key", "auth": False})
            conn.close()
            return
        problem = self._check(hello)
        if problem:
            conn.send(auth.sign(self.key, {"refused": problem, "nonce": nonce}))
            conn.close()
            raise PeerRefused(problem)
        with self._greet_lock:  # one handshake at a time from here: the rank's place is taken once
            taken = self._met or any(c.peer_rank == hello.get("rank") for c in self.conns)  # type: ignore[attr-defined]
            if not taken:
                conn.peer_rank = hello.get("rank")  # type: ignore[attr-defined]
                conn.send(auth.sign(self.key, {"ok": self.engine, "fingerprint": self.digest, "nonce": nonce,
                                               "challenge": challenge}))  # fmt: skip
                conn.start_session(auth.session_key(self.key, challenge, nonce))
                self.conns.append(conn)
        if taken:
            conn.send(auth.sign(self.key, {"refused": "rank %s is already on the link" % hello.get("rank"),
                                           "nonce": nonce}))  # fmt: skip
            conn.close()
            return
        self.say("rank %s joined from %s (fingerprint %s)" % (hello.get("rank"), conn.peer, hello.get("fingerprint")))

    def _join(self, deadline: float, should_stop: Callable[[], bool]) -> None:
        target = (self.cluster["head_addr"], int(self.cluster["link_port"]))
        said = 0.0
        last_error = "no answer"
        while True:
            if should_stop():
                raise PeerTimeout("stopped while waiting for rank 0")
            now = time.monotonic()
            if now >= deadline:
                raise PeerTimeout("rank 0 at %s:%s did not answer within %.0fs (%s)" % (
                    target[0], target[1], self.cluster["peer_timeout_s"], last_error))  # fmt: skip
            if now - said >= 10:
                said = now
                self.say("waiting for rank 0 of engine %s at %s:%s" % (self.engine, target[0], target[1]))
            try:
                sock = socket.create_connection(target, timeout=min(5.0, max(0.1, deadline - now)))
            except OSError as err:
                last_error = str(err)
                time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
                continue
            conn = _Conn(sock, "%s:%s" % target)
            try:
                reply = self._hello_to(conn)
            except (OSError, ValueError) as err:
                reply = {"error": str(err)}
            if "ok" not in reply:
                conn.close()
                last_error = reply.get("error") or "rank 0 answered %r" % (reply,)
                time.sleep(1.0)
                continue
            conn.peer_rank = 0  # type: ignore[attr-defined]
            self.conns.append(conn)
            self.say("joined rank 0 at %s:%s (fingerprint %s)" % (target[0], target[1], reply.get("fingerprint")))
            return

    def _hello_to(self, conn: _Conn) -> Dict[str, Any]:
        """A rank > 0: the handshake with rank 0; its signed answer, or ``{"error": why}``.
        Raises PeerRefused when rank 0 refused this rank's configuration (signed)."""
        first = conn.recv(30.0)
        challenge = (first or {}).get("challenge")
        if not isinstance(challenge, str):
            return {"error": "rank 0 sent no challenge (%r): another program, or an older launcher" % (first,)}
        nonce = auth.new_nonce()
        conn.send(auth.sign(self.key, dict(self._hello(), challenge=challenge, nonce=nonce)))
        reply = conn.recv(30.0) or {}
        signed = auth.verified(self.key, reply) and reply.get("nonce") == nonce
        if "refused" in reply and signed:
            raise PeerRefused(str(reply["refused"]))
        if "refused" in reply:
            return {"error": "rank 0 refused this rank's hello (%s): are both ranks' key files the same?" % (
                reply["refused"],)}  # fmt: skip
        if "ok" not in reply or not signed or reply.get("challenge") != challenge:
            self.refusals.refuse(conn.peer, "an answer to this rank's hello not signed with this engine's key")
            return {"error": "the answer from %s is not signed with this engine's link key" % conn.peer}
        conn.start_session(auth.session_key(self.key, challenge, nonce))
        return reply

    # ---- while running
    def _set_lost(self, reason: str, deliberate: bool) -> None:
        with self._lost_lock:
            if self.lost is None and not self._stop.is_set():
                self.lost = (reason, deliberate)
                self.say("peer: %s" % reason)

    def _reader(self, conn: _Conn) -> None:
        rank = getattr(conn, "peer_rank", "?")
        heard = time.monotonic()  # the last authentic message: forged ones do not keep a peer alive
        while not self._stop.is_set():
            try:
                message = conn.recv(max(0.05, heard + SILENCE_S - time.monotonic()))
            except socket.timeout:
                self._set_lost("rank %s (%s) silent for %.0fs" % (rank, conn.peer, SILENCE_S), False)
                return
            except (OSError, ValueError) as err:
                if not self._stop.is_set():
                    self._set_lost("rank %s (%s): %s" % (rank, conn.peer, err), False)
                return
            if message is None:
                self._set_lost("rank %s (%s) closed the link without a word" % (rank, conn.peer), False)
                return
            problem = conn.check(message)
            if problem:
                self.refusals.refuse(conn.peer, problem)
                continue
            heard = time.monotonic()
            if "stop" in message:
                self._set_lost("rank %s stopped: %s" % (rank, message.get("stop")), bool(message.get("deliberate")))
                return

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            for conn in list(self.conns):
                conn.send({"beat": round(time.time(), 3)})

    def notify(self, reason: str, deliberate: bool) -> None:
        """Tell every peer that this rank stops, and why; then close the link."""
        if self._stop.is_set():
            return
        self._stop.set()
        for conn in self.conns:
            conn.send({"stop": reason, "deliberate": deliberate, "rank": self.rank})
            try:
                conn.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            conn.close()
        if self.server is not None:
            self.server.close()
            self.server = None


# --------------------------------------------------------------------------
# This node's rank processes


def proc_stat(proc_root: str, pid: Any) -> Optional[Tuple[str, List[str]]]:
    """(comm, the fields after it: state ppid pgrp ...) of ``<proc_root>/<pid>/stat``, None when the
    process is gone or the line has no ppid."""
    try:
        with open(os.path.join(proc_root, str(pid), "stat"), "rb") as handle:
            raw = handle.read().decode("utf-8", "replace")
    except OSError:
        return None
    # pid (comm) state ppid ...: comm may hold spaces and parentheses
    head, _paren, rest = raw.rpartition(")")
    fields = rest.split()
    if len(fields) < 2 or not fields[1].isdigit():
        return None
    return head.split("(", 1)[-1], fields


def process_table(proc_root: str = "/proc") -> Dict[int, Tuple[str, List[str]]]:
    """{pid: proc_stat(pid)} of every process of ``proc_root`` that has one."""
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return {}
    out = {}
    for entry in entries:
        if entry.isdigit():
            found = proc_stat(proc_root, entry)
            if found is not None:
                out[int(entry)] = found
    return out


def vllm_processes(
    root_pid: int, proc_root: str = "/proc", argv: Any = None, runner: Optional[Callable[..., Any]] = None
) -> Dict[int, str]:
    """{pid: name} of the ``VLLM::`` processes (EngineCore, Worker_TPn ...) below ``root_pid``, the
    engine's process; when its command ``argv`` runs a container, below the container's init."""
    root_pid = container_root_pid(argv, runner) or root_pid
    children: Dict[int, List[int]] = {}
    names: Dict[int, str] = {}
    for pid, (name, fields) in process_table(proc_root).items():
        names[pid] = name
        children.setdefault(int(fields[1]), []).append(pid)
    out: Dict[int, str] = {}
    todo = list(children.get(root_pid, []))
    while todo:
        pid = todo.pop()
        if names.get(pid, "").startswith("VLLM::"):
            out[pid] = names[pid]
        todo.extend(children.get(pid, []))
    return out


CONTAINER_CLIENTS = ("docker", "podman")


def container_root_pid(argv: Any, runner: Optional[Callable[..., Any]] = None) -> Optional[int]:
    """The init process of the container that ``argv`` (``docker run ... --name NAME ...``) runs.

    A container's processes descend from the container runtime, not from the client the
    launcher started: the ``VLLM::`` processes of the container runtime are found below the
    container's init process (``docker/podman inspect -f {{.State.Pid}} NAME``, a pid of this
    node's pid namespace). None for any other command, or when the runtime does not say."""
    words = [str(word) for word in argv] if isinstance(argv, (list, tuple)) else []
    if len(words) < 2 or os.path.basename(words[0]) not in CONTAINER_CLIENTS or words[1] != "run":
        return None
    name = None
    for index, word in enumerate(words[2:-1], start=2):
        if word == "--name":
            name = words[index + 1]
            break
        if word.startswith("--name="):
            name = word.split("=", 1)[1]
            break
    if not name:
        return None
    try:
        done = (runner or subprocess.run)([words[0], "inspect", "-f", "{{.State.Pid}}", name],
                                          capture_output=True, text=True, timeout=15, check=False)  # fmt: skip
    except (OSError, subprocess.SubprocessError):  # no client, or it hung: the runtime does not say
        return None
    out = (getattr(done, "stdout", "") or "").strip()
    if getattr(done, "returncode", 1) != 0 or not out.isdigit() or int(out) <= 0:
        return None
    return int(out)


def gone(watched: Dict[int, str], proc_root: str = "/proc") -> List[Tuple[int, str]]:
    """The watched processes that no longer exist (or are zombies)."""
    out = []
    for pid, name in sorted(watched.items()):
        try:
            with open(os.path.join(proc_root, str(pid), "stat"), "rb") as handle:
                state = handle.read().decode("utf-8", "replace").rpartition(")")[2].split()[:1]
        except OSError:
            out.append((pid, name))
            continue
        if state in (["Z"], ["X"]):
            out.append((pid, name))
    return out
