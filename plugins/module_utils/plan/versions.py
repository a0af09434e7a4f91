# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What differs between vLLM releases, as small tables of version ranges.

Every row was read off the released Python sources of vLLM for sampled releases
from 0.8.5 to 0.33.0. A change is dated to the first sampled release that has it;
releases between two samples are assumed to behave like the older one
(evidence: docs/PLANNER-EVIDENCE.md, section 'The vLLM releases read').
Nothing here imports Ansible and it imports under Python 3.8.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError

Version = Tuple[int, int, int]

# vLLM 0.5-0.7 (V0 engine) size a uniform-attention KV cache with the same
# arithmetic as the first KV_BEHAVIOUR row (CacheEngine.get_cache_block_size,
# num_gpu_blocks = available // block bytes, "Maximum concurrency" =
# num_gpu_blocks * block_size / max_model_len in executor_base.py).
OLDEST_SUPPORTED = (0, 5, 0)
V1_DEFAULT = (0, 8, 0)
# Newest release whose sources were read. Later 0.x releases are planned like it.
NEWEST_KNOWN = (0, 33, 0)
DEFAULT_VERSION = "0.32.0"


def parse_version(option: str, text: Any) -> Version:
    """``"0.11.2"``, ``"v0.8.3.dev172+g2b93162f"``, ``"0.10.1.1"`` -> ``(0, 11, 2)``..."""
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    match = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    if not match:
        raise UmaError(option, text, "is not a vLLM version", "Give the release as MAJOR.MINOR.PATCH, e.g. '0.32.0'.")
    version = (int(match.group(1)), int(match.group(2)), int(match.group(3) or 0))
    if version < OLDEST_SUPPORTED:
        raise UmaError(
            option,
            text,
            "is older than the oldest vLLM this planner models (0.5.0)",
            "Upgrade vLLM to 0.5.0 or later (0.8.0+ for the V1 engine).",
        )
    # a later major release (1.x) is newer than NEWEST_KNOWN: planned with the newest rows and a
    # warning (_vllm_plan_inputs._resolve_version), like a later 0.x
    return version


def vstr(version: Version) -> str:
    return "%d.%d.%d" % version


def _rows_at(table: List[Tuple[Version, Dict[str, Any]]], version: Version) -> Dict[str, Any]:
    merged: Dict[str, Any] = {}
    for since, row in table:
        if version >= since:
            merged.update(row)
    return merged


# --- KV cache behaviour --------------------------------------------------------
# Each row applies from its version on (until a later row overrides a key); kv.py and inputs.py
# apply the keys:
#   report / concurrency   how vLLM computes "GPU KV cache size: N tokens" / "Maximum concurrency"
#   hybrid_manager         sliding-window / linear-attention layers get their own KV cache groups
#                          (else every sliding-window layer is promoted to full attention)
#   group_size             min: the smallest layer count of a type; max_if_close: the largest when
#                          it is < 1.5x the smallest
#   check, check_scope, check_null_block  the "at least one max_model_len request fits" test: what
#                          it sums, against which workers' memory, less the null block or not
#   gib_format             fixed2 ("%.2f" of bytes/GiB) or round2 (str(round(bytes/GiB, 2)))
#   mamba_default_mode     a hybrid model's mamba cache mode by default (align: 2 state blocks a request)
#   in_flight              tokens a sliding-window layer keeps besides its window
#   hybrid_state_layers    linear-attention / mamba layers are KV cache groups
#   mamba_mode_follows_prefix_caching, gb10_small_batch_tier  the 0.33 changes (row below)
# (evidence: docs/PLANNER-EVIDENCE.md, section 'KV cache behaviour by release': each value's formula,
# the vLLM function and the releases it was read from)
KV_BEHAVIOUR: List[Tuple[Version, Dict[str, Any]]] = [
    (
        (0, 5, 0),
        {
            "report": "blocks_x_block_size",
            "concurrency": "tokens_over_len",
            "hybrid_manager": False,
            "group_size": "min",
            "check": "per_layer",
            "check_scope": "worker",
            "check_null_block": False,
            "gib_format": "fixed2",
            "mamba_default_mode": "none",
            "in_flight": "batched",
            "hybrid_state_layers": False,
            "mamba_mode_follows_prefix_caching": False,
            "gb10_small_batch_tier": False,
        },
    ),
    ((0, 9, 2), {"report": "groups_floor", "concurrency": "blocks_per_request", "hybrid_manager": True}),
    ((0, 10, 0), {"hybrid_state_layers": True}),
    ((0, 14, 0), {"check": "first_group", "check_scope": "global", "gib_format": "round2"}),
    ((0, 17, 0), {"check_scope": "worker"}),
    ((0, 18, 0), {"group_size": "max_if_close"}),
    ((0, 19, 0), {"check": "sum_groups"}),
    ((0, 21, 0), {"report": "concurrency_x_len"}),
    ((0, 26, 0), {"mamba_default_mode": "align", "in_flight": "async_batches"}),
    ((0, 29, 0), {"check_null_block": True}),
    # 0.33: the mamba mode follows prefix caching; GB10 keeps the small batch tier
    # (evidence: docs/PLANNER-EVIDENCE.md, section 'KV cache behaviour by release')
    ((0, 33, 0), {"mamba_mode_follows_prefix_caching": True, "gb10_small_batch_tier": True}),
]


