"""State of the lab nodes after node_prep converged, drifted and was corrected."""

from __future__ import annotations

import hashlib
import json

PER_HOST = {"np-ai1": "3145728", "np-ai2": "5242880"}
SETTINGS = {"vm.vfs_cache_pressure": "200", "vm.dirty_ratio": "5", "vm.dirty_background_ratio": "2"}


def _settings(text):
    result = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            key, _unused, value = line.partition("=")
            result[key.strip()] = value.strip()
    return result


def test_drop_in_file_has_this_hosts_reserve_and_an_intact_fingerprint(host):
    name = host.backend.get_hostname()
    f = host.file("/etc/sysctl.d/90-vllm.conf")
    assert f.exists and f.user == "root" and f.mode == 0o644
    text = f.content_string
    lines = text.splitlines(True)
    assert "Managed by uma.vllm" in lines[0]
    recorded = lines[1].split("sha256:")[1].strip()
    assert recorded == hashlib.sha256("".join(lines[2:]).encode()).hexdigest()[:16]
    assert _settings(text) == dict(SETTINGS, **{"vm.min_free_kbytes": PER_HOST[name]})


def test_live_values_are_the_kernel_owners_and_the_file_only_node_never_wrote_them(host):
    # one shared kernel: np-ai1 owns the live values; np-ai2 (apply: false) only has its file
    for key, value in dict(SETTINGS, **{"vm.min_free_kbytes": PER_HOST["np-ai1"]}).items():
        assert host.file("/proc/sys/" + key.replace(".", "/")).content_string.strip() == value
    if host.backend.get_hostname() == "np-ai2":
        assert "ro" in host.check_output("findmnt -no OPTIONS /proc/sys").split(",")
        assert host.file("/proc/sys/vm/min_free_kbytes").content_string.strip() != PER_HOST["np-ai2"]


def test_originals_recorded_only_where_live_values_changed(host):
    record = host.file("/var/lib/uma-vllm/sysctl-original.json")
    if host.backend.get_hostname() == "np-ai2":
        assert not record.exists  # file-only node never touched the kernel
        return
    assert record.exists and record.mode == 0o600
    original = json.loads(record.content_string)
    assert original["vm.min_free_kbytes"] != PER_HOST["np-ai1"]
    assert set(original) <= set(SETTINGS) | {"vm.min_free_kbytes"}


def test_psutil_installed_for_the_node_programs(host):
    assert host.package("python3-psutil").is_installed
    assert host.run("python3 -c 'import psutil; print(psutil.virtual_memory().total)'").rc == 0


def test_systemd_is_pid_1_and_healthy(host):
    assert host.file("/proc/1/comm").content_string.strip() == "systemd"
    state = host.run("systemctl is-system-running").stdout.strip()
    assert state == "running", host.run("systemctl --failed --no-legend").stdout
