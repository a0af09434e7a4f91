# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""uma_loader: a STAND-IN for vLLM on one GB10 (DGX Spark) rank, for the VM lab node.

There is no GPU, no torch and no model here. It does, in order, the memory work that
vLLM 0.32 (``vllm/v1/worker/gpu_worker.py``) does on a unified-memory rank:

 1. init_device: the startup check of ``request_memory`` (``vllm/v1/worker/utils.py``):
    requested = ceil(total * --gpu-memory-utilization) must be <= free memory, where on an
    integrated GPU free memory is psutil's available memory, i.e. MemAvailable
    (``MemorySnapshot.measure``, ``vllm/utils/mem_utils.py``). vLLM checks this BEFORE the
    weights are loaded; so does this program;
 2. model init: this rank's part of every tensor is allocated in "device memory" up front
    (vLLM builds the model's parameters on the device before it reads the checkpoint),
    grouped into segments as PyTorch's CUDA caching allocator does (requests <= 1 MiB share
    2 MiB segments, up to 10 MiB share 20 MiB segments, larger ones get their own segment
    rounded up to 2 MiB); each segment is one driver allocation;
 3. load weights: per shard, ``safe_open``-like (the file is mmapped, the safetensors
    header parsed here: 8-byte little-endian length + JSON), this rank's slice of each
    tensor copied into the driver memory through its mmap;
 4. the KV cache: one driver allocation of --kv-cache-memory-bytes;
 5. an HTTP server: /health, /v1/models, /v1/completions (a fixed-shape answer), /metrics.

