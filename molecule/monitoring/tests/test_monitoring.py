"""State of the lab node after uma.vllm.monitoring converged, drifted and was corrected."""

from __future__ import annotations

import os
import re
import time

PROM = "/var/lib/prometheus/node-exporter/uma_vllm.prom"
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def _value(text, series):
    match = re.search(r"^%s (\S+)$" % re.escape(series), text, re.M)
    assert match, "%s missing from:\n%s" % (series, text)
    return float(match.group(1))


def test_timer_enabled_and_active_and_units_managed(host):
    timer = host.service("uma-vllm-textfile.timer")
    assert timer.is_enabled and timer.is_running
    for unit in ("uma-vllm-textfile.timer", "uma-vllm-textfile.service"):
        f = host.file("/etc/systemd/system/" + unit)
        assert f.user == "root" and f.mode == 0o644
        head = f.content_string.splitlines()[:3]
        assert all(line.startswith("#") for line in head) and any("Ansible managed" in line for line in head)
    assert "OnUnitActiveSec=5s" in host.file("/etc/systemd/system/uma-vllm-textfile.timer").content_string


def test_programs_installed_as_in_the_collection(host):
    # the node package as the collection has it, and the collector's entry script
    for name in ("base/metrics.py", "base/common.py", "base/paths.py", "__init__.py", "base/__init__.py"):
        installed = host.file("/usr/local/lib/uma-vllm/monitoring/uma_vllm_node/" + name)
        assert installed.mode == 0o644 and installed.user == "root"
        with open(os.path.join(REPO, "plugins", "module_utils", "node", name), encoding="utf-8") as handle:
            assert installed.content_string == handle.read(), name
    entry = host.file("/usr/local/lib/uma-vllm/monitoring/uma_metrics.py")
    assert entry.mode == 0o644 and "from uma_vllm_node.base.metrics import main" in entry.content_string


def test_textfile_has_the_nodes_launches_guard_and_sysctls(host):
    text = host.file(PROM).content_string
    assert _value(text, 'uma_vllm_launch_healthy{engine="qwen"}') == 1
    assert _value(text, 'uma_vllm_launch_duration_seconds{engine="qwen"}') == 92
    assert _value(text, 'uma_vllm_launch_page_cache_peak_bytes{engine="qwen"}') == 2048 * 2**20
    assert _value(text, 'uma_vllm_launch_failed_records{engine="qwen"}') == 1
    assert _value(text, 'uma_vllm_guard_evictions_total{engine="qwen"}') == 12
    assert _value(text, 'uma_vllm_guard_running{engine="embed"}') == 1
    assert _value(text, 'uma_vllm_sysctl_drift{key="vm.min_free_kbytes"}') == 1  # the file says 1 kB
    assert _value(text, "uma_vllm_sysctl_file_edited") == 1  # its fingerprint does not match
    live = int(host.file("/proc/sys/vm/min_free_kbytes").content_string)
    assert abs(_value(text, "uma_vllm_min_free_kbytes") - live) <= live  # same order; the kernel is shared
    assert _value(text, "uma_vllm_node_mem_total_bytes") > 0


def test_timer_rewrites_the_file_atomically(host):
    first = _value(host.file(PROM).content_string, "uma_vllm_textfile_timestamp_seconds")
    deadline = time.time() + 30
    while time.time() < deadline:
        time.sleep(2)
        if _value(host.file(PROM).content_string, "uma_vllm_textfile_timestamp_seconds") > first:
            break
    else:
        raise AssertionError("the timer did not rewrite %s within 30 s" % PROM)
    leftovers = host.run("ls -A /var/lib/prometheus/node-exporter").stdout.split()
    assert [name for name in leftovers if name.startswith(".uma_vllm")] == []


def test_node_exporter_serves_the_metrics(host):
    assert host.service("prometheus-node-exporter").is_running
    result = host.run("curl -fsS --retry 10 --retry-connrefused --retry-delay 1 http://127.0.0.1:9100/metrics")
    assert result.rc == 0, result.stderr
    assert re.search(r'^uma_vllm_launch_healthy\{engine="qwen"\} 1$', result.stdout, re.M)
    assert re.search(r"^node_textfile_scrape_error 0$", result.stdout, re.M)
