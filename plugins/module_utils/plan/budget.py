# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The memory budget of a plan: weights, the activation reserve, the OS/page-cache
reserve, the KV budget per rank, the fit checks that refuse a plan (with the largest
max_model_len that fits) and the --gpu-memory-utilization that passes vLLM's startup
free-memory check. Pure stdlib, imports under Python 3.8.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.node.base.plan import StartPlan, cuda_context_bytes
from ansible_collections.uma.vllm.plugins.module_utils.plan import versions
from ansible_collections.uma.vllm.plugins.module_utils.plan.context import (
    GIB,
    PlanContext,
    PlanRefused,
    cdiv,
    format_gib,
    gib,
)
from ansible_collections.uma.vllm.plugins.module_utils.plan.kv import KvLayout, _bytes_per_token, estimate_max_model_len

# --- memory outside the KV cache ----------------------------------------------------


# What vLLM's profile run adds on top of the weights, calibrated on public start-up logs
# (tests/unit/fixtures/models/activation_observations.yaml; see test_activation_observations.py).
# Forward pass: the per-token formula below x FORWARD_FACTOR.
# (evidence: docs/PLANNER-EVIDENCE.md, section 'The activation reserve: calibration')
FORWARD_FACTOR = 1.15
# Sampler profile, bytes per element of the [max_num_seqs, vocab] logits, on the rank
# that samples (V0: the driver rank only); the profile samples with top-p/top-k.
# V0 (< 0.8.0): SAMPLER_BYTES_V0; V1 sorting the vocab for top-k/top-p (PyTorch-native):
# SAMPLER_BYTES_V1_SORT; V1 without the sort (FlashInfer or a Triton kernel: 0.11.x, 0.19+):
# SAMPLER_BYTES_V1. Releases whose sampler was not read are taken as sorting (the larger figure).
# (evidence: docs/PLANNER-EVIDENCE.md, section 'The activation reserve: calibration')
SAMPLER_BYTES_V0 = 44
SAMPLER_BYTES_V1_SORT = 24
SAMPLER_BYTES_V1 = 6


def sampler_bytes_per_element(version: versions.Version) -> int:
    if version < versions.V1_DEFAULT:
        return SAMPLER_BYTES_V0
    if (0, 11, 0) <= version < (0, 12, 0) or version >= (0, 19, 0):
        return SAMPLER_BYTES_V1
    return SAMPLER_BYTES_V1_SORT


# Non-torch memory per rank (NCCL and custom all-reduce buffers, cuBLAS workspaces), x TP:
# 0.7.0+ measures it as (device used - torch reserved) since the worker's first snapshot
# (vllm/utils.py MemorySnapshot); 0.6.x counted (device used - baseline - weights - torch
# allocated delta), a larger figure.
# (evidence: docs/PLANNER-EVIDENCE.md, section 'The activation reserve: calibration')
NON_TORCH_PER_TP = GIB * 15 // 100
NON_TORCH_PER_TP_V06 = GIB * 18 // 10


