"""The cluster link closed to strangers (issue 19 item 7): the launchers' rank link and the
watchdogs' status signed with the engine's key (node/cluster/link_auth.py), over real loopback sockets.

A stranger here is a plain socket client in the test process that speaks the link's JSON
lines (or HTTP) without the engine's key: what a host on the same switch could send."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.base import checks
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.node.cluster import link_auth as auth
from ansible_collections.uma.vllm.plugins.module_utils.node.cluster import ranks as _ranks
from ansible_collections.uma.vllm.plugins.module_utils.node.watchdog import probes

KEY = "3f9a" * 16
OTHER_KEY = "c0de" * 16
KEY_BYTES = KEY.encode()
ARGV = ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--tensor-parallel-size", "2"]


def key_file(tmp_path, text=KEY, name="tp2.link.key", mode=0o600):
    path = tmp_path / name
    path.write_text(text + "\n")
    os.chmod(str(path), mode)
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(rank, port, keyfile, timeout=8.0, argv=None):
    return {
        "engine": "tp2",
        "command": list(argv or ARGV),
        "env": {},
        "cluster": {"rank": rank, "nnodes": 2, "head_addr": "127.0.0.1", "link_port": port, "peer_timeout_s": timeout,
                    "compare": True, "key_file": keyfile, "bind_addr": "127.0.0.1" if rank == 0 else None},
    }  # fmt: skip


class Said:
    def __init__(self):
        self.lines = []

    def __call__(self, line):
        self.lines.append(line)

    def has(self, *words):
        return any(all(w in line for w in words) for line in self.lines)


def start(cfg, said=None):
    """A rank's rendezvous in a thread: (thread, result dict with 'link' or 'error')."""
    out = {}
    link = _ranks.RankLink(cfg, said or Said())
    out["link"] = link

    def go():
        try:
            link.rendezvous(lambda: False)
        except Exception as err:  # PeerRefused / PeerTimeout: the test looks at it
            out["error"] = err

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread, out


def wait(predicate, seconds=5.0):
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return predicate()


