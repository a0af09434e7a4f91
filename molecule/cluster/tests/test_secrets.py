"""Issue 10, secrets canary: the lab's engine secret (VLLM_API_KEY, inventories/lab) must be only in
the engines' 0600 EnvironmentFiles - not in any other file the roles wrote, the journal, any
process's command line or the results the roles registered (dumped by converge.yml). Both lab
engines have the key (issue 21: an API on 0.0.0.0 without one is refused)."""

from __future__ import annotations

import base64

import pytest

CANARY = "uma-lab-key-not-secret"  # inventories/lab/group_vars/spark.yml uma_lab_api_key
ENV_FILE = "/etc/uma-vllm/engines/tp2.env"
ENV_FILES = ["/etc/uma-vllm/engines/tp2-ray.env", ENV_FILE]  # sorted
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
    assert sorted(out) == ENV_FILES, out
    for path in ENV_FILES:
        env = host.file(path)
        assert env.mode == 0o600 and env.user == "root"


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
