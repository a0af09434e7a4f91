# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a plan shows: the ``vllm serve`` argv (only flags the target release parses),
the lines vLLM is expected to log, the budget table of ``msg`` and the result mapping.
Pure stdlib, imports under Python 3.8.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError, require_int
from ansible_collections.uma.vllm.plugins.module_utils.plan import versions
from ansible_collections.uma.vllm.plugins.module_utils.plan.context import PlanContext, gib
from ansible_collections.uma.vllm.plugins.module_utils.plan.kv import KvLayout


class _Argv:
    """An argv under construction that refuses a flag the target release does not parse."""

    def __init__(self, ctx: PlanContext) -> None:
        self.version = ctx.version
        self.words = ["vllm", "serve", str(ctx.model)]

    def add(self, flag: str, value: Any = None) -> None:
        if not versions.flag_supported(flag, self.version):
            raise UmaError(
                "vllm_version",
                versions.vstr(self.version),
                "does not accept %s, which this plan needs (%s)" % (flag, versions.flag_range_text(flag)),
                "Target a vLLM release that has it.",
            )
        self.words.append(flag)
        if value is not None:
            self.words.append(str(value))


def build_argv(ctx: PlanContext, kv_budget: int, gmu: Optional[float]) -> Tuple[List[str], List[str]]:
    """``vllm serve MODEL ...``: only flags the target release parses (FLAGS table)."""
    argv = _Argv(ctx)
    _add_sizes(argv, ctx, gmu)
    notes = _pin_kv_cache(argv, ctx, kv_budget)
    _add_distribution(argv, ctx)
    argv.words.extend(ctx.extra_args)
    return argv.words, notes


def _add_sizes(argv: _Argv, ctx: PlanContext, gmu: Optional[float]) -> None:
    add = argv.add
    add("--tensor-parallel-size", ctx.tp)
    if ctx.pp > 1:
        add("--pipeline-parallel-size", ctx.pp)
    add("--max-model-len", ctx.max_model_len)
    add("--max-num-seqs", ctx.max_num_seqs)
    add("--max-num-batched-tokens", ctx.max_num_batched_tokens)
    if ctx.load_format is not None:
        add("--load-format", ctx.load_format)
    if ctx.load_strategy is not None:
        add("--safetensors-load-strategy", ctx.load_strategy)
    if ctx.kv_dtype_name != "auto":
        add("--kv-cache-dtype", ctx.kv_dtype_name)
    if ctx.user_block_size is not None:
        add("--block-size", ctx.user_block_size)
    if gmu is not None:
        add("--gpu-memory-utilization", "%g" % gmu)


def _pin_kv_cache(argv: _Argv, ctx: PlanContext, kv_budget: int) -> List[str]:
    """--kv-cache-memory-bytes where it applies; the notes say what vLLM will do."""
    notes: List[str] = []
    version = ctx.version
    if not (ctx.unified or ctx.kv_cache_memory_bytes is not None):
        notes.append(
            "discrete GPU without kv_cache_memory_bytes: vLLM sizes the KV cache by profiling; the planned "
            "KV figures assume its activation peak equals the planner's reserve"
        )
    elif versions.flag_supported("--kv-cache-memory-bytes", version):
        argv.add("--kv-cache-memory-bytes", kv_budget)
        if ctx.unified:
            notes.append(
                "unified memory: KV cache pinned with --kv-cache-memory-bytes %d (%.2f GiB) so vLLM skips "
                "profiling free memory (which counts page cache and other engines); "
                "--gpu-memory-utilization only has to pass the startup free-memory check" % (kv_budget, gib(kv_budget))
            )
    else:
        notes.append(
            "vLLM %s has no --kv-cache-memory-bytes (added in 0.10.2): the KV size will come from profiling "
            "with --gpu-memory-utilization and may differ from the plan" % versions.vstr(version)
        )
    return notes


def _add_distribution(argv: _Argv, ctx: PlanContext) -> None:
    """Multi-node, data-parallel and headless flags."""
    add = argv.add
    params = ctx.params
    if ctx.nnodes > 1:
        add("--distributed-executor-backend", "mp")
        add("--nnodes", ctx.nnodes)
        add("--node-rank", ctx.node_rank)
        add("--master-addr", params["master_addr"])
        if params.get("master_port") is not None:
            add("--master-port", require_int("master_port", params["master_port"], 1, 65535))
    elif params.get("distributed_executor_backend"):
        add("--distributed-executor-backend", params["distributed_executor_backend"])
    if ctx.dp > 1:
        add("--data-parallel-size", ctx.dp)
        for name, flag in (
            ("data_parallel_size_local", "--data-parallel-size-local"),
            ("data_parallel_address", "--data-parallel-address"),
            ("data_parallel_rpc_port", "--data-parallel-rpc-port"),
            ("data_parallel_start_rank", "--data-parallel-start-rank"),
        ):
            if params.get(name) is not None:
                add(flag, params[name])
    if ctx.node_rank > 0 or params.get("headless"):
        add("--headless")


def expected_log(ctx: PlanContext, layout: KvLayout, report: Dict[str, Any]) -> List[str]:
    """The lines vLLM logs at startup for this plan."""
    log_lines = [
        "GPU KV cache size: {:,} tokens".format(report["kv_tokens"]),
        "Maximum concurrency for {:,} tokens per request: {}x".format(
            ctx.max_model_len, report["max_concurrency_logged"]
        ),
    ]
    if layout.notes.get("block_size_raised"):
        log_lines.insert(
            0, layout.notes["block_size_raised"] + " to ensure that attention page size is >= mamba page size."
        )
    return log_lines


def plan_result(ctx: PlanContext, argv: List[str], budget: Dict[str, Any], log_lines: List[str]) -> Dict[str, Any]:
    """The mapping ``plan`` returns."""
    desc = ctx.desc
    return {
        "argv": argv,
        "env": dict(ctx.env),
        "budget": budget,
        "expected_log": log_lines,
        "warnings": ctx.warnings,
        "load": dict(ctx.load),
        "msg": budget_table(budget, ctx, desc),
        "model": {
            "architecture": desc["architecture"],
            "model_type": desc["model_type"],
            "layer_kinds": _kinds_summary(desc["layer_kinds"]),
            "dtype": ctx.model_dtype,
        },
    }


def _kinds_summary(kinds: List[str]) -> Dict[str, int]:
    summary: Dict[str, int] = {}
    for kind in kinds:
        summary[kind] = summary.get(kind, 0) + 1
    return summary


def budget_table(budget: Dict[str, Any], ctx: PlanContext, desc: Dict[str, Any]) -> str:
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
            ctx.model_dtype,
            desc["num_layers"],
            ", ".join("%d %s" % (n, k) for k, n in sorted(_kinds_summary(desc["layer_kinds"]).items())),
            ctx.tp,
            ctx.pp,
            ctx.max_model_len,
            ctx.max_num_seqs,
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
            budget["kv_tokens"], ctx.max_model_len
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
                " (MemAvailable on unified memory)" if ctx.unified else "",
            )
        )
    if budget.get("reserve_source"):
        lines.append("  reserve from %s" % budget["reserve_source"])
    if ctx.unified:
        lines.append("  unified memory: KV budget pinned with --kv-cache-memory-bytes; reserve stays free for the OS")
    return "\n".join(lines)