def kv_behaviour(version: Version) -> Dict[str, Any]:
    return _rows_at(KV_BEHAVIOUR, version)


# --- CLI flags -----------------------------------------------------------------
# flag -> (first release that parses it, first release that rejects it or None).
# A 0.5.0 start marks flags vLLM had long before 0.8 (V0 era), 0.8.0 marks "present in
# 0.8.5, start not checked".
# A flag's rows: (since, until) or a list of them when a flag went and came back.
# 0.33 pairs boolean --enable-X flags with --disable-X; the old --no-enable-X / --no-disable-X
# stay accepted.
# (evidence: docs/PLANNER-EVIDENCE.md, section 'CLI flags by release')
FLAGS: Dict[str, Any] = {
    "--tensor-parallel-size": ((0, 5, 0), None),
    "--pipeline-parallel-size": ((0, 5, 0), None),
    "--max-model-len": ((0, 5, 0), None),
    "--max-num-seqs": ((0, 5, 0), None),
    "--max-num-batched-tokens": ((0, 5, 0), None),
    "--kv-cache-dtype": ((0, 5, 0), None),
    "--block-size": ((0, 5, 0), None),
    "--gpu-memory-utilization": ((0, 5, 0), None),
    "--kv-cache-memory-bytes": ((0, 10, 2), None),
    "--swap-space": ((0, 5, 0), (0, 18, 0)),
    "--disable-log-requests": [((0, 5, 0), (0, 17, 0)), ((0, 33, 0), None)],
    "--enable-log-requests": ((0, 10, 1), None),
    "--nnodes": ((0, 11, 1), None),
    "--node-rank": ((0, 11, 1), None),
    "--master-addr": ((0, 11, 1), None),
    "--master-port": ((0, 11, 1), None),
    "--headless": ((0, 9, 0), None),
    "--api-server-count": ((0, 9, 2), None),
    "--distributed-executor-backend": ((0, 5, 0), None),
    "--data-parallel-size": ((0, 8, 0), None),
    "--data-parallel-size-local": ((0, 9, 0), None),
    "--data-parallel-address": ((0, 9, 0), None),
    "--data-parallel-rpc-port": ((0, 9, 0), None),
    "--data-parallel-start-rank": ((0, 9, 0), None),
    "--enable-prefix-caching": ((0, 5, 0), None),
    "--no-enable-prefix-caching": ((0, 8, 0), None),
    "--disable-prefix-caching": ((0, 33, 0), None),
    "--no-enable-chunked-prefill": ((0, 8, 0), None),
    "--disable-chunked-prefill": ((0, 33, 0), None),
    "--enable-hybrid-kv-cache-manager": ((0, 33, 0), None),
    "--no-disable-hybrid-kv-cache-manager": ((0, 9, 2), None),
    "--disable-hybrid-kv-cache-manager": ((0, 9, 2), None),
    "--mamba-cache-mode": ((0, 15, 0), None),
    "--mamba-ssm-cache-dtype": ((0, 10, 1), None),
    "--num-gpu-blocks-override": ((0, 5, 0), None),
    "--enforce-eager": ((0, 5, 0), None),
    "--dtype": ((0, 5, 0), None),
    "--served-model-name": ((0, 5, 0), None),
    "--host": ((0, 5, 0), None),
    "--port": ((0, 5, 0), None),
    "--trust-remote-code": ((0, 5, 0), None),
    "--cpu-offload-gb": ((0, 8, 0), None),
    "--enable-chunked-prefill": ((0, 5, 0), None),
    "--seed": ((0, 5, 0), None),
    "--load-format": ((0, 5, 0), None),
    "--safetensors-load-strategy": ((0, 11, 0), None),
    "--quantization": ((0, 5, 0), None),
}

