# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What ``MemAvailable`` a node will show at an engine's start: the one rule that
``uma_sysctl`` (sizing the reserve) and ``vllm_flags`` (sizing the startup request)
share.

The kernel's own formula (mm/show_mem.c ``si_mem_available``, Linux 6.x; before 6.1 in
mm/page_alloc.c)::

    wmark_low  = sum over zones of low_wmark_pages(zone)
    available  = NR_FREE_PAGES - totalreserve_pages
    pagecache  = Active(file) + Inactive(file);  available += pagecache - min(pagecache / 2, wmark_low)
    reclaimable = SReclaimable + KReclaimable-misc; available += reclaimable - min(reclaimable / 2, wmark_low)

``totalreserve_pages`` (mm/page_alloc.c ``calculate_totalreserve_pages``) is, per zone,
``min(high_wmark + max(lowmem_reserve[]), managed)``. The watermarks
(``__setup_per_zone_wmarks``): ``min`` is ``vm.min_free_kbytes`` split over the zones by
managed pages; ``low = min + max(min / 4, managed * watermark_scale_factor / 10000)``,
``high = min + 2 * that``. ``lowmem_reserve`` (``setup_per_zone_lowmem_reserve``) keeps
the managed pages of the higher zones / ``lowmem_reserve_ratio`` (256) in each lower
zone.

So compared with a node whose watermarks were zero, MemAvailable is lower by
``high + lowmem_reserve`` (always: the *floor*) plus up to ``low`` twice (page cache and
reclaimable slab, each once it exceeds twice the low watermark). The planning rule
takes all of it: ``reserve = high + 2 * low + total / 256`` — with the default scale
factor and a raised ``min_free_kbytes`` m that is ``1.5 m + 2.5 m = 4 m`` plus 0.4% of
RAM; on the lab's kernel it never fell below the measured drop (evidence:
docs/PLANNER-EVIDENCE.md, section 'MemAvailable at start: the rule against the lab's kernel').
A reserve below the floor can never pass vLLM's startup check and is refused; one
between the floor and the rule is accepted with a warning (it works only while the
page cache and slab are small).

Pure stdlib; imports under Python 3.8.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional

from .common import UmaError

GIB = 1 << 30
MIB = 1 << 20
KIB = 1 << 10

# The sizing rule for vm.min_free_kbytes (uma.vllm.uma_sysctl sizes the reserve with it, the watchdog
# its critical floor; see SIZING_DOC).
SIZING_RULE = "uma-3pct-v1"
SIZING_PERCENT = 3
SIZING_FLOOR_BYTES = 256 * MIB
SIZING_CEILING_BYTES = 8 * GIB
SIZING_STEP_BYTES = 64 * MIB
MAX_RESERVE_PERCENT = 10
SIZING_DOC = (
    "3% of RAM rounded down to a multiple of 64 MiB, raised to at least the larger of 256 MiB and the "
    "kernel's own default, cut to at most the smaller of 8 GiB and 10% of RAM less 64 MiB (the cut wins)"
)

RULE = "si_mem_available-v1"
DEFAULT_WATERMARK_SCALE_FACTOR = 10  # mm/page_alloc.c watermark_scale_factor
LOWMEM_RESERVE_RATIO = 256  # vm.lowmem_reserve_ratio for ZONE_DMA32 / ZONE_NORMAL
# What the node's OS, services and the engine's own runtime outside torch's allocator
# (CUDA context, Python, libraries) hold before the engine's startup check, when the
# inventory does not say (uma_node_baseline_gib / node_baseline_gib). An assumption
# (evidence: docs/PLANNER-EVIDENCE.md, section 'MemAvailable at start: the rule against the
# lab's kernel'). The launcher's admission check compares the plan with the live MemAvailable,
# so an under-estimate is caught before the weights load.
DEFAULT_BASELINE_BYTES = 3 * GIB
RULE_DOC = (
    "MemAvailable at start = total - node baseline - watermark reserve (high + 2 x low watermark + "
    "total/256 lowmem reserve, from vm.min_free_kbytes and vm.watermark_scale_factor; "
    "kernel si_mem_available) - memory other engines on the node hold"
)