def stranger(port, *messages, read_first=True):
    """Connect to rank 0's link, (read its challenge), send ``messages``; the lines answered."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        got = b""
        if read_first:
            while b"\n" not in got:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                got += chunk
        for message in messages:
            sock.sendall((json.dumps(message(got) if callable(message) else message) + "\n").encode())
        sock.settimeout(3)
        try:
            while True:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                got += chunk
        except OSError:
            pass
    return [json.loads(line) for line in got.decode().splitlines() if line.strip()]


# ---------------------------------------------------------------- the key file


def test_a_safe_key_file_is_read_and_unsafe_ones_are_refused_without_showing_the_key(tmp_path):
    assert checks.secret_key("cluster.key_file", key_file(tmp_path)) == KEY.encode()
    cases = {
        "mode 0644": key_file(tmp_path, name="open.key", mode=0o644),
        "at least 32": key_file(tmp_path, text="short", name="short.key"),
        "printable": key_file(tmp_path, text=KEY[:20] + " " + KEY[20:], name="space.key"),
        "cannot be read": str(tmp_path / "missing.key"),
        "not an absolute path": "relative.key",
    }
    link = tmp_path / "link.key"
    link.symlink_to(key_file(tmp_path, name="target.key"))
    cases["cannot be read (Too many levels"] = str(link)  # O_NOFOLLOW: a symlink is not followed
    other = key_file(tmp_path, name="other-owner.key")
    os.chown(other, 4321, 4321)
    cases["owned by uid 4321"] = other
    for words, path in cases.items():
        with pytest.raises(UmaError) as err:
            checks.secret_key("cluster.key_file", path)
        assert err.value.option == "cluster.key_file" and words in err.value.message, (words, err.value.message)
        assert KEY not in err.value.message and KEY[:20] not in err.value.message


def test_a_launcher_with_an_unsafe_key_file_refuses_to_start_naming_the_option(tmp_path):
    with pytest.raises(UmaError) as err:
        _ranks.RankLink(config(0, 1, key_file(tmp_path, mode=0o640)), Said())
    assert err.value.option == "cluster.key_file" and "mode 0640" in err.value.message


@pytest.mark.parametrize("cluster, option", [({"key_file": "rel/key"}, "cluster.key_file"),
                                             ({"bind_addr": "a b"}, "cluster.bind_addr"),
                                             ({"bind_addr": 5}, "cluster.bind_addr")])  # fmt: skip
def test_bad_key_file_and_bind_addr_are_refused(cluster, option):
    base = {"nnodes": 2, "rank": 0, "link_port": 29511, "head_addr": "10.0.0.1"}
    with pytest.raises(UmaError) as err:
        _ranks.validate_cluster(dict(base, **cluster))
    assert err.value.option == option


# ---------------------------------------------------------------- the rank link


def test_ranks_with_the_same_key_meet_and_a_deliberate_stop_still_reaches_the_peer(tmp_path):
    port, keyfile = free_port(), key_file(tmp_path)
    t0, r0 = start(config(0, port, keyfile))
    t1, r1 = start(config(1, port, keyfile))
    t0.join(10)
    t1.join(10)
    assert "error" not in r0 and "error" not in r1, (r0, r1)
    link0, link1 = r0["link"], r1["link"]
    assert link0.conns[0].session is not None and link0.conns[0].session == link1.conns[0].session
    link0.notify("rank 0: signal 15", deliberate=True)
    assert wait(lambda: link1.lost is not None)
    assert link1.lost == ("rank 0 stopped: rank 0: signal 15", True)
    link1.notify("done", True)


def test_a_rank_with_a_wrong_key_is_refused_and_named_and_rank_0_keeps_waiting(tmp_path):
    port = free_port()
    said0, said1 = Said(), Said()
    t0, r0 = start(config(0, port, key_file(tmp_path), timeout=4.0), said0)
    time.sleep(0.2)
    t1, r1 = start(config(1, port, key_file(tmp_path, OTHER_KEY, "wrong.key"), timeout=3.0), said1)
    t1.join(10)
    t0.join(10)
    # neither rank refuses to start (exit 78) over a stranger: both wait until their deadline
    assert isinstance(r0.get("error"), _ranks.PeerTimeout), r0
    assert isinstance(r1.get("error"), _ranks.PeerTimeout), r1
    assert said0.has("refused a hello as rank 1 of engine 'tp2' not signed with this engine's key", "from 127.0.0.1:")
    assert "key files the same" in str(r1["error"])


def test_a_strangers_hello_with_another_configuration_does_not_stop_rank_0(tmp_path):
    """Regression (issue 19 item 7): rank 0 took the first connection that named the engine as
    a rank; a stranger's hello with another configuration made it refuse to start (exit 78).
    Now the hello is refused (not signed), the stranger named, and the real rank 1 still joins."""
    port, keyfile = free_port(), key_file(tmp_path)
    said0 = Said()
    t0, r0 = start(config(0, port, keyfile, timeout=10.0), said0)
    assert wait(lambda: r0["link"].server is not None)
    hello = {"hello": "tp2", "rank": 1, "fingerprint": "0" * 16, "shared": {"engine": "tp2", "argv": ["evil"]}}
    answered = stranger(port, hello, read_first=False)  # sent at once, as before the challenge existed
    assert all(a.get("ok") is None for a in answered), answered
    assert any(a.get("refused") and a.get("auth") is False for a in answered), answered
    # the stranger's forged stop during the rendezvous changes nothing either
    stranger(port, {"stop": "forged", "deliberate": True, "rank": 1})
    time.sleep(0.3)
    assert t0.is_alive() and "error" not in r0, r0
    assert said0.has("refused a hello as rank 1", "from 127.0.0.1:")
    t1, r1 = start(config(1, port, keyfile))
    t1.join(10)
    t0.join(10)
    assert "error" not in r0 and "error" not in r1, (r0, r1)
    assert r0["link"].lost is None and r1["link"].lost is None
    r0["link"].notify("done", True)
    r1["link"].notify("done", True)


def test_a_silent_connection_does_not_hold_up_the_real_rank(tmp_path):
    """Regression (issue 19): rank 0 shook hands with one connection at a time, waiting up to
    10 s for its hello; a stranger that connected and said nothing held the real rank off for
    that long (past a 5 s rendezvous here). Now each handshake runs on its own."""
    port, keyfile = free_port(), key_file(tmp_path)
    said0 = Said()
    t0, r0 = start(config(0, port, keyfile, timeout=5.0), said0)
    assert wait(lambda: r0["link"].server is not None)
    silent = socket.create_connection(("127.0.0.1", port), timeout=5)  # connects, never says hello
    try:
        time.sleep(0.3)
        t1, r1 = start(config(1, port, keyfile, timeout=5.0))
        t1.join(8)
        t0.join(8)
        assert "error" not in r0 and "error" not in r1, (r0, r1)
        assert [conn.peer_rank for conn in r0["link"].conns] == [1]
        silent.settimeout(0.2)
        with pytest.raises(socket.timeout):  # still open, still unanswered beyond its challenge
            while silent.recv(4096):
                pass
    finally:
        silent.close()
    for link in (r0["link"], r1["link"]):
        link.notify("done", True)


def test_more_handshakes_at_once_than_allowed_are_closed_and_named(tmp_path):
    port, keyfile = free_port(), key_file(tmp_path)
    said0 = Said()
    t0, r0 = start(config(0, port, keyfile, timeout=3.0), said0)
    assert wait(lambda: r0["link"].server is not None)
    count = _ranks.RankLink.GREETINGS_AT_ONCE + 1
    socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _index in range(count)]
    try:
        assert wait(lambda: said0.has("handshakes already under way"))
    finally:
        for sock in socks:
            sock.close()
    t0.join(8)
    assert isinstance(r0.get("error"), _ranks.PeerTimeout)


@pytest.mark.parametrize("forge", ["no MAC", "MAC over another challenge (a replayed hello)", "MAC with another key"])
def test_hellos_without_a_fresh_mac_are_refused(tmp_path, forge):
    port, keyfile = free_port(), key_file(tmp_path)
    said0 = Said()
    t0, r0 = start(config(0, port, keyfile, timeout=6.0), said0)
    assert wait(lambda: r0["link"].server is not None)
    link = r0["link"]
    base = dict(hello="tp2", rank=1, fingerprint=link.digest, shared=link.shared, nonce="n" * 32)
    old = stranger(port, read_first=True)[0]["challenge"]  # a challenge of an earlier connection

    def hello(first):
        challenge = json.loads(first.decode().splitlines()[0])["challenge"]
        if forge == "no MAC":
            return dict(base, challenge=challenge)
        if forge.startswith("MAC over another"):
            return auth.sign(KEY.encode(), dict(base, challenge=old))
        return auth.sign(OTHER_KEY.encode(), dict(base, challenge=challenge))

    answered = stranger(port, hello)
    assert [a for a in answered if "ok" in a] == [] and any(a.get("auth") is False for a in answered), answered
    assert t0.is_alive() and "error" not in r0 and link.conns == []
    assert said0.has("refused a hello as rank 1", "not signed with this engine's key")
    link.notify("done", True)
    t0.join(10)


def test_a_forged_or_replayed_stop_inside_the_session_changes_nothing(tmp_path):
    """A message on an established link that is not signed with the session's key, or that repeats
    a number already seen, is ignored and said: the peer keeps running; a real stop still works."""
    port, keyfile = free_port(), key_file(tmp_path)
    said1 = Said()
    t0, r0 = start(config(0, port, keyfile))
    t1, r1 = start(config(1, port, keyfile), said1)
    t0.join(10)
    t1.join(10)
    conn0, link1 = r0["link"].conns[0], r1["link"]
    conn0.send({"beat": 1.0})  # a real, signed message: seq = conn0.sent
    assert wait(lambda: link1.conns[0].received >= conn0.sent)
    forged = [
        {"stop": "forged", "deliberate": True, "rank": 0},  # no MAC
        # signed with the engine's key, not the session's
        auth.sign(KEY.encode(), {"stop": "forged", "deliberate": True, "rank": 0, "seq": 99}),
        auth.sign(conn0.session, {"stop": "replayed", "deliberate": True, "rank": 0, "seq": conn0.sent}),
    ]  # fmt: skip
    for message in forged:
        conn0.sock.sendall((json.dumps(message) + "\n").encode())
    assert wait(lambda: sum("refused" in line for line in said1.lines) >= 1)
    time.sleep(0.5)
    assert link1.lost is None
    assert said1.has("refused a message with a wrong or missing MAC from 127.0.0.1:%d" % port)
    assert link1.refusals.count == 3
    r0["link"].notify("rank 0: signal 15", deliberate=True)
    assert wait(lambda: link1.lost is not None)
    assert link1.lost == ("rank 0 stopped: rank 0: signal 15", True)


def test_rank_0_listens_on_its_cluster_address_only(tmp_path):
    port = free_port()
    t0, r0 = start(config(0, port, key_file(tmp_path), timeout=3.0))
    assert wait(lambda: r0["link"].server is not None)
    assert r0["link"].server.getsockname()[0] == "127.0.0.1"
    r0["link"].notify("done", True)
    t0.join(10)


# ---------------------------------------------------------------- the watchdog status


@pytest.fixture
def status_server():
    made = []

    def make(key=KEY_BYTES):
        said = Said()
        server = probes.StatusServer("127.0.0.1", 0, key, said)
        server.published = {"tick": 7, "rank": 1}
        made.append(server)
        return server, said, "http://127.0.0.1:%d/status" % server.port

    yield make
    for server in made:
        server.close()


def raw_get(url, headers=None):
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=3) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def test_the_status_answers_the_right_key_and_refuses_and_names_others(status_server):
    server, said, url = status_server()
    assert probes.fetch_status(url, 2.0, KEY.encode()) == {"tick": 7, "rank": 1}
    assert probes.fetch_status(url, 2.0, OTHER_KEY.encode()) is None
    assert said.has("refused a status request with a wrong MAC from 127.0.0.1")
    assert raw_get(url) == 401  # no MAC at all
    assert sum("refused" in line for line in said.lines) == 1  # said at most once a minute per address
    assert server.refusals.count == 2


def test_a_replayed_or_old_status_request_is_refused(status_server):
    server, _said, url = status_server()
    headers, _nonce = auth.request_headers(KEY.encode())
    assert raw_get(url, headers) == 200
    assert raw_get(url, headers) == 401  # the same nonce again
    check = auth.RequestCheck(KEY.encode(), clock=lambda: time.time() + 3600)
    problem, _nonce = check.problem("GET", "/status", auth.request_headers(KEY.encode())[0])
    assert "away from this node's clock" in problem
    assert server.refusals.count == 1


def test_an_unsigned_status_answer_is_not_believed(status_server):
    _server, _said, url = status_server(key=None)  # e.g. a stranger serving made-up status
    refusals = auth.Refusals(Said())
    assert probes.fetch_status(url, 2.0) == {"tick": 7, "rank": 1}  # without a key, as before
    assert probes.fetch_status(url, 2.0, KEY.encode(), refusals) is None
    assert refusals.count == 1 and refusals.say.has("refused a status answer not signed", url)


# ---------------------------------------------------------------- the programs refuse an unsafe key


def test_the_launcher_exits_78_on_an_unsafe_key_file_before_anything_starts(tmp_path, capsys):
    from ansible_collections.uma.vllm.plugins.module_utils.node.launch import program as uma_launch

    marker = tmp_path / "started"
    engine = {
        "engine": "tp2", "command": ["/bin/sh", "-c", "touch %s" % marker], "health_url": "http://127.0.0.1:1/health",
        "state_dir": str(tmp_path / "state"), "lock_path": str(tmp_path / "lock"),
        "cluster": dict(config(0, free_port(), key_file(tmp_path, mode=0o644))["cluster"]),
    }  # fmt: skip
    path = tmp_path / "tp2.json"
    path.write_text(json.dumps(engine))
    code = uma_launch.main(["--engine", "tp2", "--config", str(path), "--node-config", str(tmp_path / "none.json")])
    err = capsys.readouterr().err
    assert code == 78 and "option 'cluster.key_file'" in err and "mode 0644" in err and KEY not in err
    assert not marker.exists()


def test_the_watchdog_exits_78_on_an_unsafe_key_file(tmp_path, capsys):
    from ansible_collections.uma.vllm.plugins.module_utils.node.watchdog import program as uma_watchdog

    cfg = {"engine": "tp2", "rank": 0, "state_dir": str(tmp_path / "state"), "status_bind": "127.0.0.1",
           "status_port": free_port(), "peers": [{"name": "ai2", "url": "http://127.0.0.1:1/status"}],
           "key_file": key_file(tmp_path, mode=0o604)}  # fmt: skip
    path = tmp_path / "wd.json"
    path.write_text(json.dumps(cfg))
    assert uma_watchdog.main(["--config", str(path), "--ticks", "1"]) == 78
    err = capsys.readouterr().err
    assert "option 'key_file'" in err and "mode 0604" in err and KEY not in err
