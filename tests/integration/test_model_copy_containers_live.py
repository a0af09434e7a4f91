# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Issue 21 item 3 in two lab containers (two nodes with their own filesystems and addresses on
one Docker network, the lab image uma-lab/node:bookworm): the role's model tasks download the
model on ai1 only, and ai2 copies it from ai1 over the network between them (uma.vllm.model_copy).

lab/hub_standin.py, a STAND-IN FOR THE HUB, runs INSIDE ai1 on its loopback (127.0.0.1:8765),
redirecting the shards to its "CDN" origin as the Hub does (--cdn): ai2 cannot reach it at all,
and ai2's own endpoint (the same URL) points at its own loopback, where nothing listens -- a
download on ai2 would fail. Both nodes' modules run with the image's bare python3, which has no
huggingface_hub (a stock node: model_fetch's default client is built in).
The containers run `sleep` rather than systemd: nothing here needs a service manager.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest
from test_vllm_parser_oracle import IMAGE

ROOT = pathlib.Path(__file__).resolve().parents[2]
PREFIX = os.environ.get("UMA_ITEST_PREFIX", "uma-itest-copy") + "-%d" % os.getpid()
REPO = "lab/tiny-llama"
DEST = "/var/lib/uma-vllm/models/lab/tiny-llama"
STANDIN = "http://127.0.0.1:8765"


def docker(*argv, check=True, timeout=120):
    return subprocess.run(["docker", *argv], capture_output=True, text=True, check=check, timeout=timeout)


def _require():
    reason = None
    if shutil.which("docker") is None:
        reason = "docker is not installed"
    elif docker("image", "inspect", IMAGE, check=False).returncode != 0:
        reason = "the lab image %s is not available" % IMAGE
    if reason is None:
        return
    if os.environ.get("UMA_REQUIRE_VLLM") == "1":
        pytest.fail("UMA_REQUIRE_VLLM=1 but %s" % reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    _require()
    model = tmp_path_factory.mktemp("hub") / "tiny-llama"
    subprocess.run([sys.executable, str(ROOT / "lab" / "make_model.py"), "--out", str(model), "--shards", "2"],
                   check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    net = PREFIX + "-net"
    docker("network", "create", net)
    names = {"ai1": PREFIX + "-ai1", "ai2": PREFIX + "-ai2"}
    try:
        docker("run", "-d", "--name", names["ai1"], "--network", net,
               "-v", "%s:/hub/tiny-llama:ro" % model, "-v", "%s:/lab:ro" % (ROOT / "lab"), IMAGE,
               "sleep", "infinity")  # fmt: skip
        docker("run", "-d", "--name", names["ai2"], "--network", net, IMAGE, "sleep", "infinity")
        docker("exec", "-d", names["ai1"], "python3", "/lab/hub_standin.py", "--repo", "%s=/hub/tiny-llama" % REPO,
               "--port", "8765", "--cdn")  # fmt: skip
        addrs = {}
        for host, name in names.items():
            fmt = "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"
            addrs[host] = docker("inspect", "-f", fmt, name).stdout.strip()
        probe = "import urllib.request as u; u.urlopen('%s/api/models/%s', timeout=2)" % (STANDIN, REPO)
        for _attempt in range(50):
            if docker("exec", names["ai1"], "python3", "-c", probe, check=False).returncode == 0:
                break
            time.sleep(0.2)
        yield {"names": names, "addrs": addrs, "model": model}
    finally:
        for name in names.values():
            docker("rm", "-f", name, check=False)
        docker("network", "rm", net, check=False)


PLAY = """- hosts: all
  gather_facts: false
  vars:
    vllm_service_hub_endpoint: %(standin)s
    vllm_service_models_dir: /var/lib/uma-vllm/models
    vllm_service_link_key_dir: "%(keys)s"
    vllm_service_engines:
      - {name: tp, model: %(repo)s, port: 8000, nodes: [ai1, ai2], master_port: 29500, api_auth: none,
         plan: {tensor_parallel_size: 2}}
  tasks:
    - name: This host's engines as roles/vllm_service/tasks/main.yml finds them
      ansible.builtin.set_fact:
        __vllm_service_host_engines: >-
          {{ vllm_service_engines | uma.vllm.vllm_service_host_engines(inventory_hostname)
             | uma.vllm.vllm_service_hub_engines(vllm_service_models_dir) }}
    - name: The role's model tasks
      ansible.builtin.include_role:
        name: uma.vllm.vllm_service
        tasks_from: models
"""


def play(tmp_path, nodes, *extra, keys="keys"):
    (tmp_path / "play.yml").write_text(PLAY % {"standin": STANDIN, "keys": tmp_path / keys, "repo": REPO})
    line = (
        "%s ansible_connection=community.docker.docker ansible_host=%s ansible_python_interpreter=%s"
        " uma_cluster_addr=%s\n"
    )
    (tmp_path / "hosts.ini").write_text(
        "[all]\n"
        + line % ("ai1", nodes["names"]["ai1"], "/usr/bin/python3", nodes["addrs"]["ai1"])
        + line % ("ai2", nodes["names"]["ai2"], "/usr/bin/python3", nodes["addrs"]["ai2"])
    )
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".cache" / "collections"), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(tmp_path / "hosts.ini"),
         str(tmp_path / "play.yml"), *extra],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300, check=False,
    )  # fmt: skip
    return proc, " ".join((proc.stdout + proc.stderr).split())


