# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How MemAvailable moves with vm.min_free_kbytes and vm.watermark_scale_factor on
this machine's real kernel: prints a table.

For every (watermark_scale_factor, min_free_kbytes) pair it writes the two knobs,
reads /proc/meminfo and /proc/zoneinfo, and compares:
- the drop of MemAvailable against the machine's own values, read right before
  and right after each setting (the mean of both cancels slow drift);
- the kernel's formula recomputed from the same reads (si_mem_available:
  free - totalreserve + page cache and reclaimable slab minus the low watermark);
- the collection's rule (plugins/module_utils/node/base/memavail.py watermark_reserve),
  which only knows MemTotal and the two knobs.
The knobs are restored at the end (also on Ctrl-C or an error). Writes kernel
knobs: hold the lab lock.

    flock /tmp/uma-lab.lock .venv/bin/python benchmarks/memavailable.py [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache", "collections"))

from ansible_collections.uma.vllm.plugins.module_utils.node.base import memavail as _memavail
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import read_meminfo

KNOBS = {
    "min_free_kbytes": "/proc/sys/vm/min_free_kbytes",
    "watermark_scale_factor": "/proc/sys/vm/watermark_scale_factor",
}
MIB = 1 << 20
DEFAULT_MFK = [None, 131072, 262144, 524288, 1048576, 2097152]  # None = the machine's own value
DEFAULT_WSF = [10, 100, 300]


def read_knob(name: str) -> int:
    with open(KNOBS[name], encoding="ascii") as handle:
        return int(handle.read().strip())


def write_knob(name: str, value: int) -> None:
    with open(KNOBS[name], "w", encoding="ascii") as handle:
        handle.write("%d\n" % value)


def sample() -> dict:
    """One read of meminfo and zoneinfo, taken back to back."""
    info = read_meminfo("/proc")
    with open("/proc/zoneinfo", encoding="ascii") as handle:
        zones = _memavail.parse_zoneinfo(handle.read())
    return {"meminfo": info, "zones": zones, "kernel_formula": _memavail.kernel_mem_available(info, zones)}


def settle_and_sample(settle: float) -> dict:
    time.sleep(settle)
    return sample()


def measure(mfk_values, wsf_values, repeat: int, settle: float) -> dict:
    own = {name: read_knob(name) for name in KNOBS}
    rows = []
    try:
        for wsf in wsf_values:
            for mfk in mfk_values:
                value = own["min_free_kbytes"] if mfk is None else mfk
                drops, formula_err, formula_drops = [], [], []
                last = None
                for _round in range(repeat):
                    write_knob("watermark_scale_factor", own["watermark_scale_factor"])
                    write_knob("min_free_kbytes", own["min_free_kbytes"])
                    before = settle_and_sample(settle)
                    write_knob("watermark_scale_factor", wsf)
                    write_knob("min_free_kbytes", value)
                    during = settle_and_sample(settle)
                    write_knob("watermark_scale_factor", own["watermark_scale_factor"])
                    write_knob("min_free_kbytes", own["min_free_kbytes"])
                    after = settle_and_sample(settle)
                    base = (before["meminfo"]["MemAvailable"] + after["meminfo"]["MemAvailable"]) / 2.0
                    drops.append(base - during["meminfo"]["MemAvailable"])
                    base_f = (before["kernel_formula"] + after["kernel_formula"]) / 2.0
                    formula_drops.append(base_f - during["kernel_formula"])
                    formula_err.append(during["kernel_formula"] - during["meminfo"]["MemAvailable"])
                    last = during
                total = last["meminfo"]["MemTotal"]
                own_rule = _memavail.watermark_reserve(total, own["min_free_kbytes"], own["watermark_scale_factor"])
                rule = _memavail.watermark_reserve(total, value, wsf)
                zones = last["zones"]
                info = last["meminfo"]
                rows.append(
                    {
                        "watermark_scale_factor": wsf,
                        "min_free_kbytes": value,
                        "memtotal_bytes": total,
                        "memfree_bytes": info["MemFree"],
                        "page_cache_bytes": info["Active(file)"] + info["Inactive(file)"],
                        "kreclaimable_bytes": info.get("KReclaimable", 0),
                        "zone_low_bytes": sum(z["low"] for z in zones.values()) * 4096,
                        "zone_high_bytes": sum(z["high"] for z in zones.values()) * 4096,
                        "measured_drop_bytes": statistics.median(drops),
                        "measured_drop_spread_bytes": max(drops) - min(drops),
                        "kernel_formula_drop_bytes": statistics.median(formula_drops),
                        "kernel_formula_error_bytes": statistics.median(formula_err),
                        "rule_drop_bytes": rule["reserve_bytes"] - own_rule["reserve_bytes"],
                        "rule_reserve_bytes": rule["reserve_bytes"],
                    }
                )
    finally:
        write_knob("watermark_scale_factor", own["watermark_scale_factor"])
        write_knob("min_free_kbytes", own["min_free_kbytes"])
    restored = {name: read_knob(name) for name in KNOBS}
    return {"own": own, "restored": restored, "rows": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--settle", type=float, default=0.3, help="seconds after each write before reading")
    parser.add_argument("--min-free-kbytes", type=int, nargs="*", help="values (default: own, 128 MiB .. 2 GiB)")
    parser.add_argument("--scale-factors", type=int, nargs="*", default=DEFAULT_WSF)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("memavailable.py writes /proc/sys/vm: run as root, holding the lab lock")
    mfk_values = args.min_free_kbytes or DEFAULT_MFK
    info = read_meminfo("/proc")
    for mfk in mfk_values:
        for wsf in args.scale_factors:
            high = _memavail.watermarks(info["MemTotal"], mfk or 0, wsf)["high"]
            if high > info["MemFree"] // 2:
                sys.exit(
                    "min_free_kbytes %s with watermark_scale_factor %d puts the high watermark (%d MiB) above half "
                    "of MemFree (%d MiB): kswapd would reclaim; refused"
                    % (mfk, wsf, high // MIB, info["MemFree"] // MIB)
                )
    result = measure(mfk_values, args.scale_factors, args.repeat, args.settle)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        "machine: MemTotal %.2f GiB, own min_free_kbytes %d, watermark_scale_factor %d; restored: %s"
        % (
            result["rows"][0]["memtotal_bytes"] / float(1 << 30),
            result["own"]["min_free_kbytes"],
            result["own"]["watermark_scale_factor"],
            result["restored"],
        )
    )
    print(
        "| wsf | min_free_kbytes | MemAvailable drop (MiB, median) | spread | kernel formula drop "
        "| formula - MemAvailable | rule drop | drop / raise | rule / measured |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in result["rows"]:
        drop = row["measured_drop_bytes"]
        delta_mfk = (row["min_free_kbytes"] - result["own"]["min_free_kbytes"]) * 1024
        print(
            "| %d | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %s | %s |"
            % (
                row["watermark_scale_factor"],
                row["min_free_kbytes"],
                drop / MIB,
                row["measured_drop_spread_bytes"] / MIB,
                row["kernel_formula_drop_bytes"] / MIB,
                row["kernel_formula_error_bytes"] / MIB,
                row["rule_drop_bytes"] / MIB,
                "%.2f" % (drop / delta_mfk) if delta_mfk > 0 else "-",
                "%.2f" % (row["rule_drop_bytes"] / drop) if drop > 16 * MIB else "-",
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
