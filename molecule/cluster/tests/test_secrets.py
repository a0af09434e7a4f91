"""Issue 10, secrets canary: the lab's engine secret (VLLM_API_KEY, inventories/lab) must be only in
the engines' 0600 EnvironmentFiles - not in any other file the roles wrote, the journal, any
process's command line or the results the roles registered (dumped by converge.yml). Both lab
engines have the key (issue 21: an API on 0.0.0.0 without one is refused).

Issue 19 item 6: with the container runtime the engine's container reads the key from its own
0600 file (ENV_FILE's sibling CONTAINER_ENV_FILE, mounted read-only), and ``docker inspect`` /
``podman inspect`` of every engine container must not show it (Config.Env would, with ``-e``)."""

from __future__ import annotations

import base64
import json

import pytest

CANARY = "uma-lab-key-not-secret"  # inventories/lab/group_vars/spark.yml uma_lab_api_key
ENV_FILE = "/etc/uma-vllm/engines/tp2.env"
ENV_FILES = ["/etc/uma-vllm/engines/tp2-ray.env", ENV_FILE]  # sorted
CONTAINER_ENV_FILE = "/etc/uma-vllm/engines/tp2.container.env"
ENGINE_CONFIG = "/etc/uma-vllm/engines/tp2.json"
RUNTIMES = ("docker", "podman")


def _container_runtime(host):
    """The container runtime the engine's launcher config runs (docker or podman), or None for native."""
    command = json.loads(host.file(ENGINE_CONFIG).content_string).get("command") or [""]
    name = command[0].rsplit("/", 1)[-1]
    return name if name in RUNTIMES and command[1:2] == ["run"] else None


# every directory the roles write to on a node
WRITTEN = [
    "/etc/uma-vllm",
    "/etc/systemd/system",
    "/etc/sysctl.d",
    "/etc/udev/rules.d",
    "/var/lib/uma-vllm",
    "/run/uma-vllm",
    "/usr/local/lib/uma-vllm",
    "/usr/local/bin",
    "/var/tmp/uma-registered.json",
]


@pytest.fixture
def canary_file(host):
    # grep reads the pattern from a file, so its own command line does not carry the canary; the
    # file is written from base64, so this command (logged by Ansible's module) does not carry it either
    encoded = base64.b64encode((CANARY + "\n").encode()).decode()
    host.check_output("umask 077; echo %s | base64 -d > /root/.uma-canary" % encoded)
    yield "/root/.uma-canary"
    host.run("rm -f /root/.uma-canary")


def test_canary_only_in_the_0600_env_file(host, canary_file):
    assert host.file("/var/tmp/uma-registered.json").exists, "converge.yml did not dump the registered results"
    out = host.run("grep -rlsFf %s %s" % (canary_file, " ".join(WRITTEN))).stdout.split()
    want = ENV_FILES + ([CONTAINER_ENV_FILE] if _container_runtime(host) else [])
    assert sorted(out) == sorted(want), out
    for path in want:
        env = host.file(path)
        assert env.mode == 0o600 and env.user == "root", path


def test_canary_not_in_any_engine_containers_inspect(host, canary_file):
    """docker/podman inspect of every uma-vllm-* container on the node: no secret value. Counts the
    containers inspected; with the container runtime, zero inspected fails (nothing was proven)."""
    runtime = _container_runtime(host)
    inspected = []
    for binary in RUNTIMES:
        if host.run("command -v %s" % binary).rc != 0:
            continue
        names = host.run("%s ps -a --format '{{.Names}}'" % binary).stdout.split()
        for name in [n for n in names if n.startswith("uma-vllm-")]:
            hits = host.run("%s inspect %s | grep -cFf %s" % (binary, name, canary_file)).stdout.strip()
            assert hits == "0", "%s inspect %s shows the secret %s times" % (binary, name, hits)
            # not vacuous: the engine process in the container (PID 1, exec'd by the wrapper) has it
            environ = host.run("%s exec %s cat /proc/1/environ | tr '\\0' '\\n'" % (binary, name)).stdout
            assert "VLLM_API_KEY=%s" % CANARY in environ.splitlines(), "%s: the engine lacks its key" % name
            inspected.append("%s:%s" % (binary, name))
    print("engine containers inspected: %d %s" % (len(inspected), inspected))
    if runtime is None:
        pytest.skip("native runtime: %d engine containers inspected (none expected)" % len(inspected))
    assert inspected, "the engine runs in %s but no uma-vllm-* container was inspected" % runtime


def test_canary_not_in_the_journal(host, canary_file):
    hits = host.run("journalctl --no-pager -o cat | grep -cFf %s" % canary_file).stdout.strip()
    assert hits == "0", "the journal carries the secret %s times" % hits


def test_canary_not_on_any_command_line(host, canary_file):
    out = host.run("grep -lsFf %s /proc/[0-9]*/cmdline" % canary_file).stdout.split()
    assert out == [], out


def test_engine_still_got_its_secret(host):
    """The canary is not vacuous: the engine process has the key in its environment."""
    pid = host.check_output("systemctl show -p MainPID --value uma-vllm@tp2.service").strip()
    assert pid not in ("", "0")
    environ = host.check_output("cat /proc/%s/environ | tr '\\0' '\\n'" % pid)
    assert "VLLM_API_KEY=%s" % CANARY in environ.splitlines()