# Flags whose value the planner owns: given again in extra_args they would
# silently override the plan, so they are refused there.
PLANNED_FLAGS = (
    "--tensor-parallel-size",
    "--pipeline-parallel-size",
    "--max-model-len",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--kv-cache-dtype",
    "--block-size",
    "--gpu-memory-utilization",
    "--kv-cache-memory-bytes",
    "--nnodes",
    "--node-rank",
    "--master-addr",
    "--master-port",
    "--headless",
    "--distributed-executor-backend",
    "--data-parallel-size",
    "--data-parallel-size-local",
    "--data-parallel-address",
    "--data-parallel-rpc-port",
    "--data-parallel-start-rank",
    "--load-format",
    "--safetensors-load-strategy",
)

# Short aliases vLLM also accepts for planned flags (engine/arg_utils.py).
FLAG_ALIASES = {
    "-tp": "--tensor-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "-dp": "--data-parallel-size",
    "-dpl": "--data-parallel-size-local",
    "-dpa": "--data-parallel-address",
    "-dpp": "--data-parallel-rpc-port",
    "-dpr": "--data-parallel-start-rank",
    "-n": "--nnodes",
    "-r": "--node-rank",
    "-asc": "--api-server-count",
}


def _ranges(rows: Any) -> List[Tuple[Version, Optional[Version]]]:
    """A table's rows: one (since, until) or a list of them (a flag that went and came back)."""
    return list(rows) if isinstance(rows, list) else [rows]


def in_ranges(rows: Any, version: Version) -> bool:
    return any(version >= since and (until is None or version < until) for since, until in _ranges(rows))


def ranges_text(rows: Any) -> str:
    parts = []
    for since, until in _ranges(rows):
        if until is None:
            parts.append("vLLM >= %s" % vstr(since))
        else:
            parts.append("vLLM %s to %s (removed in %s)" % (vstr(since), _before(until), vstr(until)))
    return " and ".join(parts)


def flag_supported(flag: str, version: Version) -> Optional[bool]:
    """True/False when the table knows the flag, None when it does not."""
    if flag not in FLAGS:
        return None
    return in_ranges(FLAGS[flag], version)


def flag_range_text(flag: str) -> str:
    return ranges_text(FLAGS[flag])


def _before(version: Version) -> str:
    return "< %s" % vstr(version)


# --block-size choices: CacheConfig.BlockSize Literal (argparse choices) until
# 0.17, a plain positive int from 0.18 (config/cache.py).
BLOCK_SIZES: List[Tuple[Version, Dict[str, Any]]] = [
    ((0, 5, 0), {"block_sizes": (8, 16, 32)}),  # V0 argparse choices (not re-read; conservative)
    ((0, 8, 0), {"block_sizes": (1, 8, 16, 32, 64, 128)}),
    ((0, 11, 1), {"block_sizes": (1, 8, 16, 32, 64, 128, 256)}),
    ((0, 18, 0), {"block_sizes": None}),
]


def allowed_block_sizes(version: Version) -> Optional[Tuple[int, ...]]:
    return _rows_at(BLOCK_SIZES, version)["block_sizes"]


# --kv-cache-dtype choices the planner can size (CacheDType in config/cache.py).
# bytes: element size in the cache; None = same as the model dtype.
KV_CACHE_DTYPES: Dict[str, Tuple[Version, Optional[int]]] = {
    "auto": ((0, 5, 0), None),
    "fp8": ((0, 5, 0), 1),
    "fp8_e4m3": ((0, 5, 0), 1),
    "fp8_e5m2": ((0, 5, 0), 1),
    "fp8_inc": ((0, 10, 0), 1),
    "bfloat16": ((0, 11, 0), 2),
    "float16": ((0, 18, 0), 2),
}


