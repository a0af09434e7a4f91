# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# The TCP probe of playbooks/link_check.yml (issue 35 item 4), run on the nodes by `python3 -c`: one
# node serves, the other measures over the cluster link, each bound to its cluster address.
#
#   server BIND_ADDR PORT TIMEOUT_S       accept one connection: echo the latency pings, then count
#                                         the bytes of the throughput phase and say how long they took
#   client SRC_ADDR DST_ADDR PORT SECONDS connect from SRC_ADDR, time PINGS one-byte round trips, send
#                                         for SECONDS, print JSON (rtt_us median/p99, Gbit/s, bytes)
#
# Standard library only (the node's Python); nothing is written anywhere, nothing stays running
# (the server ends after one client or TIMEOUT_S).
import json
import socket
import statistics
import sys
import time

PINGS = 200
CHUNK = 1 << 20


def _family(addr):
    return socket.AF_INET6 if ":" in addr else socket.AF_INET


def _exact(conn, size):
    data = b""
    while len(data) < size:
        part = conn.recv(size - len(data))
        if not part:
            raise ConnectionError("the peer closed the connection")
        data += part
    return data


def server(bind, port, timeout_s):
    with socket.socket(_family(bind), socket.SOCK_STREAM) as lsock:
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lsock.bind((bind, port))
        lsock.listen(1)
        lsock.settimeout(timeout_s)
        try:
            conn, peer = lsock.accept()
        except socket.timeout:
            print(json.dumps({"error": "no client within %.0f s" % timeout_s}))
            return 1
    with conn:
        conn.settimeout(timeout_s)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ping in range(PINGS):
            conn.sendall(_exact(conn, 1))
        # the throughput phase: bytes until the client shuts its side, timed first to last byte
        got, first, last = 0, None, None
        while True:
            part = conn.recv(CHUNK)
            if not part:
                break
            last = time.monotonic()
            first = first if first is not None else last
            got += len(part)
        seconds = (last - first) if first is not None else 0.0
        conn.sendall(("%020d%020.6f" % (got, seconds)).encode("ascii"))
    print(json.dumps({"peer": peer[0], "bytes": got, "seconds": round(seconds, 6)}))
    return 0


def client(src, dst, port, seconds):
    deadline = time.monotonic() + 30  # the server is started just before: wait for it to listen
    while True:
        try:
            conn = socket.create_connection((dst, port), timeout=10, source_address=(src, 0))
            break
        except OSError as err:
            if time.monotonic() >= deadline:
                print(json.dumps({"error": "cannot connect from %s to %s:%d: %s" % (src, dst, port, err)}))
                return 1
            time.sleep(0.2)
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rtts = []
        for _ping in range(PINGS):
            t0 = time.perf_counter()
            conn.sendall(b"x")
            _exact(conn, 1)
            rtts.append((time.perf_counter() - t0) * 1e6)
        chunk = b"\0" * CHUNK
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            conn.sendall(chunk)
        conn.shutdown(socket.SHUT_WR)
        reply = _exact(conn, 40).decode("ascii")
    got, took = int(reply[:20]), float(reply[20:])
    rtts.sort()
    print(json.dumps({
        "src": src,
        "dst": dst,
        "rtt_us_median": round(statistics.median(rtts), 1),
        "rtt_us_p99": round(rtts[max(0, int(len(rtts) * 0.99) - 1)], 1),
        "pings": len(rtts),
        "bytes": got,
        "seconds": took,
        "gbit_s": round(got * 8 / took / 1e9, 3) if took > 0 else None,
    }))  # fmt: skip
    return 0


def main(argv):
    try:
        if len(argv) == 4 and argv[0] == "server":
            return server(argv[1], int(argv[2]), float(argv[3]))
        if len(argv) == 5 and argv[0] == "client":
            return client(argv[1], argv[2], int(argv[3]), float(argv[4]))
    except (OSError, ValueError, ConnectionError) as err:
        print(json.dumps({"error": "%s: %s" % (type(err).__name__, err)}))
        return 1
    print(json.dumps({"error": "usage: server BIND PORT TIMEOUT_S | client SRC DST PORT SECONDS"}))
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
