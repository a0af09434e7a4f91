# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Is this node a unified-memory machine? Markers and their classification.

Markers, strongest first:
- ``nvidia-smi`` GPU names: ``NVIDIA GB10`` (DGX Spark), ``GH200`` / ``GB200``
  (Grace superchips), ``Thor`` (Jetson Thor); a GPU whose framebuffer total is
  not reported (``[N/A]`` / ``Not Supported``) shares system memory.
- Device tree ``compatible``/``model``: ``nvidia,tegra264`` / ``Jetson AGX Thor``
  (Jetson boards have no discrete framebuffer at all).
- DMI product name: ``DGX Spark``.
- ``lscpu`` CPU cores: ``Cortex-X925``/``Cortex-A725`` (GB10), ``Neoverse-V2``
  (Grace), ``Neoverse-V3AE`` (Thor): a hint only, never decisive on its own.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional

PLATFORMS = {
    "gb10": "NVIDIA GB10 (DGX Spark class), unified LPDDR5X",
    "gh200": "NVIDIA Grace Hopper GH200, coherent CPU/GPU memory (NVLink-C2C, ATS)",
    "gb200": "NVIDIA Grace Blackwell GB200, coherent CPU/GPU memory (NVLink-C2C, ATS)",
    "thor": "NVIDIA Jetson Thor (Tegra264), unified memory",
    "tegra": "NVIDIA Jetson (Tegra), unified memory",
}

_GPU_PATTERNS = [
    (re.compile(r"\bGB10\b", re.I), "gb10"),
    (re.compile(r"\bGH200\b", re.I), "gh200"),
    (re.compile(r"\bGB200\b", re.I), "gb200"),
    (re.compile(r"\bThor\b", re.I), "thor"),
    (re.compile(r"\b(Orin|Xavier)\b", re.I), "tegra"),
]
_DT_PATTERNS = [
    (re.compile(r"nvidia,tegra264|jetson[- _]agx[- _]thor|\bthor\b", re.I), "thor"),
    (re.compile(r"nvidia,tegra(234|194|186)|jetson", re.I), "tegra"),
    (re.compile(r"\bgb10\b|dgx[- _]spark", re.I), "gb10"),
]
_DMI_PATTERNS = [
    (re.compile(r"dgx[- _]spark|\bgb10\b", re.I), "gb10"),
    (re.compile(r"gh200|grace[- _]hopper", re.I), "gh200"),
]
_CPU_HINTS = [
    (re.compile(r"Cortex-X925|Cortex-A725", re.I), "gb10"),
    (re.compile(r"Neoverse-V3AE", re.I), "thor"),
    (re.compile(r"Neoverse-V2", re.I), "gh200"),
]
_NA = re.compile(r"^\s*(\[N/A\]|N/A|Not Supported|\[Not Supported\])\s*$", re.I)


def parse_nvidia_smi_csv(text: str) -> List[Dict[str, Any]]:
    """Rows of ``nvidia-smi --query-gpu=name,memory.total --format=csv,noheader``."""
    gpus = []
    for line in (text or "").splitlines():
        if not line.strip():
            continue
        name, _unused, memory = line.partition(",")
        memory = memory.strip()
        mib: Optional[int] = None
        match = re.match(r"^(\d+)\s*MiB$", memory)
        if match:
            mib = int(match.group(1))
        gpus.append(
            {"name": name.strip(), "memory_total": memory, "memory_total_mib": mib, "unified": bool(_NA.match(memory))}
        )
    return gpus


def parse_lscpu(text: str) -> Dict[str, str]:
    result = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition(":")
        if sep:
            result.setdefault(key.strip(), value.strip())
    return result


def read_first(paths: List[str]) -> Optional[str]:
    for path in paths:
        try:
            with open(path, "rb") as handle:
                return handle.read().replace(b"\x00", b" ").decode("utf-8", "replace").strip()
        except (OSError, ValueError):
            continue
    return None


def gather_files(sysfs_root: str = "/sys", proc_root: str = "/proc") -> Dict[str, Optional[str]]:
    """Device-tree and DMI strings from the node's own files."""
    dt_bases = [os.path.join(proc_root, "device-tree"), os.path.join(sysfs_root, "firmware", "devicetree", "base")]
    return {
        "dt_compatible": read_first([os.path.join(b, "compatible") for b in dt_bases]),
        "dt_model": read_first([os.path.join(b, "model") for b in dt_bases]),
        "dmi_product": read_first([os.path.join(sysfs_root, "class", "dmi", "id", "product_name")]),
        "tegra_release": read_first(["/etc/nv_tegra_release"]) if proc_root == "/proc" else None,
    }


def classify(
    files: Dict[str, Optional[str]],
    gpus: List[Dict[str, Any]],
    lscpu: Dict[str, str],
    nvidia_smi_error: Optional[str] = None,
) -> Dict[str, Any]:
    """Decide from the markers; every conclusion carries its evidence."""
    evidence: List[str] = []
    strong: List[str] = []
    for gpu in gpus:
        for pattern, platform in _GPU_PATTERNS:
            if pattern.search(gpu["name"]):
                strong.append(platform)
                evidence.append("nvidia-smi: GPU %r is a %s" % (gpu["name"], PLATFORMS[platform]))
                break
        else:
            if not gpu["unified"]:
                evidence.append("nvidia-smi: GPU %r has its own %s framebuffer" % (gpu["name"], gpu["memory_total"]))
        if gpu["unified"]:
            strong.append(strong[-1] if strong else "unknown")
            evidence.append(
                "nvidia-smi: GPU %r reports no framebuffer size (%s): it uses system memory"
                % (gpu["name"], gpu["memory_total"])
            )
    for key in ("dt_compatible", "dt_model"):
        value = files.get(key)
        if value:
            for pattern, platform in _DT_PATTERNS:
                if pattern.search(value):
                    strong.append(platform)
                    evidence.append("device tree %s: %r" % (key[3:], value))
                    break
    if files.get("tegra_release"):
        strong.append("tegra")
        evidence.append("/etc/nv_tegra_release: %r" % files["tegra_release"].splitlines()[0])
    dmi = files.get("dmi_product")
    if dmi:
        for pattern, platform in _DMI_PATTERNS:
            if pattern.search(dmi):
                strong.append(platform)
                evidence.append("DMI product name: %r" % dmi)
                break
    hint = None
    model = lscpu.get("Model name", "")
    for pattern, platform in _CPU_HINTS:
        if pattern.search(model):
            hint = platform
            evidence.append("lscpu: CPU %r is typical of %s (hint only)" % (model, PLATFORMS[platform]))
            break
    known = [p for p in strong if p != "unknown"]
    platform = known[0] if known else ("unknown" if strong else None)
    unified = bool(strong)
    if not gpus:
        evidence.append("nvidia-smi: no NVIDIA GPU listed (%s)" % (nvidia_smi_error or "none found"))
    if not unified:
        reason = "no unified-memory marker found"
        if hint:
            reason += "; the CPU suggests %s but no GPU/device-tree marker confirms it" % hint
    else:
        reason = "unified-memory markers: %s" % ", ".join(sorted(set(strong)))
    return {
        "unified_memory": unified,
        "platform": platform,
        "platform_description": PLATFORMS.get(platform or "", None),
        "cpu_hint": hint,
        "gpus": gpus,
        "gpu_present": bool(gpus),
        "cpu_model": model or None,
        "architecture": lscpu.get("Architecture"),
        "reason": reason,
        "evidence": evidence,
    }
