"""Platform detection on outputs recorded on a real discrete NVIDIA card (H200, driver 580.159.04).

The fixture files are the unedited outputs of nvidia-smi, lscpu and /proc/meminfo on that machine,
and node_facts.json is the real module's output there (tests/unit/fixtures/platform/README.md).
"""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.diagnose import parse as dp
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import read_meminfo
from ansible_collections.uma.vllm.plugins.module_utils.system import platform as p

H200 = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "platform" / "nvidia-h200-driver-580.159.04"
GIB = 1 << 30
MIB = 1 << 20


def _read(name):
    return (H200 / name).read_text(encoding="utf-8")


@pytest.fixture
def h200_roots(tmp_path):
    """A /sys and /proc with only what the recorded machine had: meminfo, no DMI, no device tree."""
    (tmp_path / "proc").mkdir()
    (tmp_path / "sys").mkdir()
    shutil.copy(H200 / "meminfo.txt", tmp_path / "proc" / "meminfo")
    return str(tmp_path / "sys"), str(tmp_path / "proc")


def test_h200_query_parses_as_one_discrete_gpu():
    gpus = p.parse_nvidia_smi_csv(_read("nvidia-smi-query.csv"))
    assert gpus == [{"name": "NVIDIA H200", "memory_total": "143771 MiB", "memory_total_mib": 143771, "unified": False}]


def test_h200_classified_discrete_with_framebuffer_evidence(h200_roots):
    sysfs, proc = h200_roots
    gpus = p.parse_nvidia_smi_csv(_read("nvidia-smi-query.csv"))
    facts = p.classify(p.gather_files(sysfs, proc), gpus, p.parse_lscpu(_read("lscpu.txt")), None)
    assert facts["unified_memory"] is False
    assert facts["platform"] is None and facts["platform_description"] is None
    assert facts["cpu_hint"] is None
    assert facts["gpu_present"] is True
    assert facts["cpu_model"] == "Intel(R) Xeon(R) Processor"
    assert facts["architecture"] == "x86_64"
    assert facts["reason"] == "no unified-memory marker found"
    assert facts["evidence"] == ["nvidia-smi: GPU 'NVIDIA H200' has its own 143771 MiB framebuffer"]


def test_h200_pure_functions_match_the_real_module_output_there(h200_roots):
    """What the module printed on the H200 equals what the pure functions compute here from its inputs."""
    sysfs, proc = h200_roots
    recorded = json.loads(_read("node_facts.json"))
    assert recorded["changed"] is False
    node = recorded["ansible_facts"]["uma_node"]
    facts = p.classify(
        p.gather_files(sysfs, proc),
        p.parse_nvidia_smi_csv(_read("nvidia-smi-query.csv")),
        p.parse_lscpu(_read("lscpu.txt")),
        None,
    )
    facts["ram_gib"] = round(read_meminfo(proc)["MemTotal"] / 1024**3, 2)
    assert facts == node
    assert node["ram_gib"] == 125.87


def test_h200_extended_query_agrees_with_the_recorded_memory_report():
    """nvidia-smi's framebuffer total includes the driver's reserve; CUDA's total (the OOM message) does not."""
    header, row = _read("nvidia-smi-query-extended.csv").strip().splitlines()
    fields = dict(zip([h.strip() for h in header.split(",")], [v.strip() for v in row.split(",")]))
    assert fields["memory.total [MiB]"] == "143771 MiB"
    assert fields["driver_version"] == "580.159.04" and fields["compute_cap"] == "9.0"
    assert "Reserved                                       : 616 MiB" in _read("nvidia-smi-q-memory.txt")
    oom = dp.parse_journal(_read("torch_oom.txt"))["runs"][0]["ooms"][0]
    assert oom["total_bytes"] == int(139.80 * GIB)
    assert abs(143771 * MIB - oom["total_bytes"]) < 617 * MIB


def test_real_torch_211_oom_message_parses():
    """torch 2.11's message on the H200: sizes, and '0 bytes' reserved-but-unallocated read as 0."""
    run = dp.parse_journal(_read("torch_oom.txt"))["runs"][0]
    (oom,) = run["ooms"]
    assert oom["kind"] == "cuda_oom"
    assert oom["tried_bytes"] == int(174.75 * GIB)
    assert oom["free_bytes"] == int(138.29 * GIB)
    assert oom["allocated_bytes"] == 1024 * MIB
    assert oom["reserved_unallocated_bytes"] == 0


def test_full_card_zero_bytes_free_keeps_the_capacity_figures():
    """The recorded message with the free figure PyTorch prints for a full card ('0 bytes', its format up to 1 KiB)."""
    text = _read("torch_oom.txt").replace("of which 138.29 GiB is free", "of which 0 bytes is free")
    assert "of which 0 bytes is free" in text
    (oom,) = dp.parse_journal(text)["runs"][0]["ooms"]
    assert (oom["total_bytes"], oom["free_bytes"]) == (int(139.80 * GIB), 0)
    assert dp.size_to_bytes("512 bytes") == 512


# ---- an NVIDIA H100 80GB HBM3, same driver (recorded the same way: benchmarks/gpu_capture.sh)
H100 = H200.parent / "nvidia-h100-80gb-hbm3-driver-580.159.04"


def _read_h100(name):
    return (H100 / name).read_text(encoding="utf-8")


def test_h100_pure_functions_match_the_real_module_output_there(tmp_path):
    """The H100 machine: discrete, its framebuffer as evidence; the module's output there recomputed here."""
    (tmp_path / "proc").mkdir()
    (tmp_path / "sys").mkdir()
    shutil.copy(H100 / "meminfo.txt", tmp_path / "proc" / "meminfo")
    sysfs, proc = str(tmp_path / "sys"), str(tmp_path / "proc")
    gpus = p.parse_nvidia_smi_csv(_read_h100("nvidia-smi-query.csv"))
    assert gpus == [
        {"name": "NVIDIA H100 80GB HBM3", "memory_total": "81559 MiB", "memory_total_mib": 81559, "unified": False}
    ]
    facts = p.classify(p.gather_files(sysfs, proc), gpus, p.parse_lscpu(_read_h100("lscpu.txt")), None)
    facts["ram_gib"] = round(read_meminfo(proc)["MemTotal"] / 1024**3, 2)
    node = json.loads(_read_h100("node_facts.json"))["ansible_facts"]["uma_node"]
    assert facts == node
    assert node["unified_memory"] is False and node["platform"] is None
    assert node["evidence"] == ["nvidia-smi: GPU 'NVIDIA H100 80GB HBM3' has its own 81559 MiB framebuffer"]


def test_h100_oom_message_and_the_drivers_reserve():
    """CUDA's total on the H100 (79.18 GiB) is nvidia-smi's 81559 MiB less the driver's reserve."""
    header, row = _read_h100("nvidia-smi-query-extended.csv").strip().splitlines()
    fields = dict(zip([h.strip() for h in header.split(",")], [v.strip() for v in row.split(",")]))
    assert fields["driver_version"] == "580.159.04" and fields["compute_cap"] == "9.0"
    (oom,) = dp.parse_journal(_read_h100("torch_oom.txt"))["runs"][0]["ooms"]
    assert oom["kind"] == "cuda_oom"
    assert oom["total_bytes"] == int(79.18 * GIB)
    assert oom["tried_bytes"] == int(98.97 * GIB)
    assert oom["allocated_bytes"] == 1024 * MIB
    assert 0 < 81559 * MIB - oom["total_bytes"] < 500 * MIB
    assert "Reserved                                       : 480 MiB" in _read_h100("nvidia-smi-q-memory.txt")