def activation_reserve(desc: Dict[str, Any], ctx: PlanContext) -> Dict[str, int]:
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
    - cuda_graphs: 1 GiB unless --enforce-eager (outside vLLM's budget before 0.21,
      estimated inside it from 0.21; evidence: docs/PLANNER-EVIDENCE.md, section
      'The activation reserve: calibration').
    Not modelled: vision/audio encoder profiling of multimodal models (a warning says so).
    Set activation_reserve_gib to override the whole figure.
    """
    tp = ctx.tp
    dsz = ctx.model_dtype_bytes
    version = ctx.version
    q_kv = (desc["num_heads"] + 2 * desc["num_kv_heads"]) * desc["head_dim"] // tp
    per_token = dsz * (4 * desc["hidden_size"] + q_kv + 3 * desc["intermediate_size"] // tp)
    forward = int(ctx.max_num_batched_tokens * per_token * FORWARD_FACTOR)
    sampler = ctx.max_num_seqs * desc["vocab_size"] * sampler_bytes_per_element(version)
    if forward >= sampler:
        sampler = 0
    else:
        forward = 0
    graphs = 0 if ctx.enforce_eager else GIB
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


# --- the reserve, the KV budget and the fit ------------------------------------------


def _apply_startup_reserve(ctx: PlanContext) -> Optional[str]:
    """Unified memory: the reserve must cover what the node keeps out of MemAvailable
    at start. Without reserve_gib it is derived; a given one below it is refused.
    Returns where the reserve came from."""
    model = ctx.startup
    if model is None:
        if not ctx.unified and ctx.total_bytes is not None and not ctx.reserve_given:
            # Discrete GPU: vLLM's startup snapshot is taken after the process's CUDA context,
            # which the card's total still counts: a request of total x gmu leaving less than the
            # context free fails the check before any weight is loaded.
            ctx.reserve_bytes, why = cuda_context_bytes(ctx.env)
            return "derived: %s (%.2f GiB)" % (why, gib(ctx.reserve_bytes))
        return "reserve_gib" if ctx.reserve_given else None
    needed = model["reserve_bytes"]
    if not ctx.reserve_given:
        ctx.reserve_bytes = needed
        return "derived: " + model["text"]
    floor = ctx.total_bytes - model["available_at_most_bytes"]
    if ctx.reserve_bytes < floor:
        total = ctx.total_bytes
        raise PlanRefused(
            "reserve_gib",
            ctx.params.get("reserve_gib"),
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
                gib(total - ctx.reserve_bytes),
            ),
            "Give reserve_gib >= %.2f (omit it and the planner derives %.2f with the page-cache and slab "
            "watermark terms); if the node really keeps less, give its min_free_kbytes / "
            "watermark_scale_factor / node_baseline_gib / other_engines_gib."
            % (math.ceil(gib(floor) * 100) / 100.0, math.ceil(gib(needed) * 100) / 100.0),
            {
                "reserve_bytes": ctx.reserve_bytes,
                "reserve_floor_bytes": floor,
                "reserve_needed_bytes": needed,
                "expected_available_bytes": model["available_bytes"],
                "startup_model": {k: v for k, v in model.items() if k not in ("description", "text")},
            },
        )
    if ctx.reserve_bytes < needed:
        ctx.warnings.append(
            "reserve_gib %.2f is below the modelled %.2f GiB (%s): vLLM's startup check passes only while the page "
            "cache and reclaimable slab stay below twice the low watermark (%.2f GiB); the launcher's admission "
            "check compares the real MemAvailable"
            % (gib(ctx.reserve_bytes), gib(needed), model["text"], gib(2 * model["watermarks"]["low_bytes"]))
        )
        return "reserve_gib (below the modelled %.2f GiB, above the %.2f GiB floor)" % (gib(needed), gib(floor))
    return "reserve_gib (covers the modelled %.2f GiB: %s)" % (gib(needed), model["text"])


@dataclass
class Footprint:
    """Per-rank memory outside the KV cache, the reserve's source, the ranks sharing a
    node, and (once chosen) the KV budget per rank with where it came from."""

    weights_bytes: Optional[int]
    weights_per_rank: int
    activation_parts: Dict[str, int]
    activation_bytes: int
    reserve_source: Optional[str]
    ranks: int
    kv_budget: int = 0
    kv_source: str = ""

    def per_rank(self) -> int:
        """Weights + activations + KV cache of one rank."""
        return self.weights_per_rank + self.activation_bytes + self.kv_budget


def footprint(ctx: PlanContext) -> Footprint:
    """Weights and activations per rank, and the reserve (derived or checked)."""
    weights = ctx.weights_bytes
    if weights is None and ctx.total_bytes is not None:
        raise UmaError("weights_bytes", None, "is required with model_config to check the fit", "Give weights_bytes.")
    # Weights spread evenly over the ranks (embeddings and norms are in fact
    # replicated; this slightly under-counts the per-rank share).
    weights_per_rank = cdiv(weights, ctx.tp * ctx.pp) if weights is not None else 0
    if ctx.activation_override is not None:
        act = {"override": int(ctx.activation_override * GIB)}
    else:
        act = activation_reserve(ctx.desc, ctx)
    reserve_source = _apply_startup_reserve(ctx)
    # Unified memory: the ranks of a node share its memory. Discrete: total is
    # one GPU's memory and every rank has its own GPU.
    ranks = ctx.ranks_per_node if ctx.unified else 1
    return Footprint(weights, weights_per_rank, act, sum(act.values()), reserve_source, ranks)


def choose_kv_budget(ctx: PlanContext, layout: KvLayout, fp: Footprint) -> None:
    """The KV budget per rank (``fp.kv_budget``) and where it came from (``fp.kv_source``)."""
    total = ctx.total_bytes
    if ctx.kv_cache_memory_bytes is not None:
        fp.kv_budget = ctx.kv_cache_memory_bytes
        fp.kv_source = "kv_cache_memory_bytes"
    elif total is None:
        raise UmaError(
            "total_memory_gib",
            None,
            "is needed to size the KV cache when kv_cache_memory_bytes is not given",
            "Give total_memory_gib (UMA: host RAM; discrete: GPU memory) or kv_cache_memory_bytes.",
        )
    elif ctx.gmu is not None:
        fp.kv_budget = math.ceil(total * ctx.gmu) - fp.weights_per_rank - fp.activation_bytes
        fp.kv_source = "gpu_memory_utilization"
    elif ctx.unified:
        fp.kv_budget = (total - ctx.reserve_bytes) // fp.ranks - fp.weights_per_rank - fp.activation_bytes
        fp.kv_source = "total_memory_gib - reserve_gib"
        if ctx.kv_budget_mode == "fit" and fp.kv_budget > 0:
            # Claim only what max_num_seqs full-length sequences use, plus the
            # null block, so engines sharing the node keep the rest.
            probe = layout.report(ctx, fp.kv_budget, ctx.max_model_len)
            wanted = probe["bytes_per_block"] * (ctx.max_num_seqs * probe["blocks_per_request"] + 1)
            if wanted < fp.kv_budget:
                fp.kv_budget = wanted
                fp.kv_source = "max_num_seqs x max_model_len"
    else:
        fp.kv_budget = math.ceil(total * 0.9) - fp.weights_per_rank - fp.activation_bytes
        fp.kv_source = "vLLM default gpu_memory_utilization 0.9"


def base_budget(ctx: PlanContext, layout: KvLayout, fp: Footprint) -> Dict[str, Any]:
    """The budget figures known before the KV cache report (also the details of a refusal)."""
    groups = layout.groups
    return {
        "weights_bytes": fp.weights_bytes,
        "weights_per_rank_bytes": fp.weights_per_rank,
        "activation_reserve_bytes": fp.activation_bytes,
        "activation_parts": fp.activation_parts,
        "reserve_bytes": ctx.reserve_bytes,
        "reserve_source": fp.reserve_source,
        "expected_available_bytes": ctx.startup["available_bytes"] if ctx.startup else None,
        "total_memory_bytes": ctx.total_bytes,
        "ranks_per_node": fp.ranks,
        "unified_memory": ctx.unified,
        "gpus_per_node": ctx.ranks_per_node,
        "cuda_context_bytes": None if ctx.unified else cuda_context_bytes(ctx.env)[0],
        "kv_budget_source": fp.kv_source,
        "block_size": ctx.block_size,
        "kv_cache_groups": len(groups),
        "layers_with_cache": sum(1 for s in layout.specs if s is not None),
        "page_bytes": groups[0]["spec"].page if groups else 0,
        "bytes_per_token": _bytes_per_token(layout.specs, layout.stages),
        "vllm_version": versions.vstr(ctx.version),
    }


def refuse_with_fit(
    ctx: PlanContext,
    layout: KvLayout,
    base: Dict[str, Any],
    kv_avail: int,
    problem: str,
    option: str,
    value: Any,
    extra_details: Dict[str, Any],
    shrink_kv: bool = False,
) -> None:
    """Raise PlanRefused with the largest max_model_len (and its concurrency) that ``kv_avail`` holds;
    ``shrink_kv`` (a pinned KV cache larger than ``kv_avail``): the fix is a KV cache of at most that."""
    fits_len = 0
    seqs = 0
    if kv_avail > 0:
        report_any = layout.report(ctx, kv_avail, ctx.max_model_len)
        budget_check = kv_avail - (report_any["bytes_per_block"] if ctx.check_null_block else 0)
        fits_len = estimate_max_model_len(layout.stage_need(ctx), budget_check, ctx.max_model_len)
        if fits_len:
            at_len = layout.report(ctx, kv_avail, fits_len)
            seqs = int(at_len["max_concurrency"])
    details = dict(base)
    details.update(extra_details)
    details["largest_max_model_len"] = fits_len
    details["largest_max_num_seqs"] = seqs
    if shrink_kv:
        # a pinned KV cache: the fix is a smaller one (a shorter max_model_len does not shrink it)
        fix = "Give kv_cache_memory_bytes <= %d (%.2f GiB)%s; or free memory or lower reserve_gib." % (
            kv_avail,
            gib(kv_avail),
            ": that holds max_model_len %d with up to %d concurrent full-length sequences" % (fits_len, seqs)
            if fits_len
            else "",
        )
    elif fits_len:
        fix = (
            "Largest max_model_len that fits: %d (with up to %d concurrent full-length sequences); "
            "or free memory, lower reserve_gib, use kv_cache_dtype fp8 or more tensor_parallel_size." % (fits_len, seqs)
        )
    else:
        fix = "Not even one token of KV cache fits: free memory, lower reserve_gib or use more GPUs."
    raise PlanRefused(option, value, problem, fix, details)


def _show_option(params: Dict[str, Any], source: str) -> Any:
    name = source.split(" ", maxsplit=1)[0]
    return params.get(name)


def check_kv_budget(ctx: PlanContext, layout: KvLayout, fp: Footprint, base: Dict[str, Any]) -> Dict[str, Any]:
    """Refuse an empty KV budget or one that fails vLLM's one-request check; else its KV cache report."""
    if fp.kv_budget <= 0:
        total = ctx.total_bytes
        refuse_with_fit(
            ctx,
            layout,
            base,
            0,
            "no memory is left for the KV cache: weights %.2f GiB + activations %.2f GiB per rank%s"
            % (
                gib(fp.weights_per_rank),
                gib(fp.activation_bytes),
                "" if total is None else " + reserve %.2f GiB of %.2f GiB" % (gib(ctx.reserve_bytes), gib(total)),
            ),
            fp.kv_source.split(" ", 1)[0],
            _show_option(ctx.params, fp.kv_source),
            {"kv_cache_bytes": fp.kv_budget},
        )
    report = layout.report(ctx, fp.kv_budget, ctx.max_model_len)
    if report["check"] is not None:
        _refuse_one_request(ctx, layout, fp, base, report["check"])
    return report


