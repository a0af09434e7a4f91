"""What a stranger (or a node without the engine's key) sees of the cluster link (issue 19 item 7).

Run INSIDE a lab container with python3 (stdlib only: ``docker exec -i NODE python3 - ARGS < stranger.py``):

  stranger.py probe SECONDS ADDR:PORT...   connect to every ADDR:PORT at once; print one line each,
                                           "ADDR:PORT open|refused|dropped" (dropped: no answer at
                                           all within SECONDS, what an nftables drop rule gives;
                                           refused: a reset, nothing listens; open: accepted)
  stranger.py forge-hello ADDR:PORT        a hello as rank 1 of engine tp2 and a deliberate stop,
                                           neither signed with the engine's link key, each on its
                                           own connection to the rank link; prints what came back
  stranger.py forge-status ADDR:PORT       GET /status without a MAC and with a MAC made with
                                           another key; prints each HTTP status ("status 401")

Exits 0 when it could ask (what it saw is for the caller to judge), 2 on a bad command line.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import http.client
import json
import os
import select
import socket
import sys
import time


def _target(text):
    host, _sep, port = text.rpartition(":")
    return host, int(port)


def probe(seconds, targets):
    pending = {}
    result = {}
    for text in targets:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        code = sock.connect_ex(_target(text))
        if code == 0:
            result[text] = "open"
            sock.close()
        elif code in (errno.EINPROGRESS, errno.EWOULDBLOCK):
            pending[sock] = text
        else:
            result[text] = "refused" if code == errno.ECONNREFUSED else "error %s" % errno.errorcode.get(code, code)
            sock.close()
    deadline = time.monotonic() + seconds
    while pending and time.monotonic() < deadline:
        _r, writable, _x = select.select([], list(pending), [], max(0.0, deadline - time.monotonic()))
        for sock in writable:
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            text = pending.pop(sock)
            if code == 0:
                result[text] = "open"
            elif code == errno.ECONNREFUSED:
                result[text] = "refused"
            else:
                result[text] = "error %s" % errno.errorcode.get(code, code)
            sock.close()
    for sock, text in pending.items():
        result[text] = "dropped"
        sock.close()
    for text in targets:
        print("%s %s" % (text, result[text]))


def forge_hello(target):
    hello = {"hello": "tp2", "rank": 1, "fingerprint": "0" * 16, "shared": {"engine": "tp2", "argv": ["forged"]}}
    for message in (hello, {"stop": "forged", "deliberate": True, "rank": 1}):
        with socket.create_connection(_target(target), timeout=5) as sock:
            sock.sendall((json.dumps(message) + "\n").encode())
            sock.settimeout(5)
            answer = b""
            try:
                while True:
                    chunk = sock.recv(4096)
                    if not chunk:
                        break
                    answer += chunk
            except socket.timeout:
                pass
        print("sent %s, answer: %s" % (sorted(message), answer.decode(errors="replace").strip()[:300]))


# the status request's signed data and headers of plugins/module_utils/node/cluster/link_auth.py (this file runs
# alone inside a lab node, so it cannot import it; tests/unit/test_lab_stranger.py pins the twins)
STATUS_HEADERS = ("X-Uma-Nonce", "X-Uma-Time", "X-Uma-Mac")


def status_request_data(nonce, when):
    return ("uma-status-request|GET|/status|%s|%s" % (nonce, when)).encode()


def signed_status_headers(key, nonce, when):
    signature = hmac.new(key, status_request_data(nonce, when), hashlib.sha256).hexdigest()
    return dict(zip(STATUS_HEADERS, (nonce, when, signature)))


def forge_status(target):
    host, port = _target(target)
    nonce, when = os.urandom(8).hex(), "%.3f" % time.time()
    for name, headers in (
        ("without a MAC", {}),
        ("with another key's MAC", signed_status_headers(b"not this engine's key", nonce, when)),
    ):
        conn = http.client.HTTPConnection(host, port, timeout=5)
        conn.request("GET", "/status", headers=headers)
        reply = conn.getresponse()
        reply.read()
        conn.close()
        print("status %d (%s)" % (reply.status, name))


def main(argv):
    if len(argv) >= 3 and argv[0] == "probe":
        probe(float(argv[1]), argv[2:])
    elif len(argv) == 2 and argv[0] == "forge-hello":
        forge_hello(argv[1])
    elif len(argv) == 2 and argv[0] == "forge-status":
        forge_status(argv[1])
    else:
        sys.stderr.write(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
