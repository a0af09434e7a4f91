"""uma.vllm.node_facts: runs the real commands it is given and never fails without a GPU."""

from __future__ import annotations

import os
import stat

from ansible_collections.uma.vllm.plugins.modules import node_facts


def _script(path, body):
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_spark_like_node(run_module, tmp_path):
    smi = _script(tmp_path / "nvidia-smi", 'echo "NVIDIA GB10, [N/A]"\n')
    lscpu = _script(tmp_path / "lscpu", 'echo "Architecture: aarch64"; echo "Model name: Cortex-X925"\n')
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "meminfo").write_text("MemTotal: 125522944 kB\n")
    failed, result = run_module(
        node_facts,
        {"nvidia_smi": smi, "lscpu": lscpu, "sysfs_root": str(tmp_path), "proc_root": str(tmp_path / "proc")},
    )
    facts = result["ansible_facts"]["uma_node"]
    assert not failed and not result["changed"]
    assert facts["unified_memory"] and facts["platform"] == "gb10" and facts["ram_gib"] == 119.71
    assert facts["architecture"] == "aarch64"


def test_host_without_gpu_or_nvidia_smi(run_module, tmp_path):
    failed, result = run_module(node_facts, {"nvidia_smi": "no-such-nvidia-smi", "sysfs_root": str(tmp_path)})
    facts = result["ansible_facts"]["uma_node"]
    assert not failed and facts["unified_memory"] is False
    assert "no-such-nvidia-smi not installed" in " ".join(facts["evidence"])


def test_failing_nvidia_smi_is_evidence_not_failure(run_module, tmp_path):
    smi = _script(
        tmp_path / "nvidia-smi", 'echo "NVIDIA-SMI has failed because it couldn\'t communicate" >&2; exit 9\n'
    )
    failed, result = run_module(node_facts, {"nvidia_smi": smi, "sysfs_root": str(tmp_path)})
    assert not failed
    assert any("exited 9" in e for e in result["ansible_facts"]["uma_node"]["evidence"])
    assert os.path.exists(smi)


def test_packages_missing_from_dpkg_status(run_module, tmp_path):
    status = tmp_path / "status"
    status.write_text(
        "Package: python3-psutil\nStatus: install ok installed\n\n"
        "Package: nftables\nStatus: deinstall ok config-files\n"
    )
    args = {"nvidia_smi": "no-such-nvidia-smi", "sysfs_root": str(tmp_path), "dpkg_status": str(status)}
    failed, result = run_module(node_facts, dict(args, packages=["python3-psutil", "nftables"]))
    assert not failed and not result["changed"]
    assert result["ansible_facts"]["uma_node"]["packages_missing"] == ["nftables"]
    failed, result = run_module(node_facts, dict(args, packages=["python3-psutil"]))
    assert result["ansible_facts"]["uma_node"]["packages_missing"] == []
    # without dpkg's status (not a dpkg node) the package manager decides: null, not "nothing missing"
    failed, result = run_module(node_facts, dict(args, packages=["python3-psutil"], dpkg_status=str(tmp_path / "none")))
    assert not failed and result["ansible_facts"]["uma_node"]["packages_missing"] is None