def _refuse_one_request(
    ctx: PlanContext, layout: KvLayout, fp: Footprint, base: Dict[str, Any], chk: Dict[str, Any]
) -> None:
    """vLLM's 'To serve at least one request with the model's max seq len' refusal."""
    needed_text = format_gib(chk["needed"], ctx.gib_format)
    budget_text = format_gib(chk["budget"], ctx.gib_format)
    message = (
        "to serve one request of max_model_len %d vLLM %s needs %s GiB of KV cache but the budget is %s GiB "
        "(vLLM: 'To serve at least one request with the model's max seq len (%d), (%s GiB KV cache is needed, "
        "which is larger than the available KV cache memory (%s GiB)')"
        % (
            ctx.max_model_len,
            versions.vstr(ctx.version),
            needed_text,
            budget_text,
            ctx.max_model_len,
            needed_text,
            budget_text,
        )
    )
    details = {
        "kv_cache_bytes": fp.kv_budget,
        "kv_needed_bytes": chk["needed"],
        "kv_needed_gib_logged": needed_text,
        "kv_available_gib_logged": budget_text,
        "estimated_max_model_len": chk["estimated_max_model_len"],
    }
    refuse_with_fit(ctx, layout, base, fp.kv_budget, message, "max_model_len", ctx.max_model_len, details)


