"""The cluster link's firewall (issue 19 item 7) for real: ``roles/vllm_service/tasks/firewall.yml``
run by ansible-playbook on a systemd lab node (the lab image, with CAP_NET_ADMIN: the node's own
network namespace, never this machine's), the rules rendered by the role's own code
(``_vllm_service_firewall.firewall_rules``) for a two-node engine of that node and a peer node.
Proven: nftables installed, the rules validated (``nft -c``) and loaded by the unit; a second
run changes nothing; from the peer node every cluster port answers, from a third node (a
stranger) the cluster ports and a port of the node's ephemeral range are dropped while the API stays
open and the node's own connection to the stranger gets its reply; no multi-node engine left:
the table, the unit and the rules file are removed and the stranger reaches the port again.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest
from test_vllm_parser_oracle import IMAGE, ROOT

from ansible_collections.uma.vllm.plugins.module_utils.service import firewall as fw

PREFIX = "itest-fw-%d" % os.getpid()
NODE, PEER, STRANGER = PREFIX + "-node", PREFIX + "-peer", PREFIX + "-stranger"
API, MASTER, LINK, STATUS, COPY = 8000, 29501, 29511, 29512, 29513
WORKER = 40000  # a port of the node's ephemeral range, where NCCL/gloo's and Ray's worker sockets listen


def _docker(*args, check=True):
    return subprocess.run(["docker", *args], check=check, capture_output=True, text=True, timeout=120)


def _have_lab():
    if os.geteuid() != 0 or not shutil.which("docker"):
        return "needs root and docker"
    if _docker("image", "inspect", IMAGE, check=False).returncode != 0:
        return "needs the lab image %s (tests/setup.sh builds it)" % IMAGE
    return None


def _addr(name):
    return _docker("inspect", "-f", "{{.NetworkSettings.IPAddress}}", name).stdout.strip()


def _reaches(source, addr, port):
    probe = "exec 3<>/dev/tcp/%s/%d" % (addr, port)
    return _docker("exec", source, "timeout", "3", "bash", "-c", probe, check=False).returncode == 0


@pytest.fixture(scope="module")
def nodes():
    reason = _have_lab()
    if reason:
        if os.environ.get("UMA_REQUIRE_TOOLS") == "1":
            pytest.fail("UMA_REQUIRE_TOOLS=1 but the firewall test %s" % reason)
        pytest.skip(reason)
    for name in (NODE, PEER, STRANGER):
        _docker("rm", "-f", name, check=False)
    try:
        _docker(
            "run", "-d", "--name", NODE, "--hostname", "fwnode", "--cgroupns", "host",
            "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "--tmpfs", "/run", "--tmpfs", "/run/lock",
            "--cap-add", "SYS_ADMIN", "--cap-add", "NET_ADMIN", "--security-opt", "apparmor=unconfined", IMAGE,
        )  # fmt: skip
        for name in (PEER, STRANGER):
            _docker("run", "-d", "--name", name, "--entrypoint", "sleep", IMAGE, "3600")
        for _attempt in range(60):
            state = _docker("exec", NODE, "systemctl", "is-system-running", check=False).stdout.strip()
            if state in ("running", "degraded"):
                break
            time.sleep(1)
        yield {"node": _addr(NODE), "peer": _addr(PEER), "stranger": _addr(STRANGER)}
    finally:
        for name in (NODE, PEER, STRANGER):
            _docker("rm", "-f", name, check=False)


def _play(tmp_path, rules):
    """The role's firewall tasks on the node with these rules; the play recap's counts."""
    (tmp_path / "rules.nft").write_text(rules)
    (tmp_path / "inv.ini").write_text(
        "%s ansible_connection=community.docker.docker ansible_python_interpreter=/usr/bin/python3\n" % NODE
    )
    (tmp_path / "play.yml").write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - name: The config directory (an earlier task of the role makes it)\n"
        "      ansible.builtin.file: {path: /etc/uma-vllm, state: directory, mode: '0755'}\n"
        "    - name: The role's firewall tasks\n"
        "      ansible.builtin.include_role: {name: uma.vllm.vllm_service, tasks_from: firewall.yml}\n"
        "      vars:\n"
        "        __vllm_service_firewall_rules: \"{{ lookup('file', '%s') }}\"\n" % (tmp_path / "rules.nft")
    )
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="json")
    out = subprocess.run(
        ["ansible-playbook", "-i", str(tmp_path / "inv.ini"), str(tmp_path / "play.yml")],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    return json.loads(out.stdout)["stats"][NODE]


def test_the_role_closes_the_cluster_ports_to_strangers_and_removes_the_rules(nodes, tmp_path):
    engine = {
        "name": "tp2",
        "port": API,
        "cluster": {"nodes": ["node", "peer"], "master_port": MASTER, "link_port": LINK},
    }
    hostvars = {"node": {"uma_cluster_addr": nodes["node"]}, "peer": {"uma_cluster_addr": nodes["peer"]}}
    port_range = _docker("exec", NODE, "cat", "/proc/sys/net/ipv4/ip_local_port_range").stdout
    low, high = map(int, port_range.split())
    assert low <= WORKER <= high, port_range
    rules = fw.firewall_rules([engine], hostvars, "Managed by uma.vllm", "node", port_range)
    assert "tcp dport { %d, %d, %d, %d }" % (MASTER, LINK, STATUS, COPY) in rules
    assert "ip daddr %s tcp dport %d-%d ct state new" % (nodes["node"], low, high) in rules

    first = _play(tmp_path, rules)
    assert first["changed"] > 0 and first["failures"] == 0
    again = _play(tmp_path, rules)
    assert again["changed"] == 0, again
    assert _docker("exec", NODE, "systemctl", "is-active", "uma-vllm-firewall.service").stdout.strip() == "active"
    assert "table inet uma_vllm" in _docker("exec", NODE, "nft", "list", "tables").stdout

    for port in (API, MASTER, LINK, STATUS, COPY, WORKER):
        _docker("exec", "-d", NODE, "python3", "-m", "http.server", str(port))
    for _attempt in range(20):
        if _reaches(PEER, nodes["node"], STATUS):
            break
        time.sleep(0.5)
    seen = {
        port: (_reaches(PEER, nodes["node"], port), _reaches(STRANGER, nodes["node"], port))
        for port in (API, MASTER, LINK, STATUS, COPY, WORKER)
    }
    # (peer reaches, stranger reaches): the API is for clients, the cluster ports for the engine's nodes
    assert seen == {
        API: (True, True),
        MASTER: (True, False),
        LINK: (True, False),
        STATUS: (True, False),
        COPY: (True, False),
        WORKER: (True, False),
    }, seen
    # the node's own connection to the stranger: the reply comes back to one of its ephemeral ports
    _docker("exec", "-d", STRANGER, "python3", "-m", "http.server", "29000")
    time.sleep(1)
    assert _reaches(NODE, nodes["stranger"], 29000)

    removed = _play(tmp_path, "")
    assert removed["changed"] > 0
    assert "uma_vllm" not in _docker("exec", NODE, "nft", "list", "tables").stdout
    left = _docker("exec", NODE, "ls", "/etc/systemd/system", "/etc/uma-vllm").stdout
    assert "uma-vllm-firewall.service" not in left and "firewall.nft" not in left
    assert _reaches(STRANGER, nodes["node"], LINK)
