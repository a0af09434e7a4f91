# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Memory-budget planner for vLLM on unified-memory (and discrete) GPUs.

``plan(params)`` predicts, before anything is launched, what a given vLLM
release will do with a KV cache budget: the KV cache specs of every layer,
the KV cache groups, the number of blocks, and the two numbers vLLM logs
("GPU KV cache size: N tokens", "Maximum concurrency for L tokens per
request"). It then checks that weights + KV cache + activation peak + the
OS/page-cache reserve fit the memory, and emits a ``vllm serve`` argv that
pins the KV budget (``--kv-cache-memory-bytes``) and passes vLLM's startup
free-memory check.

The formulas mirror vLLM's Python sources; each function names the vLLM
file/function it follows. Version differences come from the tables in
``_vllm_versions``; nothing here branches on a version number directly.
Pure stdlib, imports under Python 3.8.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Dict, List, Optional, Tuple

from ansible_collections.uma.vllm.plugins.module_utils import _memavail
from ansible_collections.uma.vllm.plugins.module_utils import _vllm_model as model_mod
from ansible_collections.uma.vllm.plugins.module_utils import _vllm_versions as versions
from ansible_collections.uma.vllm.plugins.module_utils._common import UmaError, require_int

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


# --- input validation ------------------------------------------------------------


def _opt_int(params: Dict[str, Any], name: str, default: Optional[int], minimum: int = 1) -> Optional[int]:
    value = params.get(name)
    if value is None:
        return default
    return require_int(name, value, minimum=minimum)


def _opt_float(params: Dict[str, Any], name: str, minimum: float = 0.0, allow_zero: bool = True) -> Optional[float]:
    value = params.get(name)
    if value is None:
        return None
    if isinstance(value, bool):
        raise UmaError(name, value, "is a boolean, not a number", "Give a number.")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UmaError(name, value, "is not a number", "Give a number such as 128 or 0.5.") from None
    if math.isnan(number) or math.isinf(number):
        raise UmaError(name, value, "is not a finite number", "Give a finite number.")
    if number < minimum or (not allow_zero and number == 0):
        raise UmaError(
            name, value, "must be %s %s" % (">=" if allow_zero else ">", minimum), "Give a non-negative size."
        )
    return number


def _bool(params: Dict[str, Any], name: str, default: bool) -> bool:
    value = params.get(name)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "yes", "1", "on", "false", "no", "0", "off"):
        return value.lower() in ("true", "yes", "1", "on")
    raise UmaError(name, value, "is not a boolean", "Give true or false.")


# --- per-layer KV cache specs (vllm/v1/kv_cache_interface.py) ----------------------


def attention_page_bytes(kind: str, block_size: int, kv_heads: int, head_size: int, dtype_bytes: int) -> int:
    """AttentionSpec.page_size_bytes: coef * block_size * num_kv_heads * head_size * dtype.

    coef is 2 (K and V) for FullAttentionSpec / SlidingWindowSpec and 1 for
    MLAAttentionSpec (one latent per token; FullAttentionSpec(use_mla=True) in
    0.8-0.9). Same formula in every sampled release for the dtypes planned here.
    """
    coef = 1 if kind == "mla" else 2
    return coef * block_size * kv_heads * head_size * dtype_bytes