def shas(nodes, host):
    script = "cd %s && sha256sum $(find . -type f ! -path './.cache/*' ! -name '.uma-*' | sort)" % DEST
    return docker("exec", nodes["names"][host], "sh", "-c", script).stdout


def test_ai2_copies_ai1_s_download_and_never_reaches_the_hub(tmp_path, nodes):
    # ai2 cannot reach the stand-in at all (it listens on ai1's loopback); neither node has huggingface_hub
    for host in ("ai1", "ai2"):
        assert docker("exec", nodes["names"][host], "python3", "-c", "import huggingface_hub", check=False).returncode
    proc, out = play(tmp_path, nodes, "-e", "vllm_service_model_source=hub")
    assert proc.returncode == 2 and "failed: [ai2]" in out and "Connection refused" in out, out[-3000:]

    proc, out = play(tmp_path, nodes, "-e", "__vllm_service_copy_idle_s=30")
    assert proc.returncode == 0, out[-5000:]
    one, two = shas(nodes, "ai1"), shas(nodes, "ai2")
    assert one == two and ".safetensors" in two, (one, two)
    manifests = [json.loads(docker("exec", nodes["names"][h], "cat", DEST + "/.uma-model-manifest.json").stdout)
                 for h in ("ai1", "ai2")]  # fmt: skip
    assert manifests[0]["commit"] == manifests[1]["commit"] and manifests[0]["files"] == manifests[1]["files"]
    assert manifests[1]["endpoint"].startswith("copy from engine tp, rank 0 on ai1 (http://%s:29512)"
                                               % nodes["addrs"]["ai1"])  # fmt: skip
    from_hub = subprocess.run(["sh", "-c", "cd %s && sha256sum $(ls | sort)" % nodes["model"]], capture_output=True,
                              text=True, check=True).stdout  # fmt: skip
    for line in from_hub.splitlines():
        digest, name = line.split()
        assert "%s  ./%s" % (digest, name) in two
    assert "1 rank(s) done, 0 failed; 0 request(s) refused; stopped (peers done)" in out, out[-3000:]
    # nothing left listening on ai1's copy port
    assert ":%04X " % 29512 not in docker("exec", nodes["names"]["ai1"], "cat", "/proc/net/tcp").stdout.upper()

    # again: nothing to copy, no server
    proc, out = play(tmp_path, nodes)
    assert proc.returncode == 0, out[-4000:]
    assert "changed=0" in out.split("PLAY RECAP")[1].split("ai2")[1], out[-1500:]
    assert "skipping: [ai1]" in out.split("Serve rank 0's verified snapshot")[1].split("TASK [")[0]

    # ai2 without the model and with another link key: refused, named, nothing copied
    docker("exec", nodes["names"]["ai2"], "rm", "-rf", DEST)
    proc, out = play(tmp_path, nodes, "-e", "__vllm_service_copy_idle_s=15",
                     keys="keys-{{ inventory_hostname }}")  # fmt: skip
    assert proc.returncode == 2, out[-4000:]
    assert "engine tp, rank 0 on ai1 refused the request" in out and "link key differs from rank 0's" in out
    assert "stopped (idle)" in out and "wrong MAC" in out, out[-3000:]
    assert docker("exec", nodes["names"]["ai2"], "test", "-e", DEST + "/.uma-model-manifest.json",
                  check=False).returncode != 0  # fmt: skip
