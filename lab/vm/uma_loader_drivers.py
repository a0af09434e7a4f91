# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The "device memory" of uma_loader.py (a STAND-IN for vLLM on a GB10 rank), behind a small
interface: ``alloc(size) -> (handle, page size, mmap offset)``, ``map(offset, size)``,
``counters()``, ``close()``.

FakeGB10Driver is /dev/fakegb10 (lab/vm/fakegb10: a stand-in kernel module for NVIDIA's GB10
driver). PlainFileDriver is for tests on machines without the module: a plain file, mmapped,
nothing pinned. Stdlib only; copied into the VM guest beside uma_loader.py.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import struct
from typing import Any, Dict, Tuple

# fakegb10 (lab/vm/fakegb10/fakegb10_uapi.h)
DEV = "/dev/fakegb10"
SYSFS = "/sys/class/misc/fakegb10"
ALLOC_FMT = "=QIIQQ"  # u64 size; u32 flags; u32 handle; u64 page_size; u64 mmap_offset
IOC_ALLOC = (3 << 30) | (struct.calcsize(ALLOC_FMT) << 16) | (ord("G") << 8) | 1
COUNTERS = ("allocs_2m", "allocs_64k", "allocs_4k", "fallbacks_2m_to_64k", "fallbacks_64k_to_4k", "failures")


class OptionError(Exception):
    """A bad option: names the option, the value and the fix."""


class FakeGB10Driver:
    """fakegb10's /dev/fakegb10: ioctl alloc, mmap to copy bytes in; closing frees everything."""

    name = "fakegb10"

    def __init__(self, dev: str = DEV, sysfs: str = SYSFS) -> None:
        self.sysfs = sysfs
        try:
            self.fd = os.open(dev, os.O_RDWR)
        except OSError as exc:
            raise OptionError(
                "--driver fakegb10: %s cannot be opened (%s); load the module (lab/vm.sh module, insmod "
                "fakegb10.ko) or use --driver file:PATH" % (dev, exc.strerror)
            ) from None

    def alloc(self, size: int) -> Tuple[int, int, int]:
        """(handle, page size, mmap offset); OSError(ENOMEM) = NV_ERR_NO_MEMORY."""
        buf = bytearray(struct.pack(ALLOC_FMT, size, 0, 0, 0, 0))
        fcntl.ioctl(self.fd, IOC_ALLOC, buf, True)
        _size, _flags, handle, page_size, offset = struct.unpack(ALLOC_FMT, bytes(buf))
        return handle, page_size, offset

    def map(self, offset: int, size: int) -> mmap.mmap:
        return mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=offset)

    def counters(self) -> Dict[str, int]:
        out = {}
        for name in COUNTERS:
            try:
                with open(os.path.join(self.sysfs, name), encoding="ascii") as fh:
                    out[name] = int(fh.read())
            except (OSError, ValueError):
                pass
        return out

    def close(self) -> None:
        os.close(self.fd)


class PlainFileDriver:
    """For tests where fakegb10 cannot exist: "device memory" is a plain file, mmapped.
    Nothing is pinned; page size is reported as 4K; there are no counters."""

    name = "file"

    def __init__(self, path: str, limit: int = 0) -> None:
        self.limit = limit  # bytes; 0 = none (a test can make an allocation fail)
        self.end = 0
        try:
            self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError as exc:
            raise OptionError("--driver file:%s cannot be created (%s)" % (path, exc.strerror)) from None

    def alloc(self, size: int) -> Tuple[int, int, int]:
        if self.limit and self.end + size > self.limit:
            raise OSError(errno.ENOMEM, os.strerror(errno.ENOMEM))
        offset = self.end
        self.end += -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
        os.ftruncate(self.fd, self.end)
        return offset // mmap.PAGESIZE + 1, 4096, offset

    def map(self, offset: int, size: int) -> mmap.mmap:
        return mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=offset)

    def counters(self) -> Dict[str, int]:
        return {}

    def close(self) -> None:
        os.close(self.fd)


class CudaSegment:
    """One CUDA allocation (a torch uint8 tensor) written like an mmap: ``write_at(pos, bytes)``."""

    def __init__(self, torch: Any, tensor: Any) -> None:
        self.torch = torch
        self.tensor = tensor

    def write_at(self, pos: int, src: Any) -> None:
        n = len(src)
        host = self.torch.frombuffer(bytearray(src), dtype=self.torch.uint8)  # the mmap is read-only
        self.tensor[pos : pos + n].copy_(host)


class CudaDriver:
    """A REAL discrete GPU through PyTorch's CUDA caching allocator (for the lent GPU machine, not
    the VM): each ``alloc`` is one ``torch.empty(size, uint8, device="cuda")``; an allocation the
    card cannot hold raises torch's own OutOfMemoryError text (``.torch_message``). The process's
    CUDA context is created here, before the startup check, as in vLLM's worker."""

    name = "cuda"
    discrete = True

    def __init__(self) -> None:
        try:
            import torch  # pylint: disable=import-outside-toplevel
        except ImportError as exc:
            raise OptionError("--driver cuda needs PyTorch with CUDA (%s); use fakegb10 in the VM" % exc) from None
        if not torch.cuda.is_available():
            raise OptionError("--driver cuda: torch.cuda.is_available() is False; use fakegb10 in the VM")
        self.torch = torch
        torch.cuda.set_device(0)
        torch.zeros(1, device="cuda")  # the CUDA context
        self.tensors: list = []
        self.allocs = 0
        self.failures = 0

    def mem_get_info(self) -> Tuple[int, int]:
        """(free, total) as vLLM's MemorySnapshot reads them on a discrete GPU."""
        self.torch.cuda.empty_cache()
        free, total = self.torch.cuda.mem_get_info()
        return int(free), int(total)

    def alloc(self, size: int) -> Tuple[int, int, int]:
        try:
            tensor = self.torch.empty(size, dtype=self.torch.uint8, device="cuda")
        except self.torch.OutOfMemoryError as exc:
            self.failures += 1
            err = OSError(errno.ENOMEM, "CUDA out of memory")
            err.torch_message = "torch.OutOfMemoryError: " + str(exc).splitlines()[0]  # type: ignore[attr-defined]
            raise err from None
        self.allocs += 1
        self.tensors.append(tensor)
        return len(self.tensors), 2 << 20, len(self.tensors) - 1

    def map(self, offset: int, size: int) -> CudaSegment:
        return CudaSegment(self.torch, self.tensors[offset])

    def counters(self) -> Dict[str, int]:
        return {"cuda_allocs": self.allocs, "cuda_oom": self.failures}

    def close(self) -> None:
        self.tensors = []
        self.torch.cuda.empty_cache()
