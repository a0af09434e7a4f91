"""roles/vllm_service/files/wait_healthy.py, the health wait the role runs on a node with
``python -c``: run here the same way against a real HTTP server on 127.0.0.1 and a stand-in
``systemctl`` on PATH (no systemd in the unit-test run): 0 healthy, 2 unit down, 1 timeout."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "roles/vllm_service/files/wait_healthy.py"


class Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self):  # http.server's name
        self.send_response(self.status)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = http.server.HTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def run(tmp_path, url, active_state, timeout="3"):
    fake = tmp_path / "systemctl"
    fake.write_text("#!/bin/sh\nprintf 'ActiveState=%s\\nSubState=x\\nNRestarts=0\\n'\n" % active_state)
    fake.chmod(0o755)
    env = dict(os.environ, PATH="%s:%s" % (tmp_path, os.environ["PATH"]))
    argv = [sys.executable, "-c", SCRIPT.read_text(), url, "uma-vllm@e.service", timeout]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=30)
    return proc.returncode, json.loads(proc.stdout)


def test_healthy_engine_exits_0_with_its_unit_state(server, tmp_path):
    url = "http://127.0.0.1:%d/health" % server.server_address[1]
    Health.status = 200
    rc, state = run(tmp_path, url, "activating")
    assert rc == 0
    assert state == {"ActiveState": "activating", "SubState": "x", "NRestarts": "0", "url": url, "healthy": True}


def test_failed_unit_exits_2_at_once(server, tmp_path):
    Health.status = 503
    rc, state = run(tmp_path, "http://127.0.0.1:%d/health" % server.server_address[1], "failed", timeout="60")
    assert (rc, state["healthy"], state["ActiveState"]) == (2, False, "failed")


def test_no_answer_until_the_deadline_exits_1(tmp_path):
    rc, state = run(tmp_path, "http://127.0.0.1:9/health", "activating", timeout="0")
    assert (rc, state["healthy"]) == (1, False)
