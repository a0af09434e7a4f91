# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The planner's shared vocabulary: units, block-size constants, the refusal type and
``PlanContext``, the typed record of every resolved input that the planning steps read.

``_vllm_plan_inputs.resolve_inputs`` fills a ``PlanContext``; the KV cache arithmetic
(``_vllm_plan_kv``), the memory budget (``_vllm_plan_budget``) and the rendering
(``_vllm_plan_render``) only read it, except ``block_size`` (set by ``kv_layout`` once
hybrid alignment is known), ``reserve_bytes`` (derived by the budget step) and ``warnings``.
Pure stdlib, imports under Python 3.8.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError

GIB = 1 << 30
MIB = 1 << 20

# CacheConfig.DEFAULT_BLOCK_SIZE (vllm/config/cache.py): 16 on CUDA for all
# sampled releases. MLA backends on CUDA force 64 (FlashMLA,
# vllm/v1/attention/backends/mla/flashmla.py get_supported_kernel_block_sizes).
DEFAULT_BLOCK_SIZE = 16
DEFAULT_MLA_BLOCK_SIZE = 64
# Smallest kernel block of FlashAttention / FlashInfer (MultipleOf(16)): the
# alignment of the attention block size of hybrid models
# (Platform._align_hybrid_block_size, model_executor/models/config.py
# HybridAttentionMambaModelConfig before 0.20).
KERNEL_BLOCK_ALIGNMENT = 16
MLA_HYBRID_ALIGNMENT = 128

MAMBA_CACHE_MODES = ("none", "align")


class PlanRefused(UmaError):
    """A refusal that also carries the computed numbers (``details``)."""

    def __init__(self, option: str, value: Any, problem: str, fix: str, details: Dict[str, Any]) -> None:
        self.details = details
        super().__init__(option, value, problem, fix)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def gib(nbytes: float) -> float:
    return nbytes / float(GIB)


def format_gib(nbytes: int, style: str) -> str:
    """The GiB figure as vLLM prints it: '%.2f' (<= 0.13) or str(round(x, 2))
    (vllm/utils/mem_utils.py format_gib, 0.14+)."""
    if style == "fixed2":
        return "%.2f" % (nbytes / float(GIB))
    return str(round(nbytes / float(GIB), 2))


@dataclass
class PlanContext:
    """Every input of one plan, validated and resolved (``resolve_inputs`` fills it step by step)."""

    params: Dict[str, Any]
    warnings: List[str] = field(default_factory=list)
    # the target vLLM release and what it does (_vllm_versions.kv_behaviour)
    version: Tuple[int, ...] = ()
    version_text: str = ""
    behaviour: Dict[str, Any] = field(default_factory=dict)
    # the model: its config.json, what _vllm_model.describe_model read from it, its weights
    config: Any = None
    desc: Dict[str, Any] = field(default_factory=dict)
    model: Optional[str] = None
    weights_bytes: Optional[int] = None
    shards: List[Any] = field(default_factory=list)
    # parallelism
    tp: int = 1
    pp: int = 1
    dp: int = 1
    nnodes: int = 1
    node_rank: int = 0
    ranks_per_node: int = 1
    # dtypes and the KV block
    model_dtype: str = ""
    model_dtype_bytes: int = 0
    kv_dtype_name: str = "auto"
    kv_dtype_bytes: int = 0
    conv_state_bytes: int = 0
    ssm_state_bytes: int = 0
    user_block_size: Optional[int] = None
    block_size: int = DEFAULT_BLOCK_SIZE
    # the process environment and the extra argv words of the engine
    env: Dict[str, str] = field(default_factory=dict)
    extra_args: List[str] = field(default_factory=list)
    # memory of the node
    total_bytes: Optional[int] = None
    reserve_bytes: int = 0
    reserve_given: bool = False
    unified: bool = True
    startup: Optional[Dict[str, Any]] = None
    # lengths and batching
    max_model_len: int = 0
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0
    in_flight_tokens: int = 0
    # the KV cache manager's rules for this release
    mamba_cache_mode: str = "none"
    # how vLLM reads the checkpoint (load_format, safetensors_load_strategy; None: vLLM's default)
    load_format: Optional[str] = None
    load_strategy: Optional[str] = None
    load: Dict[str, Any] = field(default_factory=dict)
    hybrid_manager: bool = True
    group_size_rule: str = ""
    check: str = ""
    check_scope: str = ""
    check_null_block: bool = False
    report: str = ""
    concurrency: str = ""
    gib_format: str = ""
    hybrid_align_uses_block_size: bool = False
    enforce_eager: bool = False
    # how the KV budget is chosen
    kv_cache_memory_bytes: Optional[int] = None
    gmu: Optional[float] = None
    activation_override: Optional[float] = None
    kv_budget_mode: str = "fit"