def check_node_fit(
    ctx: PlanContext, layout: KvLayout, fp: Footprint, base: Dict[str, Any], needed: int
) -> Optional[float]:
    """Refuse a plan the node cannot hold; the --gpu-memory-utilization to emit (None: none)."""
    total, reserve, ranks = ctx.total_bytes, ctx.reserve_bytes, fp.ranks
    gmu = ctx.gmu
    if total is not None and gmu is not None and ctx.unified and math.ceil(total * gmu) * ranks + reserve > total:
        raise UmaError(
            "gpu_memory_utilization",
            gmu,
            "asks for %.2f GiB per rank, which with the %.2f GiB reserve exceeds the %.2f GiB node"
            % (gib(total * gmu), gib(reserve), gib(total)),
            "Lower it to at most %.3f or omit it to let the planner choose."
            % ((total - reserve) / float(ranks) / total),
        )
    if total is not None:
        _refuse_node_overcommit(ctx, layout, fp, base, needed)
        if gmu is None:
            gmu = _startup_gmu(ctx, fp)
    elif gmu is None and ctx.unified:
        ctx.warnings.append(
            "total_memory_gib not given: --gpu-memory-utilization is not emitted and the fit is not checked"
        )
    return gmu


def _refuse_node_overcommit(
    ctx: PlanContext, layout: KvLayout, fp: Footprint, base: Dict[str, Any], needed: int
) -> None:
    total, reserve, ranks = ctx.total_bytes, ctx.reserve_bytes, fp.ranks
    node_need = ranks * fp.per_rank() + reserve
    if node_need <= total:
        return
    kv_room = (total - reserve) // ranks - fp.weights_per_rank - fp.activation_bytes
    pinned = fp.kv_source == "kv_cache_memory_bytes" and kv_room > 0
    refuse_with_fit(
        ctx,
        layout,
        base,
        kv_room,
        "the plan needs %.2f GiB per node (%d rank(s) x [weights %.2f + activations %.2f + KV %.2f] "
        "+ reserve %.2f) but the node has %.2f GiB"
        % (
            gib(node_need),
            ranks,
            gib(fp.weights_per_rank),
            gib(fp.activation_bytes),
            gib(fp.kv_budget),
            gib(reserve),
            gib(total),
        ),
        # a pinned KV cache that a smaller one would fix; else (not even the weights fit) the node's size
        "kv_cache_memory_bytes" if pinned else "total_memory_gib",
        ctx.kv_cache_memory_bytes if pinned else ctx.params.get("total_memory_gib"),
        {"kv_cache_bytes": fp.kv_budget, "kv_needed_bytes": needed, "kv_room_bytes": kv_room},
        shrink_kv=pinned,
    )


