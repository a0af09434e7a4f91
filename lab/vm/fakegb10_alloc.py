# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Allocate "device memory" from fakegb10 (a STAND-IN for the NVIDIA GB10 driver) until it fails.

Runs inside the VM lab node (stdlib only, ``python3 fakegb10_alloc.py``):

  python3 fakegb10_alloc.py --chunk-mib 256            # allocate until NV_ERR_NO_MEMORY
  python3 fakegb10_alloc.py --chunk-mib 64 --touch     # and copy bytes in through mmap
  python3 fakegb10_alloc.py --chunk-mib 256 --total-mib 1800 --hold 30

Prints one line per allocation (size, page size it got, seconds), then the
module's counters from /sys/class/misc/fakegb10/ and free order-9 blocks from
/proc/buddyinfo. Everything is freed when the program exits (the device file
closes), as a real rank's allocations are when its process dies.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import mmap
import os
import struct
import sys
import time

DEV = "/dev/fakegb10"
SYSFS = "/sys/class/misc/fakegb10"
# struct fakegb10_alloc { u64 size; u32 flags; u32 handle; u64 page_size; u64 mmap_offset; }
ALLOC_FMT = "=QIIQQ"
ALLOC_SIZE = struct.calcsize(ALLOC_FMT)
IOC_ALLOC = (3 << 30) | (ALLOC_SIZE << 16) | (ord("G") << 8) | 1  # _IOWR('G', 1, ...)
FLAG_NO_ZERO = 0x1
PAGE_NAMES = {0x200000: "2M", 0x10000: "64K", 0x1000: "4K"}
COUNTERS = (
    "allocs_2m",
    "allocs_64k",
    "allocs_4k",
    "fallbacks_2m_to_64k",
    "fallbacks_64k_to_4k",
    "failures",
    "page_failures_2m",
    "page_failures_64k",
    "page_failures_4k",
    "bytes_in_use",
)


def counters() -> dict:
    out = {}
    for name in COUNTERS:
        with open(os.path.join(SYSFS, name), encoding="ascii") as fh:
            out[name] = int(fh.read())
    return out


def free_order9() -> int:
    total = 0
    with open("/proc/buddyinfo", encoding="ascii") as fh:
        for line in fh:
            fields = line.split()
            # "Node 0, zone Normal c0 c1 ... c10": order 9 is the 10th count
            if len(fields) >= 15:
                total += int(fields[4 + 9])
    return total


def alloc(fd: int, size: int, flags: int) -> tuple:
    buf = bytearray(struct.pack(ALLOC_FMT, size, flags, 0, 0, 0))
    fcntl.ioctl(fd, IOC_ALLOC, buf, True)
    _size, _flags, handle, page_size, offset = struct.unpack(ALLOC_FMT, bytes(buf))
    return handle, page_size, offset


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunk-mib", type=int, default=256, help="size of each allocation (MiB)")
    parser.add_argument("--total-mib", type=int, default=0, help="stop after this much (0: until failure)")
    parser.add_argument("--touch", action="store_true", help="mmap each allocation and write into it")
    parser.add_argument("--no-zero", action="store_true", help="allocate without __GFP_ZERO")
    parser.add_argument("--hold", type=float, default=0.0, help="seconds to hold the memory before exiting")
    args = parser.parse_args(argv)
    if args.chunk_mib < 1:
        parser.error(f"--chunk-mib must be >= 1, got {args.chunk_mib}")
    size = args.chunk_mib << 20
    flags = FLAG_NO_ZERO if args.no_zero else 0
    fd = os.open(DEV, os.O_RDWR)
    before = counters()
    print(f"start: free order-9 blocks {free_order9()}, counters {before}", flush=True)
    total = 0
    maps = []
    status = 0
    while not args.total_mib or total < args.total_mib << 20:
        t0 = time.monotonic()
        try:
            handle, page_size, offset = alloc(fd, size, flags)
        except OSError as exc:
            if exc.errno != errno.ENOMEM:
                raise
            print(f"alloc {len(maps) + 1}: {args.chunk_mib} MiB FAILED (ENOMEM) after {time.monotonic() - t0:.2f}s")
            status = 1
            break
        if args.touch:
            m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=offset)
            block = b"\x5a" * (1 << 20)
            for pos in range(0, size, len(block)):
                m[pos : pos + len(block)] = block
            maps.append(m)
        else:
            maps.append(handle)
        total += size
        name = PAGE_NAMES.get(page_size, hex(page_size))
        print(
            f"alloc {len(maps)}: {args.chunk_mib} MiB handle {handle} pages {name} "
            f"in {time.monotonic() - t0:.2f}s (total {total >> 20} MiB, free order-9 {free_order9()})",
            flush=True,
        )
    after = counters()
    delta = {k: after[k] - before[k] for k in COUNTERS if k != "bytes_in_use"}
    print(f"end: {total >> 20} MiB in {len(maps)} allocations; counter deltas {delta}")
    print(f"bytes_in_use {after['bytes_in_use']}")
    if args.hold:
        time.sleep(args.hold)
    return status


if __name__ == "__main__":
    sys.exit(main())
