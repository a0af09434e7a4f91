# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The KV cache as vLLM lays it out: per-layer specs, KV cache groups, pipeline stages,
blocks, and what one budget yields (tokens, concurrency, the startup check).

Each function names the vLLM file/function it follows. Pure stdlib, imports under Python 3.8.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.plan.context import (
    KERNEL_BLOCK_ALIGNMENT,
    MLA_HYBRID_ALIGNMENT,
    PlanContext,
    cdiv,
)

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

    def max_memory_usage(self, ctx: PlanContext, max_model_len: int) -> int:
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
            tokens = min(self.window - 1 + ctx.in_flight_tokens, max_model_len)
            return (cdiv(tokens, self.block_size) + 1) * self.page
        return (2 if ctx.mamba_cache_mode == "align" else 1) * self.page


def build_layer_specs(desc: Dict[str, Any], ctx: PlanContext) -> Tuple[List[Optional[Spec]], Dict[str, Any]]:
    """Spec of every decoder layer (None for layers without cache), per TP rank.

    Mirrors Attention.get_kv_cache_spec / MLAAttention / MambaBase and, for
    hybrid models, Platform._align_hybrid_block_size (0.20+) /
    HybridAttentionMambaModelConfig.verify_and_update_config (0.10-0.19):
    the attention block size grows to the smallest multiple of the kernel
    alignment whose page holds one mamba state, and the state page is padded
    to the attention page.
    """
    tp = ctx.tp
    kv_bytes = ctx.kv_dtype_bytes
    block_size = ctx.block_size
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
        block_size, state_page = _align_hybrid_block(desc, ctx, block_size, attn_page_1, notes)
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


def _align_hybrid_block(
    desc: Dict[str, Any], ctx: PlanContext, block_size: int, attn_page_1: int, notes: Dict[str, Any]
) -> Tuple[int, int]:
    """Hybrid models: the attention block size whose page holds one mamba state, and the
    state page padded to it (Platform._align_hybrid_block_size). Notes what it changed."""
    state_page = state_page_bytes(desc["state"], ctx.tp, ctx.conv_state_bytes, ctx.ssm_state_bytes)
    alignment = KERNEL_BLOCK_ALIGNMENT
    if ctx.hybrid_align_uses_block_size and ctx.user_block_size is not None:
        alignment = max(alignment, block_size)
    if desc["mla"] and ctx.hybrid_align_uses_block_size:
        alignment = max(alignment, MLA_HYBRID_ALIGNMENT)
    attn_block = alignment * cdiv(state_page, alignment * attn_page_1)
    if block_size < attn_block:
        notes["block_size_raised"] = "Setting attention block size to %d tokens" % attn_block
        block_size = attn_block
    padded = block_size * attn_page_1
    if padded > state_page:
        notes["mamba_padding_pct"] = round(100.0 * (padded - state_page) / state_page, 2)
    return block_size, padded


# --- KV cache groups (vllm/v1/core/kv_cache_utils.py get_kv_cache_groups) --------


def build_groups(specs: List[Optional[Spec]], ctx: PlanContext) -> List[Dict[str, Any]]:
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
    if not ctx.hybrid_manager:
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
    if ctx.group_size_rule == "max_if_close" and max(sizes) < group_size * 1.5:
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


def blocks_per_request(groups: List[Dict[str, Any]], ctx: PlanContext, max_model_len: int) -> int:
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
    groups: List[Dict[str, Any]], specs: List[Optional[Spec]], stage_layers: List[int], ctx: PlanContext, length: int
) -> int:
    """Bytes vLLM's startup check requires for one request of ``length`` tokens.

    per_layer   (<= 0.13) sum of max_memory_usage_bytes of the worker's layers
                (check_enough_kv_cache_memory);
    first_group (0.14-0.18) group_size * page * cdiv(first group's usage, page);
    sum_groups  (0.19+) group_size * page * sum over groups of cdiv(usage, page)
                (_max_memory_usage_bytes_from_groups; bytes_per_block * blocks from 0.29).
    """
    mode = ctx.check
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
    ctx: PlanContext,
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
        if ctx.check_scope == "global":
            return needed_memory(groups, specs, [i for st in stages for i in st], ctx, length)
        return needed_memory(stage["groups"], specs, stage["layers"], ctx, length)

    check = None
    for stage in per_stage:
        budget = available - (stage["bytes_per_block"] if ctx.check_null_block else 0)
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
    if ctx.concurrency == "tokens_over_len" or ctx.report == "blocks_x_block_size":
        tokens = num_blocks * min(g["spec"].block_size for g in groups)
        concurrency = tokens / float(max_model_len)
    else:
        concurrency = num_blocks / float(per_request) if per_request else 0.0
        if ctx.report == "groups_floor":
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


def _stage_need(groups: List[Dict[str, Any]], specs: List[Optional[Spec]], stages: List[List[int]], ctx: PlanContext):
    def need(length: int) -> int:
        if ctx.check_scope == "global":
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


@dataclass
class KvLayout:
    """The KV cache of one plan as vLLM lays it out: per-layer specs, groups, stages."""

    specs: List[Optional[Spec]]
    notes: Dict[str, Any]
    groups: List[Dict[str, Any]]
    stages: List[List[int]]

    def report(self, ctx: PlanContext, available: int, max_model_len: int) -> Dict[str, Any]:
        return kv_cache_report(self.groups, self.specs, self.stages, ctx, available, max_model_len)

    def stage_need(self, ctx: PlanContext) -> Callable[[int], int]:
        return _stage_need(self.groups, self.specs, self.stages, ctx)


def kv_layout(ctx: PlanContext) -> KvLayout:
    """Specs, groups and pipeline stages; the block size vLLM ends up with goes to ``ctx``."""
    specs, notes = build_layer_specs(ctx.desc, ctx)
    ctx.block_size = notes["block_size"]
    groups = build_groups(specs, ctx)
    stages = pp_partition(ctx.desc["num_layers"], ctx.pp, ctx.env)
    return KvLayout(specs, notes, groups, stages)