def _startup_gmu(ctx: PlanContext, fp: Footprint) -> float:
    """request_memory (v1/worker/utils.py): requested = ceil(total * gmu) must be
    <= free memory at startup; on UMA free memory is MemAvailable
    (MemorySnapshot.measure uses psutil for integrated GPUs, 0.11+)."""
    total = ctx.total_bytes
    lowest = fp.per_rank() / float(total)
    highest = (total - ctx.reserve_bytes) / float(fp.ranks) / total
    gmu = min(math.ceil(lowest * 1000) / 1000.0, math.floor(highest * 1000) / 1000.0)
    return max(gmu, 0.001)


def final_budget(
    ctx: PlanContext, layout: KvLayout, fp: Footprint, report: Dict[str, Any], gmu: Optional[float]
) -> Dict[str, Any]:
    """The ``budget`` result: the base figures, the KV cache report and the startup request."""
    total = ctx.total_bytes
    needed = report["kv_needed_bytes"]
    budget = base_budget(ctx, layout, fp)
    budget.update(
        {
            "kv_cache_bytes": fp.kv_budget,
            "num_blocks": report["num_blocks"],
            "bytes_per_block": report["bytes_per_block"],
            "blocks_per_request": report["blocks_per_request"],
            "kv_tokens": report["kv_tokens"],
            "max_concurrency": round(report["max_concurrency"], 4),
            "max_concurrency_logged": report["max_concurrency_logged"],
            "kv_needed_bytes": needed,
            "kv_needed_gib_logged": format_gib(needed, ctx.gib_format),
            "gpu_memory_utilization": gmu,
            "requested_memory_bytes": math.ceil(total * gmu) if (total is not None and gmu is not None) else None,
            "free_after_plan_bytes": (total - fp.ranks * fp.per_rank()) if total is not None else None,
            "mamba_padding_pct": layout.notes.get("mamba_padding_pct"),
            "kv_heads_per_rank": layout.notes["kv_heads_per_rank"],
            "mamba_cache_mode": ctx.mamba_cache_mode,
            "pp_layers": [len(s) for s in layout.stages],
        }
    )
    # the emitting side of the plan contract: what the node will read is checked before it leaves
    StartPlan.read(budget)
    return budget
