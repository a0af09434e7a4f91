"""Issue 21 item 5: playbooks/status.yml, read-only, per engine and rank. Run through ansible-playbook
against this machine with the collection's records laid out in temporary directories (the node-side
reader playbooks/files/status_node.py reads real files and asks a real HTTP server for /health;
systemctl has no systemd to ask here, so the unit reads as unknown; the lab's molecule/cluster has
systemd). Nothing under the directories changes."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import pathlib
import re
import subprocess
import sys
import threading

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.service import status_report as sr

ROOT = pathlib.Path(__file__).resolve().parents[2]


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def node(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    (tmp_path / "systemd/uma-vllm@tp2.service.d").mkdir(parents=True)
    (tmp_path / "systemd/uma-vllm@solo.service.d").mkdir(parents=True)
    (tmp_path / "etc/engines").mkdir(parents=True)
    (tmp_path / "etc/engines/tp2.json").write_text(
        json.dumps(
            {"engine": "tp2", "health_url": "http://127.0.0.1:%d/health" % port, "cluster": {"rank": 0, "nnodes": 2},
             "model_path": "/models/tiny-1g",
             "plan": {"vllm_version": "0.32.0", "kv_tokens": 2064, "gpu_memory_utilization": 0.036, "table": "x"}}
        )
    )  # fmt: skip
    # A container engine: the launcher's command runs `CLIENT run ... --name uma-vllm-box`. The client is a
    # stand-in for docker's CLI (no Docker daemon in the unit stage): it answers `inspect` with this test's
    # own pid, so the memory shown is read from a real cgroup (this process's), and `image inspect`.
    (tmp_path / "systemd/uma-vllm@box.service.d").mkdir(parents=True)
    client = tmp_path / "bin/docker-standin"
    client.parent.mkdir()
    client.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = inspect ]; then\n'
        '  echo "reg.lab:5000/vllm:0.32.0|sha256:0123456789abcdef0123|running|%d"; exit 0\n'
        "fi\n"
        'if [ "$1 $2" = "image inspect" ]; then echo \'["reg.lab:5000/vllm@sha256:feed"]\'; exit 0; fi\n'
        "exit 1\n" % os.getpid()
    )
    client.chmod(0o755)
    (tmp_path / "etc/engines/box.json").write_text(
        json.dumps({"engine": "box", "health_url": "http://127.0.0.1:1/health", "model_path": "/models/m",
                    "command": [str(client), "run", "--rm", "--name", "uma-vllm-box", "reg.lab:5000/vllm:0.32.0"]})
    )  # fmt: skip
    (tmp_path / "etc/engines/solo.json").write_text(
        json.dumps({"engine": "solo", "health_url": "http://127.0.0.1:1/health"})
    )
    (tmp_path / "etc/engines/tp2.env").write_text('VLLM_API_KEY="never-read"\n')
    wd = tmp_path / "state/watchdog/solo"
    wd.mkdir(parents=True)
    (wd / "state.json").write_text(
        json.dumps({"phase": "gave_up", "reason": "3 restarts in 3600 s", "restarts_in_window": 3})
    )
    (wd / "events.json").write_text(json.dumps([
        {"action": "phase", "at": "2026-11-25T19:00:00Z", "reason": "healthy"},
        {"action": "gave_up", "at": "2026-11-25T20:00:00Z", "reason": "gave up after 3 restarts"},
        {"action": "evict", "at": "2026-11-25T20:00:01Z", "reason": "stopped"},
    ]))  # fmt: skip
    yield tmp_path, port
    server.shutdown()


def _tree(root):
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def test_status_playbook_reports_each_engine_and_changes_nothing(node):
    root, port = node
    before = _tree(root)
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".cache/collections"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json")  # fmt: skip
    proc = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), str(ROOT / "playbooks/status.yml"),
         "-i", "localhost,", "-c", "local", "-e", "ansible_python_interpreter=%s" % sys.executable,
         "-e", "ansible_become=false", "-e", "status_systemd_dir=%s/systemd" % root,
         "-e", "status_config_dir=%s/etc" % root, "-e", "status_state_dir=%s/state" % root,
         "-e", '{"vllm_service_engines": [{"name": "tp2", "port": %d, "model_path": "/m"}]}' % port],
        capture_output=True, text=True, env=env, timeout=180, check=False,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    result = json.loads(proc.stdout)
    assert result["stats"]["localhost"]["changed"] == 0
    lines = "\n".join(result["plays"][0]["tasks"][-1]["hosts"]["localhost"]["msg"])
    assert "tp2 rank 0 of 2: unit" in lines and "health 200; API http://localhost:%d/v1" % port in lines
    assert "solo single node:" in lines and "watchdog gave_up (3 restarts in 3600 s)" in lines
    assert "last restart: gave_up at 2026-11-25T20:00:00Z: gave up after 3 restarts" in lines
    assert "GAVE UP" in lines and "ansible-playbook site.yml" in lines
    # tp2 is in the inventory, solo is not
    assert lines.count("not in vllm_service_engines") == 2  # box and solo
    assert lines.index("solo single node") < lines.rindex("not in vllm_service_engines") < lines.index("tp2 rank 0")
    assert "    model /models/tiny-1g, vLLM 0.32.0, planned KV 2,064 tokens, --gpu-memory-utilization 0.036" in lines
    # the container's own memory (a real cgroup's), its image, id and registry digest
    box = re.search(
        r"container uma-vllm-box running, memory ([0-9]+) MiB \(its cgroup\); image "
        r"reg.lab:5000/vllm:0.32.0 \(id sha256:0123456789ab; reg.lab:5000/vllm@sha256:feed\)",
        lines,
    )
    assert box and int(box.group(1)) > 0, lines
    assert "never-read" not in out  # the EnvironmentFile is never opened
    assert _tree(root) == before


def test_report_of_a_worker_rank_has_no_api_url():
    node = {"engines": {"tp2": {"rank": 1, "nnodes": 2, "health_url": "http://10.0.0.1:8000/health",
                                "unit": {"ActiveState": "active", "SubState": "running", "MemoryCurrent": "2147483648",
                                         "NRestarts": "1"}, "watchdog": {"phase": "healthy"}}}}  # fmt: skip
    report = sr.status_report(node, "10.0.0.12", ["tp2"])
    (e,) = report["engines"]
    assert e["url"] is None and e["memory_mib"] == 2048 and e["rank"] == "rank 1 of 2" and not e["gave_up"]
    assert "unit active (running)" in report["lines"][0] and "systemd restarts 1" in report["lines"][0]
    assert "not in vllm_service_engines" not in " ".join(report["lines"])


@pytest.mark.parametrize(
    ("health_url", "host", "url"),
    [
        ("http://127.0.0.1:8000/health", "10.0.0.11", "http://10.0.0.11:8000/v1"),
        ("http://192.168.1.5:8000/health", "10.0.0.11", "http://192.168.1.5:8000/v1"),
        ("http://[::1]:8000/health", "fd00::1", "http://[fd00::1]:8000/v1"),
        (None, "h", None),
    ],
)
def test_api_url(health_url, host, url):
    assert sr.api_url(health_url, 0, host) == url


def test_garbage_from_the_node_is_no_traceback():
    assert sr.status_report(None, "h", None)["lines"] == ["h: no engine installed"]
    report = sr.status_report({"engines": {"x": "garbage"}, "memory": {}}, "h", [])
    assert report["engines"][0]["unit"] == "unknown (?)" and report["engines"][0]["memory_mib"] is None


def test_a_container_that_is_gone_and_a_loaded_image_are_said_plainly():
    node = {"engines": {"box": {"container": {"name": "uma-vllm-box", "state": "absent"}},
                        "img": {"container": {"name": "uma-vllm-img", "state": "exited", "image": "lab/vllm:1",
                                              "image_id": "sha256:abc", "digests": [], "memory": None}}}}  # fmt: skip
    lines = sr.status_report(node, "h", ["box", "img"])["lines"]
    assert "    container uma-vllm-box: none" in lines
    assert (
        "    container uma-vllm-img exited, memory - MiB (its cgroup); image lab/vllm:1 (id sha256:abc; no registry"
        " digest (loaded, not pulled))" in lines
    )
