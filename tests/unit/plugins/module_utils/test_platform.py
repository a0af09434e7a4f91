"""Unified-memory detection from node markers (table-driven)."""

from __future__ import annotations

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.system import platform as p

CASES = [
    # id, nvidia-smi csv, lscpu model, files, expected (unified, platform)
    ("dgx-spark", "NVIDIA GB10, [N/A]\n", "Cortex-X925", {}, (True, "gb10")),
    ("dgx-spark-not-supported", "NVIDIA GB10, Not Supported\n", "Cortex-A725", {}, (True, "gb10")),
    ("gh200", "NVIDIA GH200 480GB, 97871 MiB\n", "Neoverse-V2", {}, (True, "gh200")),
    ("gb200", "NVIDIA GB200, 189471 MiB\nNVIDIA GB200, 189471 MiB\n", "Neoverse-V2", {}, (True, "gb200")),
    (
        "jetson-thor-dt",
        "",
        "Neoverse-V3AE",
        {"dt_compatible": "nvidia,p3971-0080+p3834-0008 nvidia,tegra264"},
        (True, "thor"),
    ),
    ("jetson-thor-model", "", "", {"dt_model": "NVIDIA Jetson AGX Thor Developer Kit"}, (True, "thor")),
    (
        "jetson-orin",
        "",
        "Cortex-A78AE",
        {"dt_compatible": "nvidia,p3737-0000+p3701-0005 nvidia,tegra234"},
        (True, "tegra"),
    ),
    ("spark-dmi-no-driver", "", "Cortex-X925", {"dmi_product": "NVIDIA DGX Spark"}, (True, "gb10")),
    ("unknown-gpu-without-framebuffer", "NVIDIA Future, [N/A]\n", "", {}, (True, "unknown")),
    ("discrete-h100", "NVIDIA H100 80GB HBM3, 81559 MiB\n", "AMD EPYC 9654", {}, (False, None)),
    ("no-gpu-x86", "", "Intel(R) Xeon(R) Platinum", {}, (False, None)),
    ("grace-cpu-only", "", "Neoverse-V2", {}, (False, None)),
    ("lab-container", "", "", {"dmi_product": "Standard PC (Q35 + ICH9, 2009)"}, (False, None)),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_classify(case):
    _id, smi, cpu, files, (unified, platform) = case
    gpus = p.parse_nvidia_smi_csv(smi)
    result = p.classify(files, gpus, {"Model name": cpu} if cpu else {}, None if gpus else "nvidia-smi not installed")
    assert result["unified_memory"] is unified
    assert result["platform"] == platform
    assert result["evidence"], "every verdict carries evidence"
    if not gpus:
        assert any("no NVIDIA GPU" in e for e in result["evidence"])


def test_cpu_hint_alone_is_not_a_verdict():
    result = p.classify({}, [], {"Model name": "Neoverse-V2"}, "nvidia-smi not installed")
    assert result["cpu_hint"] == "gh200" and not result["unified_memory"]
    assert "no GPU/device-tree marker confirms it" in result["reason"]


def test_parse_nvidia_smi_memory():
    rows = p.parse_nvidia_smi_csv("NVIDIA H100, 81559 MiB\nNVIDIA GB10, [N/A]\n\n")
    assert [(r["memory_total_mib"], r["unified"]) for r in rows] == [(81559, False), (None, True)]


def test_gather_files_reads_device_tree_with_nul_separators(tmp_path):
    base = tmp_path / "sys" / "firmware" / "devicetree" / "base"
    base.mkdir(parents=True)
    (base / "compatible").write_bytes(b"nvidia,p3971\x00nvidia,tegra264\x00")
    files = p.gather_files(str(tmp_path / "sys"), str(tmp_path / "proc"))
    assert files["dt_compatible"] == "nvidia,p3971 nvidia,tegra264"
    assert files["dmi_product"] is None