def watermarks(
    total_bytes: int, min_free_kbytes: int, scale_factor: int = DEFAULT_WATERMARK_SCALE_FACTOR
) -> Dict[str, int]:
    """The node's min/low/high watermarks summed over its zones, in bytes
    (__setup_per_zone_wmarks with all memory managed)."""
    minimum = int(min_free_kbytes) * KIB
    gap = max(minimum // 4, total_bytes * int(scale_factor) // 10000)
    return {"min": minimum, "low": minimum + gap, "high": minimum + 2 * gap}


def watermark_reserve(
    total_bytes: int, min_free_kbytes: int, scale_factor: int = DEFAULT_WATERMARK_SCALE_FACTOR
) -> Dict[str, Any]:
    """How much lower MemAvailable is than free + reclaimable memory because of the
    watermarks: totalreserve_pages (high + lowmem_reserve) + the low watermark twice."""
    marks = watermarks(total_bytes, min_free_kbytes, scale_factor)
    lowmem = total_bytes // LOWMEM_RESERVE_RATIO
    reserve = marks["high"] + 2 * marks["low"] + lowmem
    # totalreserve_pages alone: subtracted whatever the page cache and slab hold
    floor = marks["high"] + lowmem
    return {
        "rule": RULE,
        "min_free_kbytes": int(min_free_kbytes),
        "watermark_scale_factor": int(scale_factor),
        "min_bytes": marks["min"],
        "low_bytes": marks["low"],
        "high_bytes": marks["high"],
        "lowmem_reserve_bytes": lowmem,
        "reserve_bytes": reserve,
        "floor_bytes": floor,
    }


def node_min_free_kbytes(total_bytes: int, min_free_kbytes: Optional[int] = None) -> Dict[str, Any]:
    """The node's vm.min_free_kbytes: the given one, else what uma_sysctl sizes for this
    RAM (the node_prep role applies that when the inventory sets none)."""
    if min_free_kbytes is not None:
        return {"min_free_kbytes": int(min_free_kbytes), "source": "given"}
    sizing = size_min_free_kbytes(total_bytes)
    return {"min_free_kbytes": sizing["min_free_kbytes"], "source": "uma_sysctl rule %s" % sizing["rule"]}


def expected_available(
    total_bytes: int,
    min_free_kbytes: Optional[int] = None,
    scale_factor: Optional[int] = None,
    baseline_bytes: Optional[int] = None,
    other_engines_bytes: int = 0,
) -> Dict[str, Any]:
    """Expected MemAvailable when an engine starts: total - baseline - watermark
    reserve - other engines. Returns every term and where it came from."""
    if total_bytes <= 0:
        raise UmaError("total_memory_gib", total_bytes, "must be > 0", "Give the node's RAM in GiB.")
    mfk = node_min_free_kbytes(total_bytes, min_free_kbytes)
    wsf = DEFAULT_WATERMARK_SCALE_FACTOR if scale_factor is None else int(scale_factor)
    if not 1 <= wsf <= 3000:
        raise UmaError(
            "watermark_scale_factor", scale_factor, "is outside the kernel's range 1..3000", "Give the node's value."
        )
    marks = watermark_reserve(total_bytes, mfk["min_free_kbytes"], wsf)
    baseline = DEFAULT_BASELINE_BYTES if baseline_bytes is None else int(baseline_bytes)
    available = total_bytes - baseline - marks["reserve_bytes"] - int(other_engines_bytes)
    # certain: the kernel's totalreserve_pages, other engines and a baseline the caller gave
    # (the default baseline is an assumption and never the reason for a refusal)
    at_most = total_bytes - (baseline if baseline_bytes is not None else 0) - marks["floor_bytes"]
    at_most -= int(other_engines_bytes)
    return {
        "rule": RULE,
        "description": RULE_DOC,
        "total_bytes": total_bytes,
        "baseline_bytes": baseline,
        "baseline_source": "default" if baseline_bytes is None else "given",
        "min_free_kbytes": mfk["min_free_kbytes"],
        "min_free_kbytes_source": mfk["source"],
        "watermark_scale_factor": wsf,
        "watermark_reserve_bytes": marks["reserve_bytes"],
        "watermarks": marks,
        "other_engines_bytes": int(other_engines_bytes),
        "available_bytes": available,
        "available_at_most_bytes": at_most,
    }


def kernel_mem_available(meminfo: Dict[str, int], zones: Dict[str, Dict[str, int]], page_size: int = 4096) -> int:
    """si_mem_available() recomputed from /proc/meminfo (bytes) and /proc/zoneinfo (pages):
    checks that the kernel formula above is the one the running kernel uses."""
    wmark_low = sum(z["low"] for z in zones.values()) * page_size
    totalreserve = 0
    for z in zones.values():
        totalreserve += min(z["high"] + max(z.get("protection", [0]) or [0]), z["managed"])
    available = meminfo["MemFree"] - totalreserve * page_size
    pagecache = meminfo["Active(file)"] + meminfo["Inactive(file)"]
    available += pagecache - min(pagecache // 2, wmark_low)
    reclaimable = meminfo.get("KReclaimable", meminfo.get("SReclaimable", 0))
    available += reclaimable - min(reclaimable // 2, wmark_low)
    return max(available, 0)


def parse_zoneinfo(text: str) -> Dict[str, Dict[str, Any]]:
    """min/low/high/managed (pages) and protection of every zone in /proc/zoneinfo."""
    zones: Dict[str, Dict[str, Any]] = {}
    current: Optional[Dict[str, Any]] = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("Node ") and ", zone" in line:
            name = line.replace(",", "").split()
            current = {"min": 0, "low": 0, "high": 0, "managed": 0, "protection": [0]}
            zones["%s/%s" % (name[1], name[3])] = current
            continue
        if current is None:
            continue
        words = line.split()
        if len(words) == 2 and words[0] in ("min", "low", "high", "managed") and words[1].isdigit():
            current[words[0]] = int(words[1])
        elif line.startswith("protection:"):
            inner = line.split("(", 1)[-1].rstrip(")")
            current["protection"] = [int(x) for x in inner.replace(",", " ").split()] or [0]
    return zones


def kernel_default_min_free_kbytes(ram_bytes: int) -> int:
    """What the kernel picks at boot: 4 * sqrt(lowmem in kB), within [128, 262144].

    (mm/page_alloc.c calculate_min_free_kbytes(); on 64-bit all memory is
    lowmem. Transparent hugepages may raise the live value above this.)
    """
    lowmem_kb = ram_bytes // 1024
    value = int(math.sqrt(lowmem_kb * 16))
    return max(128, min(value, 262144))


def size_min_free_kbytes(ram_bytes: int) -> Dict[str, Any]:
    """Size the page reserve from RAM. Returns the value and how it was made."""
    kernel_default = kernel_default_min_free_kbytes(ram_bytes)
    raw = ram_bytes * SIZING_PERCENT // 100
    stepped = (raw // SIZING_STEP_BYTES) * SIZING_STEP_BYTES
    floor = max(SIZING_FLOOR_BYTES, kernel_default * 1024)
    ceiling = min(SIZING_CEILING_BYTES, ram_bytes * MAX_RESERVE_PERCENT // 100 - SIZING_STEP_BYTES)
    bounded = max(min(stepped, ceiling), min(floor, ceiling))
    return {
        "rule": SIZING_RULE,
        "description": SIZING_DOC,
        "ram_bytes": ram_bytes,
        "ram_gib": round(ram_bytes / GIB, 2),
        "percent": SIZING_PERCENT,
        "raw_kbytes": raw // 1024,
        "floor_kbytes": floor // 1024,
        "ceiling_kbytes": ceiling // 1024,
        "kernel_default_kbytes": kernel_default,
        "min_free_kbytes": bounded // 1024,
        # what this value takes out of MemAvailable (the rule vllm_flags plans with)
        "memavailable_reserve_bytes": memavailable_cost(ram_bytes, bounded // 1024),
    }


def memavailable_cost(ram_bytes: int, min_free_kbytes: int) -> int:
    """Bytes a node of ``ram_bytes`` loses from MemAvailable with this min_free_kbytes
    (watermark_reserve below, kernel si_mem_available; default watermark_scale_factor)."""
    return watermark_reserve(ram_bytes, min_free_kbytes)["reserve_bytes"]