# --load-format: how vLLM reads the checkpoint; a format is dated to the first sampled release that
# has it (0.8.0: present in 0.8.5, start not checked). The quantization-bound formats (bitsandbytes,
# gguf) are chosen by --quantization and are not offered here
# (evidence: docs/PLANNER-EVIDENCE.md, section 'Load formats by release'). name -> rows (since,
# until), what the format does with the page cache of a unified-memory node, the package the image
# must hold (its import name) and whether it reads onto a CUDA device:
#   "mapped": the checkpoint is mapped and read through the page cache while weights load (the case
#             the guard exists for);
#   "read":   each file is read whole (through the page cache) before its weights are taken;
#   "own":    the format reads with its own buffers, not through the page cache.
LOAD_FORMATS: Dict[str, Dict[str, Any]] = {
    "auto": {"rows": ((0, 5, 0), None), "page_cache": "mapped", "package": None, "gpu": False},
    "safetensors": {"rows": ((0, 5, 0), None), "page_cache": "mapped", "package": None, "gpu": False},
    "hf": {"rows": ((0, 21, 0), None), "page_cache": "mapped", "package": None, "gpu": False},
    "pt": {"rows": ((0, 5, 0), None), "page_cache": "read", "package": None, "gpu": False},
    "npcache": {"rows": ((0, 5, 0), None), "page_cache": "mapped", "package": None, "gpu": False},
    "dummy": {"rows": ((0, 5, 0), None), "page_cache": "own", "package": None, "gpu": False},
    "tensorizer": {"rows": ((0, 5, 0), None), "page_cache": "own", "package": "tensorizer", "gpu": False},
    "sharded_state": {"rows": ((0, 5, 0), None), "page_cache": "mapped", "package": None, "gpu": False},
    "mistral": {"rows": ((0, 8, 0), None), "page_cache": "mapped", "package": None, "gpu": False},
    "runai_streamer": {"rows": ((0, 8, 0), None), "page_cache": "own", "package": "runai_model_streamer", "gpu": False},
    "runai_streamer_sharded": {
        "rows": ((0, 11, 0), None),
        "page_cache": "own",
        "package": "runai_model_streamer",
        "gpu": False,
    },
    "fastsafetensors": {"rows": ((0, 8, 0), None), "page_cache": "own", "package": "fastsafetensors", "gpu": True},
    "instanttensor": {"rows": ((0, 21, 0), None), "page_cache": "own", "package": "instanttensor", "gpu": True},
}

# --safetensors-load-strategy (config/load.py, from 0.11): how the safetensors formats (auto,
# safetensors) read each file; prefetch is in 0.21.0 (not in 0.13.0). torchao (torchao-quantized
# checkpoints) is not offered here.
SAFETENSORS_LOAD_STRATEGIES: Dict[str, Dict[str, Any]] = {
    "lazy": {"rows": ((0, 11, 0), None), "page_cache": "mapped"},
    "eager": {"rows": ((0, 11, 0), None), "page_cache": "read"},
    "prefetch": {"rows": ((0, 21, 0), None), "page_cache": "read"},
}


def load_choice(option: str, table: Dict[str, Dict[str, Any]], value: Any, version: Version) -> Dict[str, Any]:
    """The row of ``value`` in ``table`` (LOAD_FORMATS or SAFETENSORS_LOAD_STRATEGIES), refused
    naming the release when that release lacks it."""
    known = ", ".join(sorted(name for name, row in table.items() if in_ranges(row["rows"], version)))
    if not isinstance(value, str) or value not in table:
        raise UmaError(
            option,
            value,
            "is not a value the planner knows (vLLM %s has: %s)" % (vstr(version), known or "none"),
            "Give one of them, or leave it unset for vLLM's default.",
        )
    row = table[value]
    if not in_ranges(row["rows"], version):
        raise UmaError(
            option,
            value,
            "is not in vLLM %s (it exists in %s)" % (vstr(version), ranges_text(row["rows"])),
            "Give one of %s, or target a vLLM release that has it." % (known or "none (leave it unset)"),
        )
    return row