def state_page_bytes(state: Dict[str, Any], tp: int, conv_bytes: int, ssm_bytes: int) -> int:
    """MambaSpec.page_size_bytes = sum(prod(shape) * dtype) of the state tensors.

    Shapes from MambaStateShapeCalculator (model_executor/layers/mamba/mamba_utils.py):
    gated_delta_net_state_shape: conv (conv_dim / tp, kernel - 1),
    temporal (num_v_heads / tp, head_v_dim, head_k_dim);
    mamba2_state_shape: conv ((intermediate + 2 * n_groups * state) / tp, kernel - 1),
    temporal (num_heads / tp, head_dim, state_size). No speculative tokens.
    """
    if state["family"] == "gated_delta_net":
        conv_dim = state["head_k_dim"] * state["num_k_heads"] * 2 + state["head_v_dim"] * state["num_v_heads"]
        conv = (conv_dim // tp) * (state["conv_kernel"] - 1)
        temporal = (state["num_v_heads"] // tp) * state["head_v_dim"] * state["head_k_dim"]
    else:
        n_groups = state["n_groups"]
        if n_groups % tp:
            # extra_groups_for_head_shards: replicate the groups to every shard.
            n_groups += tp - n_groups
        conv_dim = state["intermediate"] + 2 * n_groups * state["state_size"]
        conv = (conv_dim // tp) * (state["conv_kernel"] - 1)
        temporal = (state["num_heads"] // tp) * state["head_dim"] * state["state_size"]
    return conv * conv_bytes + temporal * ssm_bytes


class Spec:
    """One layer's KV cache spec (per rank): kind, block size, page bytes."""

    __slots__ = ("block_size", "kind", "page", "window")

    def __init__(self, kind: str, block_size: int, page: int, window: Optional[int] = None) -> None:
        self.kind = kind
        self.block_size = block_size
        self.page = page
        self.window = window

    def key(self) -> Tuple[Any, ...]:
        return (self.kind, self.block_size, self.page, self.window)

    def max_memory_usage(self, ctx: Dict[str, Any], max_model_len: int) -> int:
        """KVCacheSpec.max_memory_usage_bytes for one request of max_model_len tokens.

        FullAttentionSpec / MLAAttentionSpec: cdiv(L, block_size) pages.
        SlidingWindowSpec: cdiv(min(window - 1 + in-flight tokens, L), block_size) + 1 pages
        (max_admission_blocks_per_request; in-flight = max_num_batched_tokens, or
        max_concurrent_batches * max_num_batched_tokens from 0.26).
        MambaSpec: 1 page, 2 with mamba_cache_mode 'align'.
        """
        if self.kind in ("full", "mla"):
            return cdiv(max_model_len, self.block_size) * self.page
        if self.kind == "sliding":
            tokens = min(self.window - 1 + ctx["in_flight_tokens"], max_model_len)
            return (cdiv(tokens, self.block_size) + 1) * self.page
        return (2 if ctx["mamba_cache_mode"] == "align" else 1) * self.page


def build_layer_specs(desc: Dict[str, Any], ctx: Dict[str, Any]) -> Tuple[List[Optional[Spec]], Dict[str, Any]]:
    """Spec of every decoder layer (None for layers without cache), per TP rank.

    Mirrors Attention.get_kv_cache_spec / MLAAttention / MambaBase and, for
    hybrid models, Platform._align_hybrid_block_size (0.20+) /
    HybridAttentionMambaModelConfig.verify_and_update_config (0.10-0.19):
    the attention block size grows to the smallest multiple of the kernel
    alignment whose page holds one mamba state, and the state page is padded
    to the attention page.
    """
    tp = ctx["tp"]
    kv_bytes = ctx["kv_dtype_bytes"]
    block_size = ctx["block_size"]
    notes: Dict[str, Any] = {}
    if desc["mla"]:
        head_size = desc["mla"]["kv_lora_rank"] + desc["mla"]["qk_rope_head_dim"]
        kv_heads = 1  # the latent is replicated over TP (ModelConfig.get_num_kv_heads for MLA)
        attn_kind = "mla"
    else:
        head_size = desc["head_dim"]
        kv_heads = max(1, desc["num_kv_heads"] // tp)  # QKVParallelLinear: split or replicate
        attn_kind = "full"
    attn_page_1 = attention_page_bytes(attn_kind, 1, kv_heads, head_size, kv_bytes)
    state_page = None
    if desc["state"] is not None:
        state_page = state_page_bytes(desc["state"], tp, ctx["conv_state_bytes"], ctx["ssm_state_bytes"])
        alignment = KERNEL_BLOCK_ALIGNMENT
        if ctx["hybrid_align_uses_block_size"] and ctx["user_block_size"] is not None:
            alignment = max(alignment, block_size)
        if desc["mla"] and ctx["hybrid_align_uses_block_size"]:
            alignment = max(alignment, MLA_HYBRID_ALIGNMENT)
        attn_block = alignment * cdiv(state_page, alignment * attn_page_1)
        if block_size < attn_block:
            notes["block_size_raised"] = "Setting attention block size to %d tokens" % attn_block
            block_size = attn_block
        padded = block_size * attn_page_1
        if padded > state_page:
            notes["mamba_padding_pct"] = round(100.0 * (padded - state_page) / state_page, 2)
        state_page = padded
    specs: List[Optional[Spec]] = []
    for kind in desc["layer_kinds"]:
        if kind in ("full", "mla"):
            specs.append(
                Spec(attn_kind, block_size, attention_page_bytes(attn_kind, block_size, kv_heads, head_size, kv_bytes))
            )
        elif kind == "sliding":
            page = attention_page_bytes(attn_kind, block_size, kv_heads, head_size, kv_bytes)
            specs.append(Spec("sliding", block_size, page, desc["sliding_window"]))
        elif kind in ("linear", "mamba"):
            specs.append(Spec("state", block_size, state_page))
        else:
            specs.append(None)
    notes.update(
        {
            "block_size": block_size,
            "kv_heads_per_rank": kv_heads,
            "head_size": head_size,
            "attention_page_bytes_per_token": attn_page_1,
            "state_page_bytes": state_page,
        }
    )
    return specs, notes


# --- KV cache groups (vllm/v1/core/kv_cache_utils.py get_kv_cache_groups) --------


def build_groups(specs: List[Optional[Spec]], ctx: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Global KV cache groups: list of {"spec": Spec, "layers": [layer index]}.

    - uniform specs: one group with every layer (_get_kv_cache_groups_uniform_spec);
    - one attention type with different page sizes: one UniformTypeKVCacheSpecs group;
    - hybrid: unify page sizes (unify_kv_cache_spec_page_size), bucket layers by
      spec and split every bucket into groups of group_size layers
      (_get_kv_cache_groups_uniform_page_size; group_size = the smallest bucket,
      or the largest when it is < 1.5x the smallest from 0.18).
    Without the hybrid manager (< 0.9.2 or --disable-hybrid-kv-cache-manager)
    sliding-window layers are promoted to full attention (unify_hybrid_kv_cache_specs).
    """
    layers = [(i, s) for i, s in enumerate(specs) if s is not None]
    if not layers:
        return []
    if not ctx["hybrid_manager"]:
        layers = [(i, Spec("full", s.block_size, s.page) if s.kind == "sliding" else s) for i, s in layers]
    indices = [pair[0] for pair in layers]
    all_specs = [pair[1] for pair in layers]
    keys = {s.key() for s in all_specs}
    if len(keys) == 1:
        return [{"spec": all_specs[0], "layers": indices, "uniform_type": False}]
    kinds = {s.kind for s in all_specs}
    if len(kinds) == 1 and kinds <= {"full", "mla"}:
        return [{"spec": all_specs[0], "layers": indices, "uniform_type": True, "specs": dict(layers)}]
    # unify_kv_cache_spec_page_size: grow the block size of smaller pages.
    max_page = max(s.page for s in all_specs)
    unified = []
    for i, original in layers:
        spec = original
        if spec.page != max_page:
            if max_page % spec.page:
                raise UmaError(
                    "model_config",
                    {"page_sizes": sorted({x.page for x in all_specs})},
                    "the KV page sizes of this hybrid model cannot be unified (vLLM raises NotImplementedError)",
                    "This model cannot run with the hybrid KV cache manager in vLLM.",
                )
            spec = Spec(spec.kind, spec.block_size * (max_page // spec.page), max_page, spec.window)
        unified.append((i, spec))
    buckets: Dict[Tuple[Any, ...], List[int]] = {}
    bucket_spec: Dict[Tuple[Any, ...], Spec] = {}
    for i, s in unified:
        buckets.setdefault(s.key(), []).append(i)
        bucket_spec[s.key()] = s
    sizes = [len(v) for v in buckets.values()]
    group_size = min(sizes)
    if ctx["group_size_rule"] == "max_if_close" and max(sizes) < group_size * 1.5:
        group_size = max(sizes)
    groups = []
    for key, members in buckets.items():
        num_groups = cdiv(len(members), group_size)
        for g in range(num_groups):
            groups.append({"spec": bucket_spec[key], "layers": members[g::num_groups], "uniform_type": False})
    return groups


def project_groups(groups: List[Dict[str, Any]], stage_layers: List[int]) -> List[Dict[str, Any]]:
    """The groups as one pipeline stage sees them (_project_kv_cache_groups_to_worker)."""
    wanted = set(stage_layers)
    projected = []
    for group in groups:
        members = [i for i in group["layers"] if i in wanted]
        item = dict(group)
        item["layers"] = members
        if group.get("uniform_type"):
            item["specs"] = {i: group["specs"][i] for i in members}
        projected.append(item)
    return projected


def bytes_per_block(groups: List[Dict[str, Any]]) -> int:
    """Bytes one block costs across a worker's layers.

    Uniform type: sum of the per-layer pages (UniformTypeKVCacheSpecs).
    Otherwise: page * the largest group's layer count (get_num_blocks(num_layers)
    before 0.29, _get_kv_cache_bytes_per_block from 0.29; alignment is 1 here).
    """
    if not groups:
        return 0
    if len(groups) == 1 and groups[0].get("uniform_type"):
        return sum(s.page for s in groups[0]["specs"].values())
    return max(group["spec"].page * len(group["layers"]) for group in groups)


def blocks_per_request(groups: List[Dict[str, Any]], ctx: Dict[str, Any], max_model_len: int) -> int:
    """Blocks one max_model_len request takes from the shared pool: sum over groups of
    cdiv(max_memory_usage_bytes, page_size_bytes) (get_max_concurrency_for_kv_cache_config)."""
    total = 0
    for group in groups:
        if group.get("uniform_type"):
            spec_list = list(group["specs"].values()) or [group["spec"]]
            usage = sum(s.max_memory_usage(ctx, max_model_len) for s in spec_list)
            total += cdiv(usage, sum(s.page for s in spec_list))
        else:
            spec = group["spec"]
            total += cdiv(spec.max_memory_usage(ctx, max_model_len), spec.page)
    return total


def needed_memory(
    groups: List[Dict[str, Any]], specs: List[Optional[Spec]], stage_layers: List[int], ctx: Dict[str, Any], length: int
) -> int:
    """Bytes vLLM's startup check requires for one request of ``length`` tokens.

    per_layer   (<= 0.13) sum of max_memory_usage_bytes of the worker's layers
                (check_enough_kv_cache_memory);
    first_group (0.14-0.18) group_size * page * cdiv(first group's usage, page);
    sum_groups  (0.19+) group_size * page * sum over groups of cdiv(usage, page)
                (_max_memory_usage_bytes_from_groups; bytes_per_block * blocks from 0.29).
    """
    mode = ctx["check"]
    if mode == "per_layer":
        return sum(specs[i].max_memory_usage(ctx, length) for i in stage_layers if specs[i] is not None)
    groups = [g for g in groups if g["layers"]]
    if not groups:
        return 0
    if len(groups) == 1 and groups[0].get("uniform_type"):
        return sum(s.max_memory_usage(ctx, length) for s in groups[0]["specs"].values())
    per_block = bytes_per_block(groups)
    if mode == "first_group":
        spec = groups[0]["spec"]
        return per_block * cdiv(spec.max_memory_usage(ctx, length), spec.page)
    return per_block * blocks_per_request(groups, ctx, length)


def estimate_max_model_len(need: Callable[[int], int], available: int, upper: int) -> int:
    """Binary search of estimate_max_model_len / _estimate_max_model_len_from_groups."""
    if need(1) > available:
        return 0
    left, right, result = 1, upper, 1
    while left <= right:
        mid = (left + right) // 2
        if need(mid) <= available:
            result = mid
            left = mid + 1
        else:
            right = mid - 1
    return result


def pp_partition(num_layers: int, pp: int, env: Dict[str, str]) -> List[List[int]]:
    """Layer indices per pipeline stage (vllm/distributed/utils.py get_pp_indices)."""
    override = env.get("VLLM_PP_LAYER_PARTITION")
    if override:
        try:
            parts = [int(x) for x in str(override).split(",")]
        except ValueError:
            raise UmaError(
                "env", {"VLLM_PP_LAYER_PARTITION": override}, "is not a comma-separated list", "Give e.g. '14,13'."
            ) from None
        if len(parts) != pp or sum(parts) != num_layers or min(parts) < 0:
            raise UmaError(
                "env",
                {"VLLM_PP_LAYER_PARTITION": override},
                "must name %d stages that add up to %d layers" % (pp, num_layers),
                "Fix VLLM_PP_LAYER_PARTITION or pipeline_parallel_size.",
            )
    else:
        parts = [num_layers // pp] * pp
        remaining = num_layers % pp
        for i in range(2, remaining + 2):
            parts[-i] += 1
    stages, start = [], 0
    for count in parts:
        stages.append(list(range(start, start + count)))
        start += count
    return stages


# --- the KV cache of one budget ---------------------------------------------------


def kv_cache_report(
    groups: List[Dict[str, Any]],
    specs: List[Optional[Spec]],
    stages: List[List[int]],
    ctx: Dict[str, Any],
    available: int,
    max_model_len: int,
) -> Dict[str, Any]:
    """What vLLM computes from ``available`` KV bytes per worker (get_kv_cache_configs)."""
    per_stage = []
    for layers in stages:
        projected = project_groups(groups, layers)
        per_block = bytes_per_block([g for g in projected if g["layers"]] or projected)
        per_stage.append({"groups": projected, "bytes_per_block": per_block, "layers": layers})
    # every worker gets the smallest worker's block count
    num_blocks = min(max(available // s["bytes_per_block"], 0) for s in per_stage if s["bytes_per_block"])
    limiting = max(per_stage, key=lambda s: s["bytes_per_block"])

    def need(length: int, stage: Dict[str, Any]) -> int:
        if ctx["check_scope"] == "global":
            return needed_memory(groups, specs, [i for st in stages for i in st], ctx, length)
        return needed_memory(stage["groups"], specs, stage["layers"], ctx, length)

    check = None
    for stage in per_stage:
        budget = available - (stage["bytes_per_block"] if ctx["check_null_block"] else 0)
        needed = need(max_model_len, stage)
        if needed > budget and (check is None or needed - budget > check["shortfall"]):
            check = {
                "needed": needed,
                "budget": budget,
                "shortfall": needed - budget,
                "estimated_max_model_len": estimate_max_model_len(
                    lambda n, st=stage: need(n, st), budget, max_model_len
                ),
            }
    needed_bytes = max(need(max_model_len, s) for s in per_stage)
    per_request = blocks_per_request([g for g in limiting["groups"] if g["layers"]], ctx, max_model_len)
    if ctx["concurrency"] == "tokens_over_len" or ctx["report"] == "blocks_x_block_size":
        tokens = num_blocks * min(g["spec"].block_size for g in groups)
        concurrency = tokens / float(max_model_len)
    else:
        concurrency = num_blocks / float(per_request) if per_request else 0.0
        if ctx["report"] == "groups_floor":
            tokens = num_blocks // len(groups) * min(g["spec"].block_size for g in groups)
        else:
            tokens = int(concurrency * max_model_len)
    return {
        "num_blocks": num_blocks,
        "bytes_per_block": limiting["bytes_per_block"],
        "blocks_per_request": per_request,
        "kv_tokens": tokens,
        "max_concurrency": concurrency,
        "max_concurrency_logged": "%.2f" % concurrency,
        "kv_needed_bytes": needed_bytes,
        "check": check,
        "stages": per_stage,
    }


# --- memory outside the KV cache ----------------------------------------------------


# What vLLM's profile run adds on top of the weights, calibrated on public start-up logs
# (tests/unit/fixtures/models/activation_observations.yaml; fitted on the rows marked
# "fit", checked on the held-out rows; see test_activation_observations.py).
# Forward pass: the per-token formula below under-counts the logged peak by up to 11%
# (obs14, 0.11.0): x 1.15.
FORWARD_FACTOR = 1.15
# Sampler profile, bytes per element of the [max_num_seqs, vocab] logits, on the rank
# that samples (V0: the driver rank only); the profile samples with top-p/top-k.
# V0 (< 0.8.0): logged peaks 41.2 and 39.2 B per element (PR #10511 Llama-3-8B,
# issue #13882 Qwen2.5-7B) -> 44.
# V1, top-k/top-p by a full sort of the vocab (PyTorch-native default; read in
# v1/sample/ops/topk_topp_sampler.py of 0.15.1): fp32 logits 4 + sorted values 4 + int64
# indices 8 + probs 4 + masks -> 24 (counted from the source; no log found).
# V1 without the sort: 0.11.x uses FlashInfer's sampler (when installed) unless VLLM_USE_FLASHINFER_SAMPLER=0,
# 0.19 a Triton top-k/top-p kernel, 0.21+ FlashInfer by default (read in the 0.11.0,
# 0.19.0, 0.21.0, 0.30.0 wheels): a gpt-oss-20b start on 0.19.0 (myoceane.fr, A100) leaves
# at most 5.6-6.4 B per element (non-torch 0.15-0 GiB) -> 6. Releases not read (0.8-0.10, 0.12-0.14, 0.16-0.18) are
# taken as sorting (the larger figure).
SAMPLER_BYTES_V0 = 44
SAMPLER_BYTES_V1_SORT = 24
SAMPLER_BYTES_V1 = 6


def sampler_bytes_per_element(version: versions.Version) -> int:
    if version < versions.V1_DEFAULT:
        return SAMPLER_BYTES_V0
    if (0, 11, 0) <= version < (0, 12, 0) or version >= (0, 19, 0):
        return SAMPLER_BYTES_V1
    return SAMPLER_BYTES_V1_SORT


# Non-torch memory per rank (NCCL and custom all-reduce buffers, cuBLAS workspaces):
# 0.7.0+ measures it as (device used - torch reserved) since the worker's first
# snapshot (vllm/utils.py MemorySnapshot): logged 0.03-0.30 GiB, growing with TP ->
# 0.15 GiB x TP. 0.6.x counted (device used - baseline - weights - torch allocated
# delta): logged 1.79 GiB at TP 1 and 3.58 GiB at TP 2 (PR #10511, H100) -> 1.8 GiB x TP.
NON_TORCH_PER_TP = GIB * 15 // 100
NON_TORCH_PER_TP_V06 = GIB * 18 // 10


def activation_reserve(desc: Dict[str, Any], ctx: Dict[str, Any]) -> Dict[str, int]:
    """What vLLM's profile run and graph capture add on top of the weights, per rank.

    Not an exact mirror (vLLM measures it, gpu_worker.determine_available_memory);
    calibrated on public logs (FORWARD_FACTOR etc. above):
    - forward: one max_num_batched_tokens forward pass: per token the residual stream
      and norms (4 x hidden), q/k/v per rank and the MLP gate/up/down per rank
      (3 x intermediate / tp), in the model dtype, x FORWARD_FACTOR;
    - sampler: max_num_seqs x vocab x sampler_bytes_per_element(version); vLLM's peak is the larger of
      the two (the forward's activations are freed before the sampler runs), so the
      part that does not set the peak is reported as 0;
    - non_torch: NON_TORCH_PER_TP(_V06) x tensor_parallel_size;
    - cuda_graphs: 1 GiB unless --enforce-eager (logged: 0.49 GiB and a negative
      figure; outside vLLM's budget before 0.21, estimated inside it from 0.21).
    Not modelled: vision/audio encoder profiling of multimodal models (a warning says so).
    Set activation_reserve_gib to override the whole figure.
    """
    tp = ctx["tp"]
    dsz = ctx["model_dtype_bytes"]
    version = ctx["version"]
    q_kv = (desc["num_heads"] + 2 * desc["num_kv_heads"]) * desc["head_dim"] // tp
    per_token = dsz * (4 * desc["hidden_size"] + q_kv + 3 * desc["intermediate_size"] // tp)
    forward = int(ctx["max_num_batched_tokens"] * per_token * FORWARD_FACTOR)
    sampler = ctx["max_num_seqs"] * desc["vocab_size"] * sampler_bytes_per_element(version)
    if forward >= sampler:
        sampler = 0
    else:
        forward = 0
    graphs = 0 if ctx["enforce_eager"] else GIB
    per_tp = NON_TORCH_PER_TP_V06 if version < (0, 7, 0) else NON_TORCH_PER_TP
    non_torch = per_tp * tp
    return {"forward": forward, "sampler": sampler, "cuda_graphs": graphs, "non_torch": non_torch}


def default_batching(total_bytes: Optional[int], gb10_small_tier: bool = False) -> Tuple[int, int]:
    """max_num_batched_tokens / max_num_seqs vLLM picks for `vllm serve`
    (EngineArgs._set_default_max_num_seqs_and_batched_tokens_args, 0.32; get_batch_defaults 0.33):
    >= 160 GiB: 16384 / 1024, >= 70 GiB: 8192 / 1024, else 2048 / 256. From 0.33 a GB10
    (DGX Spark, compute capability 12.1) stays on the small tier: the planner takes a
    unified-memory node below 160 GiB for one."""
    if total_bytes is not None and total_bytes >= 160 * GIB:
        return 16384, 1024
    if total_bytes is not None and total_bytes >= 70 * GIB and not gb10_small_tier:
        return 8192, 1024
    return 2048, 256


# --- the plan ------------------------------------------------------------------


def _validate_parallel(desc: Dict[str, Any], tp: int, pp: int) -> None:
    """The refusals vLLM raises for TP/PP (ModelConfig.verify_with_parallel_config,
    QKVParallelLinear, vllm.distributed.utils.divide)."""
    heads = desc["num_heads"]
    if heads % tp:
        raise UmaError(
            "tensor_parallel_size",
            tp,
            "the model's %d attention heads are not divisible by it (vLLM refuses: "
            "'Total number of attention heads must be divisible by tensor parallel size')" % heads,
            "Use a tensor_parallel_size that divides %d." % heads,
        )
    kv = desc["num_kv_heads"]
    if not desc["mla"] and ((kv >= tp and kv % tp) or (kv < tp and tp % kv)):
        raise UmaError(
            "tensor_parallel_size",
            tp,
            "the model's %d KV heads can neither be split nor replicated evenly over it" % kv,
            "Use a tensor_parallel_size that divides %d or is a multiple of it." % kv,
        )
    state = desc["state"]
    if state is not None:
        heads_name = "linear_num_value_heads" if state["family"] == "gated_delta_net" else "mamba_num_heads"
        count = state["num_v_heads"] if state["family"] == "gated_delta_net" else state["num_heads"]
        if count % tp:
            raise UmaError(
                "tensor_parallel_size",
                tp,
                "the model's %d %s are not divisible by it (vLLM's divide() asserts)" % (count, heads_name),
                "Use a tensor_parallel_size that divides %d." % count,
            )
    if pp > desc["num_layers"]:
        raise UmaError(
            "pipeline_parallel_size",
            pp,
            "is larger than the model's %d layers" % desc["num_layers"],
            "Use at most %d pipeline stages." % desc["num_layers"],
        )


def _kv_dtype(name: Any, version: versions.Version, model_bytes: int) -> int:
    if not isinstance(name, str) or name not in versions.KV_CACHE_DTYPES:
        raise UmaError(
            "kv_cache_dtype",
            name,
            "is not a KV cache dtype the planner can size",
            "Use one of: %s." % ", ".join(versions.KV_CACHE_DTYPES),
        )
    since, size = versions.KV_CACHE_DTYPES[name]
    if version < since:
        raise UmaError(
            "kv_cache_dtype",
            name,
            "is not accepted by vLLM %s (from %s on)" % (versions.vstr(version), versions.vstr(since)),
            "Use 'auto' or 'fp8', or target a newer vLLM.",
        )
    return model_bytes if size is None else size


def _resolve_dtype(option_value: Any, desc: Dict[str, Any]) -> Tuple[str, int]:
    """ModelConfig dtype 'auto': the checkpoint dtype, float32 checkpoints run as
    bfloat16 on CUDA (_resolve_auto_dtype / _get_and_verify_dtype)."""
    name = option_value or "auto"
    if name == "auto":
        name = desc["dtype"]
        if name in ("float32", "float", "fp32"):
            name = "bfloat16"
    if name not in model_mod.DTYPE_BYTES:
        raise UmaError(
            "dtype", option_value, "is not a model dtype vLLM accepts", "Use auto, bfloat16, float16 or float32."
        )
    return name, model_mod.DTYPE_BYTES[name]


def _state_dtype_bytes(value: Any, option: str, fallback: int) -> int:
    if value in (None, "auto"):
        return fallback
    if value not in ("float32", "float16", "bfloat16"):
        raise UmaError(option, value, "is not a mamba state dtype", "Use auto, float32, float16 or bfloat16.")
    return model_mod.DTYPE_BYTES[value]


def _extra_args(params: Dict[str, Any], version: versions.Version, warnings: List[str]) -> List[str]:
    extra = params.get("extra_args") or []
    if isinstance(extra, str):
        raise UmaError("extra_args", extra, "is a string, not a list", "Give one list item per argv word.")
    if not isinstance(extra, list):
        raise UmaError("extra_args", extra, "is not a list", "Give a list such as ['--enforce-eager'].")
    for item in extra:
        if not isinstance(item, (str, int, float)) or isinstance(item, bool):
            raise UmaError("extra_args", item, "is not an argv word", "Give strings such as '--enforce-eager'.")
    words = [str(x) for x in extra]
    owned = tuple(versions.PLANNED_FLAGS) + OWNED_FLAGS
    for word in words:
        if any(c in word for c in "\x00\n\r"):
            raise UmaError("extra_args", word, "contains a NUL or line break", "Give one plain argv word per item.")
        if not word.startswith("-"):
            continue
        if " " in word.split("=", 1)[0] or "\t" in word.split("=", 1)[0]:
            raise UmaError("extra_args", word, "has a space inside a flag", "Give one list item per argv word.")
        flag = canonical_flag(word)
        if flag in SECRET_FLAGS:
            raise UmaError(
                "extra_args",
                flag,
                "puts a secret on the command line (seen in ps, the journal and the 0644 engine config)",
                "Drop it and give the value as the secret %s (vllm_service_engines[].secrets), which vLLM reads "
                "from the 0600 EnvironmentFile." % SECRET_FLAGS[flag],
            )
        abbreviates = flag.startswith("--") and len(flag) > 4 and any(o.startswith(flag) for o in owned)
        if flag in owned or abbreviates:
            planned = flag if flag in owned else next(o for o in owned if o.startswith(flag))
            raise UmaError(
                "extra_args",
                word,
                "sets %s, a flag the planner computes (any spelling: -, _, =value, abbreviation)" % planned,
                "Give the value through the module option instead (%s)." % planned[2:].replace("-", "_"),
            )
        supported = versions.flag_supported(flag, version)
        if supported is False:
            raise UmaError(
                "extra_args",
                word,
                "is rejected by vLLM %s (%s exists in %s)"
                % (versions.vstr(version), flag, versions.flag_range_text(flag)),
                "Drop it or target a vLLM release that has it.",
            )
        if supported is None:
            warnings.append("extra_args flag %s is not in the planner's flag table; passed through unchecked" % flag)
    return words


# --- input validation (bad-input harness, issue 10) ---------------------------------------

# Flags the planner owns besides PLANNED_FLAGS: the model and the dtypes it sizes with.
OWNED_FLAGS = ("--model", "--dtype", "--mamba-cache-mode", "--mamba-cache-dtype", "--mamba-ssm-cache-dtype")
# Secrets vLLM also reads from the environment: never on a command line (ps, journal, 0644 JSON).
SECRET_FLAGS = {"--api-key": "VLLM_API_KEY", "--hf-token": "HF_TOKEN"}
SECRET_ENV_RE = re.compile(r"(TOKEN|API_KEY|APIKEY|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE)
_ADDR_RE = re.compile(r"[A-Za-z0-9._:%\[\]-]{1,253}", re.ASCII)

INT_LIMITS = {
    # option: (minimum, maximum)
    "weights_bytes": (0, 1 << 50),
    "tensor_parallel_size": (1, 4096),
    "pipeline_parallel_size": (1, 4096),
    "data_parallel_size": (1, 4096),
    "data_parallel_size_local": (1, 4096),
    "data_parallel_rpc_port": (1, 65535),
    "data_parallel_start_rank": (0, 4095),
    "nnodes": (1, 4096),
    "node_rank": (0, 4095),
    "master_port": (1, 65535),
    "max_model_len": (1, 1 << 31),
    "max_num_seqs": (1, 1 << 20),
    "max_num_batched_tokens": (1, 1 << 24),
    "block_size": (1, 1 << 16),
    "kv_cache_memory_bytes": (1 << 20, 1 << 50),  # below 1 MiB no KV block of any model fits
    # the node's kernel settings for the MemAvailable model (_memavail): the kernel's own ranges
    "min_free_kbytes": (1, 1 << 40),
    "watermark_scale_factor": (1, 3000),
}
FLOAT_LIMITS = {
    "total_memory_gib": 1 << 20,
    "reserve_gib": 1 << 20,
    "activation_reserve_gib": 1 << 20,
    "node_baseline_gib": 1 << 20,
    "other_engines_gib": 1 << 20,
}
CONFIG_INT_KEYS = (
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "hidden_size",
    "head_dim",
    "intermediate_size",
    "moe_intermediate_size",
    "num_experts_per_tok",
    "experts_per_token",
    "moe_topk",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "sliding_window",
    "sliding_window_pattern",
    "max_window_layers",
    "full_attention_interval",
    "max_position_embeddings",
    "vocab_size",
    "num_experts",
    "n_routed_experts",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
)
CONFIG_SUBS = ("text_config", "llm_config", "language_config", "thinker_config")


def canonical_flag(word: str) -> str:
    """The flag an argv word sets, as vLLM's parser reads it: ``--max_model_len=1`` -> ``--max-model-len``."""
    flag = word.split("=", 1)[0]
    if flag.startswith("--"):
        flag = "--" + flag[2:].replace("_", "-")
    return versions.FLAG_ALIASES.get(flag, flag)


def check_scalars(params: Dict[str, Any]) -> None:
    """Bools, non-finite or absurd numbers, bad ports, addresses and contradictory pairs."""
    for name, (low, high) in INT_LIMITS.items():
        value = params.get(name)
        if value is None:
            continue
        if isinstance(value, bool):
            raise UmaError(name, value, "is a boolean, not a whole number", "Give a whole number.")
        require_int(name, value, minimum=low, maximum=high)
    for name, high in FLOAT_LIMITS.items():
        value = params.get(name)
        if value is None:
            continue
        if isinstance(value, bool):
            raise UmaError(name, value, "is a boolean, not a number", "Give a number.")
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            raise UmaError(name, value, "is not a number", "Give a number such as 12 or 0.5.") from None
        if not math.isfinite(number) or number > high:
            raise UmaError(name, value, "is not a finite number <= %g" % high, "Give a realistic value.")
    for name in ("master_addr", "data_parallel_address"):
        value = params.get(name)
        if value is None:
            continue
        if not isinstance(value, str) or not _ADDR_RE.fullmatch(value):
            raise UmaError(
                name,
                value,
                "is not a host name or IP address (letters, digits, . : - _ [ ] %; no spaces)",
                "Give e.g. 10.0.0.1 or node1.",
            )
    model = params.get("model")
    if model is not None and (
        not isinstance(model, str) or not model.strip() or model.startswith("-") or any(c.isspace() for c in model)
    ):
        raise UmaError("model", model, "is not a model name or path", "Give e.g. meta-llama/Llama-3-8B or /models/x.")
    dp = params.get("data_parallel_size")
    dp = 1 if dp is None else int(dp)
    local = params.get("data_parallel_size_local")
    if local is not None and int(local) > dp:
        raise UmaError(
            "data_parallel_size_local",
            local,
            "is larger than data_parallel_size (%d)" % dp,
            "Give at most data_parallel_size engines per node.",
        )
    start = params.get("data_parallel_start_rank")
    if start is not None and int(start) >= dp:
        raise UmaError(
            "data_parallel_start_rank",
            start,
            "is not below data_parallel_size (%d)" % dp,
            "Give a start rank from 0 to data_parallel_size - 1.",
        )
    if start is not None and local is not None and int(start) + int(local) > dp:
        raise UmaError(
            "data_parallel_start_rank",
            start,
            "plus data_parallel_size_local (%s) exceeds data_parallel_size (%d)" % (local, dp),
            "Give ranks that fit in data_parallel_size.",
        )
    env = params.get("env") or {}
    if isinstance(env, dict):
        for key, value in env.items():
            if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise UmaError("env", key, "is not an environment variable name", "Use letters, digits and '_'.")
            if SECRET_ENV_RE.search(key):
                raise UmaError(
                    "env",
                    key,
                    "looks like a secret; env values reach the engine's 0644 config, launch records and results",
                    "Give it to the role as a secret (vllm_service_engines[].secrets: {%s: ...}), which reaches "
                    "only the engine's 0600 EnvironmentFile; the planner does not need it." % key,
                )
            if isinstance(value, (dict, list)) or (isinstance(value, str) and ("\x00" in value or "\n" in value)):
                raise UmaError(
                    "env", {key: "..."}, "has a value that is not one line of text", "Give a plain string value."
                )


def check_model_config(config: Any, option: str, depth: int = 0) -> None:
    """Types of the config keys the planner reads, before it reads them."""
    if not isinstance(config, dict):
        return
    for key in CONFIG_INT_KEYS:
        value = config.get(key)
        if value is None:
            continue
        # sizes of real models stay far below these (the largest vocabularies are ~2**18)
        limit = (1 << 31) if key in ("max_position_embeddings", "sliding_window") else (1 << 24)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < limit:
            raise UmaError(
                option,
                {key: value},
                "'%s' is not a whole number from 0 to %d (config.json holds numbers, not strings)" % (key, limit),
                "Fix the value in config.json.",
            )
    archs = config.get("architectures")
    if archs is not None and not isinstance(archs, str):
        if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
            raise UmaError(option, {"architectures": archs}, "is not a list of class names", "Fix config.json.")
    for key in ("model_type", "torch_dtype", "dtype"):
        value = config.get(key)
        if value is not None and not isinstance(value, str):
            raise UmaError(option, {key: value}, "'%s' is not a string" % key, "Fix config.json.")
    layer_types = config.get("layer_types")
    if layer_types is not None and not isinstance(layer_types, str):
        if not isinstance(layer_types, list) or not all(isinstance(t, str) for t in layer_types):
            raise UmaError(option, {"layer_types": layer_types}, "is not a list of layer kinds", "Fix config.json.")
    heads, kv_heads = config.get("num_attention_heads"), config.get("num_key_value_heads")
    if isinstance(heads, int) and isinstance(kv_heads, int) and kv_heads > 0 and heads % kv_heads:
        raise UmaError(
            option,
            {"num_attention_heads": heads, "num_key_value_heads": kv_heads},
            "num_key_value_heads does not divide num_attention_heads",
            "Fix config.json (grouped-query attention needs heads = groups x KV heads).",
        )
    if depth < 2:
        for key in CONFIG_SUBS:
            sub = config.get(key)
            if sub is not None and not isinstance(sub, dict):
                raise UmaError(option, {key: sub}, "'%s' is not a mapping" % key, "Fix config.json.")
            check_model_config(sub, option, depth + 1)


def _require_flag(flag: str, version: versions.Version, option: str, value: Any) -> None:
    if not versions.flag_supported(flag, version):
        raise UmaError(
            option,
            value,
            "needs %s, which vLLM %s rejects (it exists in %s)"
            % (flag, versions.vstr(version), versions.flag_range_text(flag)),
            "Target a vLLM release that has %s or drop %s." % (flag, option),
        )


def resolve_inputs(params: Dict[str, Any]) -> Dict[str, Any]:
    """Validate every option and read the model; nothing is touched."""
    warnings: List[str] = []
    version_text = params.get("vllm_version") or versions.DEFAULT_VERSION
    version = versions.parse_version("vllm_version", version_text)
    if version > versions.NEWEST_KNOWN:
        warnings.append(
            "vLLM %s is newer than the newest release the planner was read from (%s); planned like it"
            % (versions.vstr(version), versions.vstr(versions.NEWEST_KNOWN))
        )
    behaviour = versions.kv_behaviour(version)
    if version < versions.V1_DEFAULT:
        warnings.append(
            "vLLM %s runs the V0 engine: planned with the uniform KV arithmetic it shares with V1 "
            "(num_gpu_blocks x block_size); V0 logs '# GPU blocks' instead of 'GPU KV cache size'"
            % versions.vstr(version)
        )

    model_path = params.get("model_path")
    model_config = params.get("model_config")
    if model_path and model_config:
        raise UmaError(
            "model_config", "<given>", "is given together with model_path", "Give one of model_path or model_config."
        )
    weights_bytes = _opt_int(params, "weights_bytes", None, minimum=0)
    if model_path:
        read = model_mod.read_model_dir(model_path)
        config = read["config"]
        if weights_bytes is None:
            weights_bytes = read["weights_bytes"]
        shards = read["shards"]
    elif model_config is not None:
        config = model_config
        shards = []
    else:
        raise UmaError("model_path", None, "neither model_path nor model_config is given", "Give one of them.")
    config_option = "model_path" if model_path else "model_config"
    check_model_config(config, config_option)
    try:
        desc = model_mod.describe_model(config, config_option)
    except UmaError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, ZeroDivisionError, OverflowError) as err:
        raise UmaError(
            config_option,
            "<config.json>",
            "cannot be read as a model config (%s: %s)" % (type(err).__name__, err),
            "Give the unmodified config.json of a Hugging Face model.",
        ) from None
    check_scalars(params)

    tp = _opt_int(params, "tensor_parallel_size", 1)
    pp = _opt_int(params, "pipeline_parallel_size", 1)
    dp = _opt_int(params, "data_parallel_size", 1)
    nnodes = _opt_int(params, "nnodes", 1)
    node_rank = _opt_int(params, "node_rank", 0, minimum=0)
    if node_rank >= nnodes:
        raise UmaError("node_rank", node_rank, "must be below nnodes (%d)" % nnodes, "Number nodes 0 .. nnodes-1.")
    world = tp * pp
    if nnodes > 1:
        _require_flag("--nnodes", version, "nnodes", nnodes)
        if (world * dp) % nnodes:
            raise UmaError(
                "nnodes",
                nnodes,
                "does not divide the %d ranks (tp %d x pp %d x dp %d)" % (world * dp, tp, pp, dp),
                "Use a node count that divides the world size.",
            )
        if not params.get("master_addr"):
            raise UmaError("master_addr", None, "is required when nnodes > 1", "Give the address of node 0.")
    dp_local = _opt_int(params, "data_parallel_size_local", None)
    # ranks whose memory one node holds: this node's share of the TP x PP ranks,
    # times the data parallel engines running on it
    ranks_per_node = max(1, world // nnodes) * (dp_local if dp_local is not None else dp)
    _validate_parallel(desc, tp, pp)

    model_dtype, model_dtype_bytes = _resolve_dtype(params.get("dtype"), desc)
    kv_dtype_name = params.get("kv_cache_dtype") or "auto"
    kv_dtype_bytes = _kv_dtype(kv_dtype_name, version, model_dtype_bytes)

    user_block_size = _opt_int(params, "block_size", None)
    if user_block_size is not None:
        allowed = versions.allowed_block_sizes(version)
        if allowed is not None and user_block_size not in allowed:
            raise UmaError(
                "block_size",
                user_block_size,
                "is not accepted by vLLM %s (--block-size choices %s)" % (versions.vstr(version), list(allowed)),
                "Use one of %s." % ", ".join(str(x) for x in allowed),
            )
    block_size = user_block_size or (DEFAULT_MLA_BLOCK_SIZE if desc["mla"] else DEFAULT_BLOCK_SIZE)

    env = params.get("env") or {}
    if not isinstance(env, dict):
        raise UmaError("env", env, "is not a mapping", "Give a dict of environment variables.")
    env = {str(k): str(v) for k, v in env.items()}

    total_gib = _opt_float(params, "total_memory_gib", allow_zero=False)
    total_bytes = int(total_gib * GIB) if total_gib is not None else None
    reserve_gib = _opt_float(params, "reserve_gib")
    reserve_bytes = int((reserve_gib or 0.0) * GIB)
    unified = _bool(params, "unified_memory", True)
    startup = None
    if unified and total_bytes is not None:
        startup = _startup_model(params, total_bytes)

    max_position = desc["max_position_embeddings"]
    max_model_len = _opt_int(params, "max_model_len", None)
    if max_model_len is None:
        if max_position is None:
            raise UmaError(
                "max_model_len",
                None,
                "is not given and the config has no max_position_embeddings",
                "Give max_model_len.",
            )
        max_model_len = max_position
    elif max_position is not None and max_model_len > max_position and env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") != "1":
        raise UmaError(
            "max_model_len",
            max_model_len,
            "is larger than the model's max_position_embeddings (%d); vLLM refuses it" % max_position,
            "Lower max_model_len or set env VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 if the model really supports it.",
        )
    default_mnbt, default_seqs = default_batching(total_bytes, unified and behaviour["gb10_small_batch_tier"])
    max_num_batched_tokens = _opt_int(params, "max_num_batched_tokens", default_mnbt)
    max_num_seqs = _opt_int(params, "max_num_seqs", default_seqs)
    if max_num_batched_tokens < max_num_seqs:
        raise UmaError(
            "max_num_batched_tokens",
            max_num_batched_tokens,
            "is below max_num_seqs (%d); vLLM's SchedulerConfig refuses that" % max_num_seqs,
            "Raise max_num_batched_tokens or lower max_num_seqs.",
        )

    extra = _extra_args(params, version, warnings)
    # Prefix caching decides the mamba cache mode (MambaModelConfig.verify_and_update_config):
    # on -> 'align' (2 state blocks per request), off -> 'none'.
    given_mode = params.get("mamba_cache_mode")
    if given_mode is not None and behaviour["mamba_mode_follows_prefix_caching"]:
        warnings.append(
            "mamba_cache_mode %r is ignored by vLLM %s (--mamba-cache-mode is deprecated there; the mamba "
            "mode follows prefix caching): planned with the mode prefix caching gives"
            % (given_mode, versions.vstr(version))
        )
        given_mode = None
    mamba_mode = given_mode or behaviour["mamba_default_mode"]
    prefix_off = "--no-enable-prefix-caching" in extra or "--disable-prefix-caching" in extra
    if given_mode is None and prefix_off:
        mamba_mode = "none"
    elif given_mode is None and "--enable-prefix-caching" in extra and version >= (0, 15, 0):
        mamba_mode = "align"
    if mamba_mode not in MAMBA_CACHE_MODES:
        raise UmaError(
            "mamba_cache_mode",
            mamba_mode,
            "is not a mode the planner models",
            "Use 'none' or 'align' (the 'all' mode is not modelled).",
        )
    if desc["state"] is not None and not behaviour["hybrid_state_layers"]:
        raise UmaError(
            "vllm_version",
            version_text,
            "has no V1 KV cache support for linear-attention / mamba layers (needs vLLM >= 0.10.0)",
            "Target vLLM 0.10.0 or newer for this model.",
        )
    conv_bytes = _state_dtype_bytes(params.get("mamba_cache_dtype"), "mamba_cache_dtype", model_dtype_bytes)
    ssm_default = conv_bytes
    if desc["state"] is not None and desc["state"].get("ssm_dtype"):
        ssm_default = _state_dtype_bytes(desc["state"]["ssm_dtype"], "model_config", conv_bytes)
    ssm_bytes = _state_dtype_bytes(params.get("mamba_ssm_cache_dtype"), "mamba_ssm_cache_dtype", ssm_default)

    disable_hybrid = "--disable-hybrid-kv-cache-manager" in extra
    enforce_eager = "--enforce-eager" in extra
    if behaviour["in_flight"] == "async_batches":
        in_flight = (pp + 1) * max_num_batched_tokens
    else:
        in_flight = max_num_batched_tokens

    kv_cache_memory_bytes = _opt_int(params, "kv_cache_memory_bytes", None, minimum=1)
    gmu = _opt_float(params, "gpu_memory_utilization", allow_zero=False)
    if gmu is not None and gmu > 1.0:
        raise UmaError("gpu_memory_utilization", gmu, "must be in (0, 1]", "Give a fraction such as 0.85.")
    activation_override = _opt_float(params, "activation_reserve_gib")
    encoders = sorted(k for k in ("vision_config", "audio_config") if isinstance(config, dict) and k in config)
    if encoders and activation_override is None:
        warnings.append(
            "the model has %s: the activation reserve models the language model's forward pass and "
            "sampler only, not the encoder's profile run (a public log of Llama-3.2-11B-Vision shows "
            "36.6 GiB); measure it and give activation_reserve_gib" % " and ".join(encoders)
        )
    kv_budget_mode = params.get("kv_budget") or "fit"
    if kv_budget_mode not in ("fit", "max"):
        raise UmaError("kv_budget", kv_budget_mode, "is not a KV budget mode", "Use 'fit' or 'max'.")

    ctx = {
        "version": version,
        "tp": tp,
        "pp": pp,
        "dp": dp,
        "nnodes": nnodes,
        "node_rank": node_rank,
        "ranks_per_node": ranks_per_node,
        "block_size": block_size,
        "user_block_size": user_block_size,
        "kv_dtype_name": kv_dtype_name,
        "kv_dtype_bytes": kv_dtype_bytes,
        "model_dtype": model_dtype,
        "model_dtype_bytes": model_dtype_bytes,
        "conv_state_bytes": conv_bytes,
        "ssm_state_bytes": ssm_bytes,
        "max_model_len": max_model_len,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens,
        "in_flight_tokens": in_flight,
        "mamba_cache_mode": mamba_mode if desc["state"] is not None else "none",
        "hybrid_manager": behaviour["hybrid_manager"] and not disable_hybrid,
        "group_size_rule": behaviour["group_size"],
        "check": behaviour["check"],
        "check_scope": behaviour["check_scope"],
        "check_null_block": behaviour["check_null_block"],
        "report": behaviour["report"],
        "concurrency": behaviour["concurrency"],
        "gib_format": behaviour["gib_format"],
        "hybrid_align_uses_block_size": version >= (0, 20, 0),
        "enforce_eager": enforce_eager,
        "total_bytes": total_bytes,
        "reserve_bytes": reserve_bytes,
        "reserve_given": reserve_gib is not None,
        "startup": startup,
        "unified": unified,
        "kv_cache_memory_bytes": kv_cache_memory_bytes,
        "gmu": gmu,
        "activation_override": activation_override,
        "kv_budget_mode": kv_budget_mode,
        "weights_bytes": weights_bytes,
        "env": env,
        "extra_args": extra,
        "warnings": warnings,
        "shards": shards,
        "model": params.get("model") or model_path,
        "params": params,
    }
    return {"desc": desc, "ctx": ctx}


def _startup_model(params: Dict[str, Any], total_bytes: int) -> Dict[str, Any]:
    """Expected MemAvailable when the engine starts on a unified-memory node
    (_memavail.expected_available: the rule uma_sysctl sizes the reserve with)."""
    mfk = _opt_int(params, "min_free_kbytes", None, minimum=1)
    wsf = _opt_int(params, "watermark_scale_factor", None, minimum=1)
    baseline = _opt_float(params, "node_baseline_gib")
    others = _opt_float(params, "other_engines_gib")
    model = _memavail.expected_available(
        total_bytes,
        min_free_kbytes=mfk,
        scale_factor=wsf,
        baseline_bytes=None if baseline is None else int(baseline * GIB),
        other_engines_bytes=int((others or 0.0) * GIB),
    )
    model["reserve_bytes"] = total_bytes - model["available_bytes"]
    model["text"] = (
        "node baseline %.2f GiB (%s) + watermark reserve %.2f GiB (vm.min_free_kbytes %d from %s, "
        "watermark_scale_factor %d; kernel si_mem_available) + other engines %.2f GiB"
        % (
            gib(model["baseline_bytes"]),
            "node_baseline_gib" if model["baseline_source"] == "given" else "default",
            gib(model["watermark_reserve_bytes"]),
            model["min_free_kbytes"],
            model["min_free_kbytes_source"],
            model["watermark_scale_factor"],
            gib(model["other_engines_bytes"]),
        )
    )
    return model


def _apply_startup_reserve(ctx: Dict[str, Any]) -> Optional[str]:
    """Unified memory: the reserve must cover what the node keeps out of MemAvailable
    at start. Without reserve_gib it is derived; a given one below it is refused.
    Returns where the reserve came from."""
    model = ctx["startup"]
    if model is None:
        return "reserve_gib" if ctx["reserve_given"] else None
    needed = model["reserve_bytes"]
    if not ctx["reserve_given"]:
        ctx["reserve_bytes"] = needed
        return "derived: " + model["text"]
    floor = ctx["total_bytes"] - model["available_at_most_bytes"]
    if ctx["reserve_bytes"] < floor:
        total = ctx["total_bytes"]
        raise PlanRefused(
            "reserve_gib",
            ctx["params"].get("reserve_gib"),
            "is below what the node always keeps out of MemAvailable at start: MemAvailable will be at most "
            "%.2f GiB of %.2f GiB (node_baseline_gib %.2f GiB + the kernel's totalreserve_pages %.2f GiB [high "
            "watermark + lowmem reserve of min_free_kbytes %d, watermark_scale_factor %d] + other_engines_gib "
            "%.2f GiB), so a plan using %.2f GiB fails vLLM's startup free-memory check"
            % (
                gib(model["available_at_most_bytes"]),
                gib(total),
                gib(model["baseline_bytes"] if model["baseline_source"] == "given" else 0),
                gib(model["watermarks"]["floor_bytes"]),
                model["min_free_kbytes"],
                model["watermark_scale_factor"],
                gib(model["other_engines_bytes"]),
                gib(total - ctx["reserve_bytes"]),
            ),
            "Give reserve_gib >= %.2f (omit it and the planner derives %.2f with the page-cache and slab "
            "watermark terms); if the node really keeps less, give its min_free_kbytes / "
            "watermark_scale_factor / node_baseline_gib / other_engines_gib."
            % (math.ceil(gib(floor) * 100) / 100.0, math.ceil(gib(needed) * 100) / 100.0),
            {
                "reserve_bytes": ctx["reserve_bytes"],
                "reserve_floor_bytes": floor,
                "reserve_needed_bytes": needed,
                "expected_available_bytes": model["available_bytes"],
                "startup_model": {k: v for k, v in model.items() if k not in ("description", "text")},
            },
        )
    if ctx["reserve_bytes"] < needed:
        ctx["warnings"].append(
            "reserve_gib %.2f is below the modelled %.2f GiB (%s): vLLM's startup check passes only while the page "
            "cache and reclaimable slab stay below twice the low watermark (%.2f GiB); the launcher's admission "
            "check compares the real MemAvailable"
            % (gib(ctx["reserve_bytes"]), gib(needed), model["text"], gib(2 * model["watermarks"]["low_bytes"]))
        )
        return "reserve_gib (below the modelled %.2f GiB, above the %.2f GiB floor)" % (gib(needed), gib(floor))
    return "reserve_gib (covers the modelled %.2f GiB: %s)" % (gib(needed), model["text"])


def plan(params: Dict[str, Any]) -> Dict[str, Any]:
    """Compute the budget, the KV cache prediction, argv and env; raise on refusal."""
    resolved = resolve_inputs(params)
    desc, ctx = resolved["desc"], resolved["ctx"]
    specs, spec_notes = build_layer_specs(desc, ctx)
    ctx["block_size"] = spec_notes["block_size"]
    groups = build_groups(specs, ctx)
    stages = pp_partition(desc["num_layers"], ctx["pp"], ctx["env"])
    tp, pp = ctx["tp"], ctx["pp"]
    version = ctx["version"]
    warnings = ctx["warnings"]
    if ctx["model"] is None:
        raise UmaError(
            "model", None, "is needed for argv when model_path is not given", "Give model (a path or a model id)."
        )

    weights = ctx["weights_bytes"]
    if weights is None and ctx["total_bytes"] is not None:
        raise UmaError("weights_bytes", None, "is required with model_config to check the fit", "Give weights_bytes.")
    # Weights spread evenly over the ranks (embeddings and norms are in fact
    # replicated; this slightly under-counts the per-rank share).
    weights_per_rank = cdiv(weights, tp * pp) if weights is not None else 0
    if ctx["activation_override"] is not None:
        act = {"override": int(ctx["activation_override"] * GIB)}
    else:
        act = activation_reserve(desc, ctx)
    act_bytes = sum(act.values())
    reserve_source = _apply_startup_reserve(ctx)
    reserve = ctx["reserve_bytes"]
    total = ctx["total_bytes"]
    unified = ctx["unified"]
    # Unified memory: the ranks of a node share its memory. Discrete: total is
    # one GPU's memory and every rank has its own GPU.
    ranks = ctx["ranks_per_node"] if unified else 1

    # --- the KV budget per rank
    if ctx["kv_cache_memory_bytes"] is not None:
        kv_budget = ctx["kv_cache_memory_bytes"]
        kv_source = "kv_cache_memory_bytes"
    elif total is None:
        raise UmaError(
            "total_memory_gib",
            None,
            "is needed to size the KV cache when kv_cache_memory_bytes is not given",
            "Give total_memory_gib (UMA: host RAM; discrete: GPU memory) or kv_cache_memory_bytes.",
        )
    elif ctx["gmu"] is not None:
        kv_budget = math.ceil(total * ctx["gmu"]) - weights_per_rank - act_bytes
        kv_source = "gpu_memory_utilization"
    elif unified:
        kv_budget = (total - reserve) // ranks - weights_per_rank - act_bytes
        kv_source = "total_memory_gib - reserve_gib"
        if ctx["kv_budget_mode"] == "fit" and kv_budget > 0:
            # Claim only what max_num_seqs full-length sequences use, plus the
            # null block, so engines sharing the node keep the rest.
            probe = kv_cache_report(groups, specs, stages, ctx, kv_budget, ctx["max_model_len"])
            wanted = probe["bytes_per_block"] * (ctx["max_num_seqs"] * probe["blocks_per_request"] + 1)
            if wanted < kv_budget:
                kv_budget = wanted
                kv_source = "max_num_seqs x max_model_len"
    else:
        kv_budget = math.ceil(total * 0.9) - weights_per_rank - act_bytes
        kv_source = "vLLM default gpu_memory_utilization 0.9"

    base_budget = {
        "weights_bytes": weights,
        "weights_per_rank_bytes": weights_per_rank,
        "activation_reserve_bytes": act_bytes,
        "activation_parts": act,
        "reserve_bytes": reserve,
        "reserve_source": reserve_source,
        "expected_available_bytes": ctx["startup"]["available_bytes"] if ctx["startup"] else None,
        "total_memory_bytes": total,
        "ranks_per_node": ranks,
        "kv_budget_source": kv_source,
        "block_size": ctx["block_size"],
        "kv_cache_groups": len(groups),
        "layers_with_cache": sum(1 for s in specs if s is not None),
        "page_bytes": groups[0]["spec"].page if groups else 0,
        "bytes_per_token": _bytes_per_token(specs, stages),
        "vllm_version": versions.vstr(version),
    }

    def refuse_with_fit(kv_avail: int, problem: str, option: str, value: Any, extra_details: Dict[str, Any]) -> None:
        fits_len = 0
        seqs = 0
        if kv_avail > 0:
            report_any = kv_cache_report(groups, specs, stages, ctx, kv_avail, ctx["max_model_len"])
            budget_check = kv_avail - (report_any["bytes_per_block"] if ctx["check_null_block"] else 0)
            stage_need = _stage_need(groups, specs, stages, ctx)
            fits_len = estimate_max_model_len(stage_need, budget_check, ctx["max_model_len"])
            if fits_len:
                at_len = kv_cache_report(groups, specs, stages, ctx, kv_avail, fits_len)
                seqs = int(at_len["max_concurrency"])
        details = dict(base_budget)
        details.update(extra_details)
        details["largest_max_model_len"] = fits_len
        details["largest_max_num_seqs"] = seqs
        fix = (
            "Largest max_model_len that fits: %d (with up to %d concurrent full-length sequences); "
            "or free memory, lower reserve_gib, use kv_cache_dtype fp8 or more tensor_parallel_size." % (fits_len, seqs)
            if fits_len
            else "Not even one token of KV cache fits: free memory, lower reserve_gib or use more GPUs."
        )
        raise PlanRefused(option, value, problem, fix, details)

    if kv_budget <= 0:
        refuse_with_fit(
            0,
            "no memory is left for the KV cache: weights %.2f GiB + activations %.2f GiB per rank%s"
            % (
                gib(weights_per_rank),
                gib(act_bytes),
                "" if total is None else " + reserve %.2f GiB of %.2f GiB" % (gib(reserve), gib(total)),
            ),
            kv_source.split(" ", 1)[0],
            _show_option(params, kv_source),
            {"kv_cache_bytes": kv_budget},
        )

    report = kv_cache_report(groups, specs, stages, ctx, kv_budget, ctx["max_model_len"])
    needed = report["kv_needed_bytes"]
    if report["check"] is not None:
        chk = report["check"]
        message = (
            "to serve one request of max_model_len %d vLLM %s needs %s GiB of KV cache but the budget is %s GiB "
            "(vLLM: 'To serve at least one request with the model's max seq len (%d), (%s GiB KV cache is needed, "
            "which is larger than the available KV cache memory (%s GiB)')"
            % (
                ctx["max_model_len"],
                versions.vstr(version),
                format_gib(chk["needed"], ctx["gib_format"]),
                format_gib(chk["budget"], ctx["gib_format"]),
                ctx["max_model_len"],
                format_gib(chk["needed"], ctx["gib_format"]),
                format_gib(chk["budget"], ctx["gib_format"]),
            )
        )
        details = {
            "kv_cache_bytes": kv_budget,
            "kv_needed_bytes": chk["needed"],
            "kv_needed_gib_logged": format_gib(chk["needed"], ctx["gib_format"]),
            "kv_available_gib_logged": format_gib(chk["budget"], ctx["gib_format"]),
            "estimated_max_model_len": chk["estimated_max_model_len"],
        }
        refuse_with_fit(kv_budget, message, "max_model_len", ctx["max_model_len"], details)

    footprint_rank = weights_per_rank + act_bytes + kv_budget
    gmu = ctx["gmu"]
    if total is not None and gmu is not None and unified and math.ceil(total * gmu) * ranks + reserve > total:
        raise UmaError(
            "gpu_memory_utilization",
            gmu,
            "asks for %.2f GiB per rank, which with the %.2f GiB reserve exceeds the %.2f GiB node"
            % (gib(total * gmu), gib(reserve), gib(total)),
            "Lower it to at most %.3f or omit it to let the planner choose."
            % ((total - reserve) / float(ranks) / total),
        )
    if total is not None:
        node_need = ranks * footprint_rank + reserve
        if node_need > total:
            kv_room = (total - reserve) // ranks - weights_per_rank - act_bytes
            refuse_with_fit(
                kv_room,
                "the plan needs %.2f GiB per node (%d rank(s) x [weights %.2f + activations %.2f + KV %.2f] "
                "+ reserve %.2f) but the node has %.2f GiB"
                % (
                    gib(node_need),
                    ranks,
                    gib(weights_per_rank),
                    gib(act_bytes),
                    gib(kv_budget),
                    gib(reserve),
                    gib(total),
                ),
                "total_memory_gib",
                params.get("total_memory_gib"),
                {"kv_cache_bytes": kv_budget, "kv_needed_bytes": needed, "kv_room_bytes": kv_room},
            )
        if gmu is None:
            # request_memory (v1/worker/utils.py): requested = ceil(total * gmu) must be
            # <= free memory at startup; on UMA free memory is MemAvailable
            # (MemorySnapshot.measure uses psutil for integrated GPUs, 0.11+).
            lowest = footprint_rank / float(total)
            highest = (total - reserve) / float(ranks) / total
            gmu = min(math.ceil(lowest * 1000) / 1000.0, math.floor(highest * 1000) / 1000.0)
            gmu = max(gmu, 0.001)
    elif gmu is None and unified:
        warnings.append(
            "total_memory_gib not given: --gpu-memory-utilization is not emitted and the fit is not checked"
        )

    budget = dict(base_budget)
    budget.update(
        {
            "kv_cache_bytes": kv_budget,
            "num_blocks": report["num_blocks"],
            "bytes_per_block": report["bytes_per_block"],
            "blocks_per_request": report["blocks_per_request"],
            "kv_tokens": report["kv_tokens"],
            "max_concurrency": round(report["max_concurrency"], 4),
            "max_concurrency_logged": report["max_concurrency_logged"],
            "kv_needed_bytes": needed,
            "kv_needed_gib_logged": format_gib(needed, ctx["gib_format"]),
            "gpu_memory_utilization": gmu,
            "requested_memory_bytes": math.ceil(total * gmu) if (total is not None and gmu is not None) else None,
            "free_after_plan_bytes": (total - ranks * footprint_rank) if total is not None else None,
            "mamba_padding_pct": spec_notes.get("mamba_padding_pct"),
            "kv_heads_per_rank": spec_notes["kv_heads_per_rank"],
            "mamba_cache_mode": ctx["mamba_cache_mode"],
            "pp_layers": [len(s) for s in stages],
        }
    )
    argv, argv_notes = build_argv(ctx, kv_budget, gmu)
    warnings.extend(argv_notes)
    log_lines = [
        "GPU KV cache size: {:,} tokens".format(report["kv_tokens"]),
        "Maximum concurrency for {:,} tokens per request: {}x".format(
            ctx["max_model_len"], report["max_concurrency_logged"]
        ),
    ]
    if spec_notes.get("block_size_raised"):
        log_lines.insert(
            0, spec_notes["block_size_raised"] + " to ensure that attention page size is >= mamba page size."
        )
    return {
        "argv": argv,
        "env": dict(ctx["env"]),
        "budget": budget,
        "expected_log": log_lines,
        "warnings": warnings,
        "msg": budget_table(budget, ctx, desc),
        "model": {
            "architecture": desc["architecture"],
            "model_type": desc["model_type"],
            "layer_kinds": _kinds_summary(desc["layer_kinds"]),
            "dtype": ctx["model_dtype"],
        },
    }


def _stage_need(
    groups: List[Dict[str, Any]], specs: List[Optional[Spec]], stages: List[List[int]], ctx: Dict[str, Any]
):
    def need(length: int) -> int:
        if ctx["check_scope"] == "global":
            return needed_memory(groups, specs, [i for st in stages for i in st], ctx, length)
        return max(needed_memory(project_groups(groups, st), specs, st, ctx, length) for st in stages)

    return need


def _bytes_per_token(specs: List[Optional[Spec]], stages: List[List[int]]) -> int:
    """KV bytes one token costs on the busiest rank, counting only layers whose
    cache grows with the sequence (full attention / MLA)."""
    best = 0
    for stage in stages:
        total = 0
        for i in stage:
            spec = specs[i]
            if spec is not None and spec.kind in ("full", "mla"):
                total += spec.page // spec.block_size
        best = max(best, total)
    return best


def _kinds_summary(kinds: List[str]) -> Dict[str, int]:
    summary: Dict[str, int] = {}
    for kind in kinds:
        summary[kind] = summary.get(kind, 0) + 1
    return summary


def _show_option(params: Dict[str, Any], source: str) -> Any:
    name = source.split(" ", maxsplit=1)[0]
    return params.get(name)


def build_argv(ctx: Dict[str, Any], kv_budget: int, gmu: Optional[float]) -> Tuple[List[str], List[str]]:
    """``vllm serve MODEL ...``: only flags the target release parses (FLAGS table)."""
    version = ctx["version"]
    notes: List[str] = []
    argv = ["vllm", "serve", str(ctx["model"])]

    def add(flag: str, value: Any = None) -> None:
        if not versions.flag_supported(flag, version):
            raise UmaError(
                "vllm_version",
                versions.vstr(version),
                "does not accept %s, which this plan needs (%s)" % (flag, versions.flag_range_text(flag)),
                "Target a vLLM release that has it.",
            )
        argv.append(flag)
        if value is not None:
            argv.append(str(value))

    add("--tensor-parallel-size", ctx["tp"])
    if ctx["pp"] > 1:
        add("--pipeline-parallel-size", ctx["pp"])
    add("--max-model-len", ctx["max_model_len"])
    add("--max-num-seqs", ctx["max_num_seqs"])
    add("--max-num-batched-tokens", ctx["max_num_batched_tokens"])
    if ctx["kv_dtype_name"] != "auto":
        add("--kv-cache-dtype", ctx["kv_dtype_name"])
    if ctx["user_block_size"] is not None:
        add("--block-size", ctx["user_block_size"])
    if gmu is not None:
        add("--gpu-memory-utilization", "%g" % gmu)
    pin_kv = ctx["unified"] or ctx["kv_cache_memory_bytes"] is not None
    if pin_kv:
        if versions.flag_supported("--kv-cache-memory-bytes", version):
            add("--kv-cache-memory-bytes", kv_budget)
            if ctx["unified"]:
                notes.append(
                    "unified memory: KV cache pinned with --kv-cache-memory-bytes %d (%.2f GiB) so vLLM skips "
                    "profiling free memory (which counts page cache and other engines); "
                    "--gpu-memory-utilization only has to pass the startup free-memory check"
                    % (kv_budget, gib(kv_budget))
                )
        else:
            notes.append(
                "vLLM %s has no --kv-cache-memory-bytes (added in 0.10.2): the KV size will come from profiling "
                "with --gpu-memory-utilization and may differ from the plan" % versions.vstr(version)
            )
    else:
        notes.append(
            "discrete GPU without kv_cache_memory_bytes: vLLM sizes the KV cache by profiling; the planned "
            "KV figures assume its activation peak equals the planner's reserve"
        )
    params = ctx["params"]
    if ctx["nnodes"] > 1:
        add("--distributed-executor-backend", "mp")
        add("--nnodes", ctx["nnodes"])
        add("--node-rank", ctx["node_rank"])
        add("--master-addr", params["master_addr"])
        if params.get("master_port") is not None:
            add("--master-port", require_int("master_port", params["master_port"], 1, 65535))
    elif params.get("distributed_executor_backend"):
        add("--distributed-executor-backend", params["distributed_executor_backend"])
    if ctx["dp"] > 1:
        add("--data-parallel-size", ctx["dp"])
        for name, flag in (
            ("data_parallel_size_local", "--data-parallel-size-local"),
            ("data_parallel_address", "--data-parallel-address"),
            ("data_parallel_rpc_port", "--data-parallel-rpc-port"),
            ("data_parallel_start_rank", "--data-parallel-start-rank"),
        ):
            if params.get(name) is not None:
                add(flag, params[name])
    if ctx["node_rank"] > 0 or params.get("headless"):
        add("--headless")
    argv.extend(ctx["extra_args"])
    return argv, notes


def budget_table(budget: Dict[str, Any], ctx: Dict[str, Any], desc: Dict[str, Any]) -> str:
    """A human-readable budget table for ``msg``."""

    def row(label: str, value: Optional[int]) -> str:
        if value is None:
            return "  %-34s %12s" % (label, "-")
        return "  %-34s %9.2f GiB" % (label, gib(value))

    lines = [
        "vLLM %s plan for %s (%s, %d layers: %s), tp=%d pp=%d, max_model_len=%d, max_num_seqs=%d"
        % (
            budget["vllm_version"],
            desc["architecture"] or desc["model_type"],
            ctx["model_dtype"],
            desc["num_layers"],
            ", ".join("%d %s" % (n, k) for k, n in sorted(_kinds_summary(desc["layer_kinds"]).items())),
            ctx["tp"],
            ctx["pp"],
            ctx["max_model_len"],
            ctx["max_num_seqs"],
        ),
        row("total memory per node", budget["total_memory_bytes"]),
        row("reserve (OS, page cache, min_free)", budget["reserve_bytes"]),
        row("expected MemAvailable at start", budget.get("expected_available_bytes")),
        row("weights per rank", budget["weights_per_rank_bytes"]),
        row("activation + graphs reserve", budget["activation_reserve_bytes"]),
        row("KV cache per rank", budget["kv_cache_bytes"]),
        row("left free per node", budget["free_after_plan_bytes"]),
        "  KV: %d blocks x %d tokens, %d bytes/token/rank, %d group(s); vLLM will log "
        "'GPU KV cache size: {:,} tokens' and 'Maximum concurrency for {:,} tokens per request: %sx'".format(
            budget["kv_tokens"], ctx["max_model_len"]
        )
        % (
            budget["num_blocks"],
            budget["block_size"],
            budget["bytes_per_token"],
            budget["kv_cache_groups"],
            budget["max_concurrency_logged"],
        ),
        "  one max_model_len request needs %s GiB of KV cache" % budget["kv_needed_gib_logged"],
    ]
    if budget["gpu_memory_utilization"] is not None:
        lines.append(
            "  --gpu-memory-utilization %g: vLLM requests %.2f GiB at startup and needs that much free%s"
            % (
                budget["gpu_memory_utilization"],
                gib(budget["requested_memory_bytes"] or 0),
                " (MemAvailable on unified memory)" if ctx["unified"] else "",
            )
        )
    if budget.get("reserve_source"):
        lines.append("  reserve from %s" % budget["reserve_source"])
    if ctx["unified"]:
        lines.append("  unified memory: KV budget pinned with --kv-cache-memory-bytes; reserve stays free for the OS")
    return "\n".join(lines)
