"""benchmarks/gpu_memory_check.py: its planner columns, and its table on the figures recorded on an H200.

The measurement itself needs an NVIDIA GPU (not here); the recorded run is
tests/unit/fixtures/platform/nvidia-h200-driver-580.159.04/gpu_memory_check.{json,txt}.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
H200 = ROOT / "tests" / "unit" / "fixtures" / "platform" / "nvidia-h200-driver-580.159.04"
MODELS = ROOT / "tests" / "unit" / "fixtures" / "models"
MIB = 1 << 20
GIB = 1 << 30


def _script():
    spec = importlib.util.spec_from_file_location("gpu_memory_check", ROOT / "benchmarks" / "gpu_memory_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_planner_columns_are_the_planners_activation_reserve():
    from ansible_collections.uma.vllm.plugins.module_utils.plan import budget

    gm = _script()
    planner = gm.load_planner()
    assert planner is not None
    config = json.loads((MODELS / "llama-3-8b" / "config.json").read_text())
    fig = gm.planner_figures(planner, config, 16060522496, 150109880320, 8192, 1024, None)
    assert fig["max_num_batched_tokens"] == 8192 and fig["max_num_seqs"] == 1024
    # forward dominates for Llama-3-8B at 8192 tokens: the column is the planner's own figure
    assert fig["activation_parts"]["forward"] == fig["forward_bytes"]
    assert fig["forward_per_token_bytes"] == 2 * (4 * 4096 + (32 + 2 * 8) * 128 + 3 * 14336)
    assert fig["non_torch_bytes"] == budget.NON_TORCH_PER_TP
    # the card's memory picks vLLM's batching tier (>= 70 GiB: 8192 / 1024)
    default = gm.planner_figures(planner, config, 16060522496, 150109880320, None, None, None)
    assert (default["max_num_batched_tokens"], default["max_num_seqs"]) == (8192, 1024)


def test_table_of_the_recorded_h200_run_is_what_the_device_printed():
    gm = _script()
    recorded = json.loads((H200 / "gpu_memory_check.json").read_text())
    printed = (H200 / "gpu_memory_check.txt").read_text()
    rows = [line for line in gm.render(recorded).splitlines() if line.startswith(("| qwen", "| llama"))]
    assert len(rows) == 8
    for line in rows:
        assert line in printed


def test_h200_context_from_the_recorded_fields():
    """Free before (NVML) - free after (CUDA) = the context; NVML's total is nvidia-smi's 143771 MiB."""
    ctx = json.loads((H200 / "gpu_memory_check.json").read_text())["context"]
    nvml_free_before = 143771 * MIB - ctx["nvml_used_before"]
    cuda_free_after = ctx["total_bytes"] - ctx["used_after_init"]
    context = nvml_free_before - cuda_free_after
    assert round(context / MIB, 1) == 523.6
    assert round(ctx["nvml_process_bytes_after_init"] / MIB) == 518
    assert round(ctx["non_torch_after_first_matmul"] / MIB) == 158


def test_help_needs_no_torch(capsys):
    gm = _script()
    with pytest.raises(SystemExit) as exc:
        gm.parse_args(["--help"])
    assert exc.value.code == 0
    assert "--tokens" in capsys.readouterr().out