"Device memory" comes from fakegb10 (lab/vm/fakegb10: a stand-in kernel module that
allocates system memory the way NVIDIA's GB10 driver does), or, for tests on a machine
without the module, from a plain file (--driver file:PATH; nothing is pinned).
Its log lines have vLLM's shapes (the planner, the launcher and oom_diagnose read them).
Stdlib only: it runs as ``python3 uma_loader.py`` in the VM guest.

  python3 uma_loader.py /srv/model --tensor-parallel-size 2 --rank 0 \\
      --gpu-memory-utilization 0.8 --kv-cache-memory-bytes 256M --port 8000
"""

from __future__ import annotations

import argparse
import errno
import json
import math
import mmap
import os
import re
import signal
import struct
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling, also when a test imports this file
from uma_loader_drivers import CudaDriver, FakeGB10Driver, OptionError, PlainFileDriver

PROG = "uma_loader"
STAND_IN = (
    "uma_loader: a STAND-IN for vLLM on a GB10 (DGX Spark) rank (no GPU, no torch, no model: "
    "it allocates, loads and pins memory the way vLLM 0.32 does, through the fakegb10 stand-in driver)"
)
GIB = 1 << 30
MIB = 1 << 20
DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
MAX_HEADER = 100 * MIB  # safetensors refuses larger headers too
# PyTorch's CUDACachingAllocator (c10/cuda/CUDACachingAllocator.cpp)
K_SMALL_SIZE = 1 * MIB
K_SMALL_BUFFER = 2 * MIB
K_MIN_LARGE_ALLOC = 10 * MIB
K_LARGE_BUFFER = 20 * MIB
K_ROUND_LARGE = 2 * MIB
K_MIN_BLOCK = 512
ROW_PARALLEL = ("o_proj.weight", "down_proj.weight", "out_proj.weight", "dense.weight", "dense_4h_to_h.weight")
BLOCK_SIZE = 16  # vLLM's default KV block size (tokens)


class LoaderError(Exception):
    """A failure vLLM would raise (the message has vLLM's shape)."""


# ---------------------------------------------------------------------------
# safetensors


def read_header(fh: Any, file_size: int, name: str) -> Tuple[int, Dict[str, Dict[str, Any]]]:
    """(data start, {tensor name: {dtype, shape, start, end}}) of one safetensors file."""
    raw = fh.read(8)
    if len(raw) < 8:
        raise LoaderError("%s: not a safetensors file (shorter than its 8-byte header length)" % name)
    (length,) = struct.unpack("<Q", raw)
    if length > MAX_HEADER or 8 + length > file_size:
        raise LoaderError("%s: header length %d does not fit the file (%d bytes)" % (name, length, file_size))
    try:
        header = json.loads(fh.read(length).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise LoaderError("%s: the safetensors header is not JSON (%s)" % (name, exc)) from None
    if not isinstance(header, dict):
        raise LoaderError("%s: the safetensors header is not a JSON object" % name)
    data_start = 8 + length
    tensors = {}
    for tname, info in header.items():
        if tname == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = info["dtype"], [int(d) for d in info["shape"]], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise LoaderError("%s: tensor %r has no dtype/shape/data_offsets" % (name, tname)) from None
        if dtype not in DTYPE_SIZES:
            raise LoaderError("%s: tensor %r has an unknown dtype %r" % (name, tname, dtype))
        nbytes = math.prod(shape) * DTYPE_SIZES[dtype]
        if not (isinstance(start, int) and isinstance(end, int)) or end - start != nbytes or start < 0:
            raise LoaderError(
                "%s: tensor %r: data_offsets %r do not hold %s %r" % (name, tname, [start, end], dtype, shape)
            )
        if data_start + end > file_size:
            raise LoaderError("%s: tensor %r ends past the end of the file" % (name, tname))
        tensors[tname] = {"dtype": dtype, "shape": shape, "start": data_start + start, "end": data_start + end}
    return data_start, tensors


def read_headers(model_dir: str) -> List[Tuple[str, Dict[str, Dict[str, Any]]]]:
    try:
        names = sorted(n for n in os.listdir(model_dir) if n.endswith(".safetensors"))
    except OSError as exc:
        raise OptionError(
            "model %r cannot be listed (%s); give a model directory" % (model_dir, exc.strerror)
        ) from None
    if not names:
        raise OptionError("model %r has no *.safetensors files; give a model directory" % model_dir)
    out = []
    for n in names:
        path = os.path.join(model_dir, n)
        with open(path, "rb") as fh:
            out.append((path, read_header(fh, os.fstat(fh.fileno()).st_size, n)[1]))
    return out


# ---------------------------------------------------------------------------
# tensor parallelism: this rank's part of a tensor


def rank_ranges(name: str, shape: List[int], itemsize: int, tp: int, rank: int) -> List[Tuple[int, int]]:
    """Byte ranges (offset in the tensor, length) this rank keeps, in order.

    Norms and scalars are replicated; row-parallel weights (o_proj, down_proj) split the last
    dimension (one range per row); everything else (column-parallel, vocab-parallel, 1-D
    tensors) splits dimension 0 (one contiguous range; a 1-D tensor whose length does not
    divide gets ceil-sized parts, the last rank the remainder)."""
    total = math.prod(shape) * itemsize
    parts = name.split(".")
    module = parts[-2] if len(parts) >= 2 else parts[0]
    if tp == 1 or not shape or "norm" in module:
        return [(0, total)] if total else []
    row_parallel = len(shape) >= 2 and name.endswith(ROW_PARALLEL)
    dim = len(shape) - 1 if row_parallel else 0
    if len(shape) == 1 and shape[0] % tp:
        # a 1-D tensor of any length (e.g. the VM checkpoint's padding): ceil-sized parts
        part = -(-shape[0] // tp)
        first = min(shape[0], rank * part)
        n = min(shape[0], first + part) - first
        return [(first * itemsize, n * itemsize)] if n else []
    if shape[dim] % tp:
        raise LoaderError(
            "tensor %r of shape %r: dimension %d (%d) is not divisible by --tensor-parallel-size %d"
            % (name, shape, dim, shape[dim], tp)
        )
    if not row_parallel:
        part = total // tp
        return [(rank * part, part)]
    row = shape[-1] * itemsize
    part = row // tp
    return [(r * row + rank * part, part) for r in range(total // row)]


# ---------------------------------------------------------------------------
# PyTorch's caching allocator: which driver allocations (segments) a set of tensors needs


def rank_parts(
    shards: List[Tuple[str, Dict[str, Dict[str, Any]]]], tp: int, rank: int
) -> List[Tuple[str, int, List[Tuple[int, int]]]]:
    """This rank's part of every tensor: (shard path, tensor start, [(offset, length)]), in file order."""
    parts = []
    for path, tensors in shards:
        for name, t in tensors.items():
            ranges = rank_ranges(name, t["shape"], DTYPE_SIZES[t["dtype"]], tp, rank)
            if ranges:
                parts.append((path, t["start"], ranges))
    return parts


def rank_sizes(model_dir: str, tp: int, rank: int, allocator: str) -> Tuple[List[int], List[int]]:
    """This rank's bytes per tensor and the driver allocations they become (load_model's plan)."""
    sizes = [sum(n for _o, n in ranges) for _p, _s, ranges in rank_parts(read_headers(model_dir), tp, rank)]
    return sizes, plan_segments(sizes, allocator)[0]


def segment_size(nbytes: int) -> int:
    """CUDACachingAllocator get_allocation_size."""
    if nbytes <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if nbytes < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * -(-nbytes // K_ROUND_LARGE)


def plan_segments(sizes: List[int], allocator: str = "torch") -> Tuple[List[int], List[Tuple[int, int]]]:
    """(segment sizes, (segment, offset) per request).

    torch: a request first goes into the free tail of an open segment of its pool (small
    <= 1 MiB, large otherwise) that fits it (the allocator splits free blocks; with
    allocations that are never freed that is the tail), else it opens a new segment of
    segment_size(). exact: every request its own segment rounded up to 2 MiB, which is what
    torch does for requests >= 10 MiB (most of a real model's weights per rank)."""
    if allocator == "exact":
        return [K_ROUND_LARGE * -(-n // K_ROUND_LARGE) for n in sizes], [(i, 0) for i in range(len(sizes))]
    segments: List[int] = []
    used: List[int] = []
    where = []
    open_small: List[int] = []
    open_large: List[int] = []
    for n in sizes:
        rounded = max(K_MIN_BLOCK, -(-n // K_MIN_BLOCK) * K_MIN_BLOCK)
        pool = open_small if rounded <= K_SMALL_SIZE else open_large
        seg = next((s for s in pool if segments[s] - used[s] >= rounded), None)
        if seg is None:
            seg = len(segments)
            segments.append(segment_size(rounded))
            used.append(0)
            if segments[seg] > rounded:
                pool.append(seg)
        where.append((seg, used[seg]))
        used[seg] += rounded
    return segments, where


# ---------------------------------------------------------------------------
# vLLM's startup check


def format_gib(n: float) -> str:
    """vllm.utils.mem_utils.format_gib."""
    return str(round(n / GIB, 2))


def startup_check(free: int, total: int, gmu: float) -> int:
    """request_memory (vllm/v1/worker/utils.py, 0.32): the requested memory, or LoaderError."""
    requested = math.ceil(total * gmu)
    if free < requested:
        raise LoaderError(
            "ValueError: Free memory on device cuda:0 (%s/%s GiB) on startup is less than desired GPU memory "
            "utilization (%s, %s GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
            "processes." % (format_gib(free), format_gib(total), gmu, format_gib(requested))
        )
    return requested


def meminfo(proc: str = "/proc") -> Dict[str, int]:
    out = {}
    with open(os.path.join(proc, "meminfo"), encoding="ascii") as fh:
        for line in fh:
            key, _sep, rest = line.partition(":")
            fields = rest.split()
            if fields:
                out[key] = int(fields[0]) * (1024 if fields[1:] == ["kB"] else 1)
    return out


def torch_size(n: float) -> str:
    """c10's format_size: how torch's OutOfMemoryError prints sizes."""
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", 1024)):
        if n >= scale:
            return "%.2f %s" % (n / scale, unit)
    return "%d bytes" % n


# ---------------------------------------------------------------------------
# options


def human_readable_int(option: str, value: str) -> int:
    """vllm.utils.argparse_utils.human_readable_int: 1k = 1000, 1K = 1024 ..."""
    text = value.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", text)
    if m:
        number, suffix = m.groups()
        if suffix.islower():
            return int(float(number) * 10 ** (3 * "kmgt".index(suffix) + 3))
        if "." not in number:
            return int(number) << (10 * ("KMGT".index(suffix) + 1))
    elif re.fullmatch(r"\d+", text):
        return int(text)
    raise OptionError("%s %r is not a number of bytes; give e.g. 268435456, 256M or 0.25g" % (option, value))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description=STAND_IN + ".\n\n" + __doc__.split("\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", help="model directory with *.safetensors shards and config.json")
    p.add_argument("--tensor-parallel-size", "-tp", default="1", help="ranks the model is split over (1)")
    p.add_argument("--rank", default="0", help="this rank, 0 .. tensor-parallel-size - 1 (0)")
    p.add_argument("--gpu-memory-utilization", default="0.9", help="fraction of total memory requested (0.9)")
    p.add_argument("--kv-cache-memory-bytes", help="KV cache size in bytes (e.g. 256M); required")
    p.add_argument("--port", default="8000", help="HTTP port (8000)")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (0.0.0.0)")
    p.add_argument("--max-model-len", default=None, help="tokens per request (config.json's max_position_embeddings)")
    p.add_argument("--served-model-name", default=None, help="model name in the API (the model path)")
    p.add_argument(
        "--allocator",
        choices=("torch", "exact"),
        default="torch",
        help="torch: PyTorch's caching-allocator segments (default); exact: one allocation per tensor slice, "
        "rounded up to 2 MiB (torch's rule for >= 10 MiB; for checkpoints whose tensors are smaller than a "
        "real model's, e.g. the VM's 16 MiB padding tensors, 8 MiB per rank at TP=2)",
    )
    p.add_argument(
        "--driver",
        default="fakegb10",
        help="fakegb10 (default), cuda (a real discrete GPU through torch: vLLM's discrete startup check against "
        "torch.cuda.mem_get_info) or file:PATH (tests: a plain file)",
    )
    p.add_argument(
        "--as-rank",
        default=None,
        metavar="TP:RANK",
        help="load as rank RANK of a TP-rank engine whatever --tensor-parallel-size says: the VM is one node, and "
        "the collection plans it as a one-rank engine told this rank's part (plan weights_bytes; --rank-bytes)",
    )
    p.add_argument(
        "--rank-bytes",
        action="store_true",
        help="print this rank's driver bytes for the weights as JSON (nothing allocated, no server) and exit",
    )
    return p


def _int(option: str, value: str, low: int, high: Optional[int], fix: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = None
    if n is None or n < low or (high is not None and n > high):
        raise OptionError("%s %r is not a whole number in %d..%s; %s" % (option, value, low, high or "", fix))
    return n


def parse_options(argv: List[str]) -> argparse.Namespace:
    """argparse plus the checks vLLM makes; OptionError names the option, the value and the fix."""
    # vLLM's flags this stand-in does not model (--max-num-seqs 4, --enforce-eager ...: what the planner adds) are
    # accepted and listed in the log, as a real engine would take them; only a bad value of a modelled one fails
    args, ignored = build_parser().parse_known_args(argv)
    args.ignored = ignored
    args.tensor_parallel_size = _int("--tensor-parallel-size", args.tensor_parallel_size, 1, None, "give e.g. 2")
    args.rank = _int("--rank", args.rank, 0, None, "give 0 for the first rank")
    if args.as_rank is not None:
        match = re.match(r"^([0-9]+):([0-9]+)$", str(args.as_rank))
        if not match or int(match.group(1)) < 1:
            raise OptionError(
                "--as-rank %r is not TP:RANK; give e.g. 2:0 for rank 0 of a two-rank engine" % args.as_rank
            )
        args.tensor_parallel_size, args.rank = int(match.group(1)), int(match.group(2))
    if args.rank >= args.tensor_parallel_size:
        if args.as_rank is not None:
            raise OptionError("--as-rank %r: rank %d is not below %d; give e.g. 2:0" % (
                args.as_rank, args.rank, args.tensor_parallel_size))  # fmt: skip
        raise OptionError(
            "--rank %d is not below --tensor-parallel-size %d; ranks are 0..%d"
            % (args.rank, args.tensor_parallel_size, args.tensor_parallel_size - 1)
        )
    try:
        gmu = float(args.gpu_memory_utilization)
    except ValueError:
        gmu = float("nan")
    if not 0.0 < gmu <= 1.0:
        raise OptionError(
            "--gpu-memory-utilization %r is not in (0, 1]; give a fraction such as 0.8" % args.gpu_memory_utilization
        )
    args.gpu_memory_utilization = gmu
    if args.kv_cache_memory_bytes is None:
        if args.rank_bytes:
            args.kv_cache_memory_bytes = 0  # not used: nothing is allocated
            return args
        raise OptionError(
            "--kv-cache-memory-bytes is required (vLLM on a GB10 rank: the planner's KV budget); give e.g. 256M"
        )
    args.kv_cache_memory_bytes = human_readable_int("--kv-cache-memory-bytes", args.kv_cache_memory_bytes)
    if args.kv_cache_memory_bytes <= 0:
        raise OptionError("--kv-cache-memory-bytes 0 allocates no KV cache; give e.g. 256M")
    args.port = _int("--port", args.port, 1, 65535, "give a free TCP port such as 8000")
    if args.max_model_len is not None:
        args.max_model_len = _int("--max-model-len", args.max_model_len, 1, None, "give e.g. 512")
    if args.driver not in ("fakegb10", "cuda") and not (args.driver.startswith("file:") and len(args.driver) > 5):
        raise OptionError("--driver %r is not fakegb10, cuda or file:PATH; leave it out in the VM" % args.driver)
    if not os.path.isdir(args.model):
        raise OptionError("model %r is not a directory; give the model directory (e.g. /srv/model)" % args.model)
    return args


# ---------------------------------------------------------------------------
# the engine


class Log:
    """vLLM's log format: (process pid=N) LEVEL MM-DD HH:MM:SS [file.py:line] message."""

    def __init__(self, stream: Any = None, process: str = "APIServer") -> None:
        self.stream = stream or sys.stdout
        self.process = process

    def __call__(self, where: str, msg: str, level: str = "INFO", process: Optional[str] = None) -> None:
        stamp = time.strftime("%m-%d %H:%M:%S")
        self.stream.write(
            "(%s pid=%d) %s %s [%s] %s\n" % (process or self.process, os.getpid(), level, stamp, where, msg)
        )
        self.stream.flush()


def read_config(model_dir: str) -> Dict[str, Any]:
    try:
        with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as fh:
            cfg = json.load(fh)
    except (OSError, ValueError) as exc:
        raise OptionError("model %r: config.json cannot be read (%s)" % (model_dir, exc)) from None
    return cfg if isinstance(cfg, dict) else {}


def kv_report(cfg: Dict[str, Any], kv_bytes: int, tp: int, max_len: int) -> Tuple[int, float]:
    """(tokens, max concurrency) for 'GPU KV cache size: N tokens, Maximum concurrency ...'."""
    heads = int(cfg.get("num_attention_heads", 1))
    head_dim = int(cfg.get("head_dim") or int(cfg.get("hidden_size", 64)) // heads)
    kv_heads = max(1, int(cfg.get("num_key_value_heads", heads)) // tp)
    per_token = 2 * int(cfg.get("num_hidden_layers", 1)) * kv_heads * head_dim * 2  # K and V, 2-byte dtype
    blocks = kv_bytes // (per_token * BLOCK_SIZE)
    per_request = -(-max_len // BLOCK_SIZE)
    concurrency = blocks / per_request if per_request else 0.0
    return int(concurrency * max_len), concurrency


class Engine:
    def __init__(self, args: argparse.Namespace, driver: Any, log: Log, proc: str = "/proc") -> None:
        self.args = args
        self.driver = driver
        self.log = log
        self.proc = proc
        self.worker = "Worker_TP%d" % args.rank
        self.maps: List[mmap.mmap] = []
        self.served = 0
        self.tokens = 0
        self.facts: Dict[str, Any] = {}
        # what vLLM reads before it touches the device: the config and the checkpoint's index
        self.config = read_config(args.model)
        self.shards = read_headers(args.model)

    def wlog(self, where: str, msg: str, level: str = "INFO") -> None:
        self.log(where, msg, level, self.worker)

    def alloc(self, size: int, what: str) -> Tuple[mmap.mmap, int]:
        try:
            _handle, page_size, offset = self.driver.alloc(size)
        except OSError as exc:
            if exc.errno != errno.ENOMEM:
                raise
            if getattr(exc, "torch_message", None):
                raise LoaderError("%s (%s)" % (exc.torch_message, what)) from None  # type: ignore[attr-defined]
            mem = meminfo(self.proc)
            raise LoaderError(
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate %s. GPU 0 has a total capacity of "
                "%s of which %s is free. (%s: the %s driver's allocation failed: NV_ERR_NO_MEMORY)"
                % (
                    torch_size(size),
                    torch_size(mem["MemTotal"]),
                    torch_size(mem.get("MemAvailable", 0)),
                    what,
                    self.driver.name,
                )
            ) from None
        m = self.driver.map(offset, size)
        self.maps.append(m)
        return m, page_size

    def init_device(self) -> None:
        if getattr(self.driver, "discrete", False):
            # a discrete GPU: MemorySnapshot reads torch.cuda.mem_get_info() after the context
            free, total = self.driver.mem_get_info()
            self.facts.update(check_source="cuda mem_get_info", free_at_check=free, total_at_check=total)
        else:
            mem = meminfo(self.proc)
            free, total = mem["MemAvailable"], mem["MemTotal"]
            self.facts.update(check_source="MemAvailable", free_at_check=free, total_at_check=total)
            self.facts["memavailable_at_check"] = free
            self.facts["memtotal"] = total
        try:
            requested = startup_check(free, total, self.args.gpu_memory_utilization)
        finally:
            self.facts["requested_at_check"] = math.ceil(total * self.args.gpu_memory_utilization)
        self.wlog(
            "gpu_worker.py:538",
            "worker requested memory: %sGiB (%s %s GiB of %s GiB at the startup check)"
            % (format_gib(requested), self.facts["check_source"], format_gib(free), format_gib(total)),
        )

    def load_model(self) -> None:
        t0 = time.monotonic()
        tp, rank = self.args.tensor_parallel_size, self.args.rank
        shards = self.shards
        # (shard path, tensor start, [(offset, length)], dest index)
        plan = [(path, start, ranges, i) for i, (path, start, ranges) in enumerate(rank_parts(self.shards, tp, rank))]
        sizes = [sum(n for _o, n in ranges) for _p, _s, ranges, _i in plan]
        segments, where = plan_segments(sizes, self.args.allocator)
        pages: Dict[int, int] = {}
        seg_maps = []
        for i, size in enumerate(segments):
            m, page = self.alloc(size, "weights segment %d of %d" % (i + 1, len(segments)))
            seg_maps.append(m)
            pages[page] = pages.get(page, 0) + 1
        self.facts.update(weights_bytes=sum(sizes), weight_segments=len(segments), weight_driver_bytes=sum(segments))
        self.wlog(
            "gpu_model_runner.py:4321",
            "model init: %d tensors of this rank in %d segments (%s GiB of driver "
            "memory, page sizes %s)" % (len(sizes), len(segments), format_gib(sum(segments)), pages),
        )
        t_load = time.monotonic()
        by_shard: Dict[str, list] = {}
        for item in plan:
            by_shard.setdefault(item[0], []).append(item)
        for i, (path, _tensors) in enumerate(shards):
            with open(path, "rb") as fh:  # safe_open: the whole file mmapped
                src = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            view = memoryview(src)
            try:
                for _p, start, ranges, idx in by_shard.get(path, []):
                    seg, pos = where[idx]
                    if hasattr(seg_maps[seg], "write_at"):  # a real GPU's allocation (--driver cuda)
                        for off, n in ranges:
                            seg_maps[seg].write_at(pos, view[start + off : start + off + n])
                            pos += n
                        continue
                    dst = memoryview(seg_maps[seg])
                    for off, n in ranges:
                        dst[pos : pos + n] = view[start + off : start + off + n]
                        pos += n
                    dst.release()
            finally:
                view.release()
                src.close()
            self.wlog(
                "weight_utils.py:761",
                "Loading safetensors checkpoint shards: %d%% Completed | %d/%d [%.1fs]"
                % (100 * (i + 1) // len(shards), i + 1, len(shards), time.monotonic() - t_load),
            )
        now = time.monotonic()
        self.facts["load_s"] = round(now - t0, 3)
        self.wlog("default_loader.py:502", "Loading weights took %.2f seconds" % (now - t_load))
        self.wlog(
            "gpu_model_runner.py:5150",
            "Model loading took %s GiB memory and %.6f seconds" % (format_gib(sum(segments)), now - t0),
        )

    def init_kv_cache(self) -> None:
        kv = self.args.kv_cache_memory_bytes
        self.facts["free_order9_at_kv"] = free_order9(self.proc)
        self.wlog(
            "gpu_worker.py:669",
            "Initial free memory %s GiB, reserved %s GiB memory for KV Cache as specified by "
            "kv_cache_memory_bytes config and skipped memory profiling. This does not respect the "
            "gpu_memory_utilization config. Only use kv_cache_memory_bytes config when you want manual control "
            "of KV cache memory size." % (format_gib(self.facts["free_at_check"]), format_gib(kv)),
        )
        t0 = time.monotonic()
        _m, page = self.alloc(kv, "KV cache")
        self.facts["kv_alloc_s"] = round(time.monotonic() - t0, 3)
        self.facts["kv_page_size"] = page
        cfg = self.config
        max_len = self.args.max_model_len or int(cfg.get("max_position_embeddings", 2048))
        tokens, conc = kv_report(cfg, kv, self.args.tensor_parallel_size, max_len)
        self.log(
            "kv_cache_utils.py:2327",
            "GPU KV cache size: {:,} tokens, Maximum concurrency for {:,} tokens per request: {:.2f}x".format(
                tokens, max_len, conc
            ),
            process="EngineCore_DP0",
        )

    def completion(self, body: Dict[str, Any]) -> Dict[str, Any]:
        n = body.get("max_tokens", 16)
        n = n if isinstance(n, int) and 0 < n <= 4096 else 16
        prompt = body.get("prompt", "")
        prompt_tokens = max(1, len(str(prompt).split()))
        self.served += 1
        self.tokens += n
        return {
            "id": "cmpl-" + uuid.uuid4().hex,
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name(),
            "choices": [
                {"index": 0, "text": " the" * n, "logprobs": None, "finish_reason": "length", "stop_reason": None}
            ],
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + n, "completion_tokens": n},
        }

    def model_name(self) -> str:
        return self.args.served_model_name or self.args.model

    def metrics(self) -> str:
        name = self.model_name().replace("\\", "\\\\").replace('"', '\\"')
        rows = [
            ("vllm:num_requests_running", "gauge", 0),
            ("vllm:num_requests_waiting", "gauge", 0),
            ("vllm:request_success_total", "counter", self.served),
            ("vllm:generation_tokens_total", "counter", self.tokens),
        ]
        out = []
        for metric, kind, value in rows:
            out += ["# TYPE %s %s" % (metric, kind), '%s{model_name="%s"} %s' % (metric, name, float(value))]
        return "\n".join(out) + "\n"


def free_order9(proc: str = "/proc") -> Optional[int]:
    try:
        with open(os.path.join(proc, "buddyinfo"), encoding="ascii") as fh:
            # order 9 and order 10 (two 2 MiB blocks each): what a 2 MiB page can come from
            return sum(int(f.split()[13]) + 2 * int(f.split()[14]) for f in fh if len(f.split()) >= 15)
    except OSError:
        return None


def make_handler(engine: Engine) -> type:
    class Handler(BaseHTTPRequestHandler):
        server_version = "uma-loader"

        def log_message(self, *args: Any) -> None:
            pass

        def reply(self, code: int, body: Any, ctype: str = "application/json") -> None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/health":
                self.reply(200, "", "text/plain")
            elif path == "/v1/models":
                self.reply(
                    200,
                    {"object": "list", "data": [{"id": engine.model_name(), "object": "model", "owned_by": "vllm"}]},
                )
            elif path == "/metrics":
                self.reply(200, engine.metrics(), "text/plain; version=0.0.4")
            else:
                self.reply(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            if self.path.split("?", 1)[0] != "/v1/completions":
                self.reply(404, {"detail": "Not Found"})
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            except ValueError:
                body = None
            if not isinstance(body, dict):
                self.reply(
                    400, {"error": {"message": "the body is not a JSON object", "type": "BadRequestError", "code": 400}}
                )
                return
            if body.get("model") not in (None, engine.model_name()):
                self.reply(
                    404,
                    {
                        "error": {
                            "message": "The model `%s` does not exist." % body.get("model"),
                            "type": "NotFoundError",
                            "param": "model",
                            "code": 404,
                        }
                    },
                )
                return
            self.reply(200, engine.completion(body))

    return Handler


def print_rank_bytes(args: argparse.Namespace) -> int:
    """--rank-bytes: what the weights of this rank pin, for the planner's weights_bytes (uma_vm.py --configs c)."""
    try:
        sizes, segments = rank_sizes(args.model, args.tensor_parallel_size, args.rank, args.allocator)
    except (OptionError, LoaderError, OSError) as exc:
        sys.stderr.write("%s: error: %s\n" % (PROG, exc))
        return 2
    print(json.dumps({"tensor_parallel_size": args.tensor_parallel_size, "rank": args.rank,
                      "allocator": args.allocator, "weights_bytes": sum(sizes),
                      "weight_driver_bytes": sum(segments), "weight_segments": len(segments)}))  # fmt: skip
    return 0


def main(argv: Optional[List[str]] = None, driver: Any = None, proc: str = "/proc") -> int:
    log = Log()
    argv = sys.argv[1:] if argv is None else argv
    if not {"-h", "--help", "--rank-bytes"} & set(argv):
        log("api_server.py:1", STAND_IN)  # the first line, also before an option error
    try:
        args = parse_options(argv)
    except OptionError as exc:
        sys.stderr.write("%s: error: %s\n" % (PROG, exc))
        return 2
    if args.rank_bytes:
        return print_rank_bytes(args)
    log("utils.py:253", "stand-in args: %s" % json.dumps(dict(sorted(vars(args).items()))))
    if args.ignored:
        log("utils.py:253", "stand-in ignores (not modelled): %s" % " ".join(args.ignored))
    # vLLM's own record of its arguments (entrypoints/utils.py), a Python dict repr: what
    # oom_diagnose reads when no launch record names the flags
    vllm_names = ("model", "tensor_parallel_size", "gpu_memory_utilization", "kv_cache_memory_bytes", "max_model_len")
    given = {name: getattr(args, name) for name in vllm_names if getattr(args, name, None) is not None}
    log("utils.py:253", "non-default args: %r" % given)
    t_start = time.monotonic()
    engine = None
    before: Dict[str, int] = {}
    try:
        if driver is None:
            if args.driver == "cuda":
                driver = CudaDriver()
            else:
                driver = FakeGB10Driver() if args.driver == "fakegb10" else PlainFileDriver(args.driver[5:])
        engine = Engine(args, driver, log, proc)
        before = driver.counters()
        engine.init_device()
        engine.load_model()
        engine.init_kv_cache()
        after = driver.counters()
        engine.facts["driver"] = {k: after[k] - before.get(k, 0) for k in after}
        log(
            "core.py:403",
            "init engine (profile, create kv cache, warmup model) took %.2f seconds" % (time.monotonic() - t_start),
            process="EngineCore_DP0",
        )
        log("uma_loader", "stand-in facts: %s" % json.dumps(engine.facts, sort_keys=True))
        server = ThreadingHTTPServer((args.host, args.port), make_handler(engine))
    except OptionError as exc:
        sys.stderr.write("%s: error: %s\n" % (PROG, exc))
        return 2
    except (LoaderError, OSError) as exc:
        log("gpu_model_runner.py:5140", str(exc), "ERROR", "Worker_TP%d" % args.rank)
        if engine is not None:
            after = driver.counters()
            engine.facts["driver"] = {k: after[k] - before.get(k, 0) for k in after}
            log("uma_loader", "stand-in facts: %s" % json.dumps(engine.facts, sort_keys=True), "ERROR")
        log("core.py:1010", "EngineCore failed to start.", "ERROR", "EngineCore_DP0")
        return 1
    signal.signal(signal.SIGTERM, lambda *_a: threading.Thread(target=server.shutdown, daemon=True).start())
    log("entry.py:140", "Starting vLLM server on http://%s:%d" % (args.host, args.port))
    sys.stdout.write("INFO:     Application startup complete.\n")
    sys.stdout.flush()
    try:
        server.serve_forever(poll_interval=0.25)
    except KeyboardInterrupt:
        pass
    server.server_close()
    driver.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
