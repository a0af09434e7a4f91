"""uma.vllm.vllm_flags as Ansible runs it: results, check mode, refusals, a real model dir."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

from ansible_collections.uma.vllm.plugins.modules import vllm_flags

ROOT = pathlib.Path(__file__).parents[4]
FIXTURES = ROOT / "tests" / "unit" / "fixtures" / "models"
GIB = 1 << 30


def config(name):
    return json.loads((FIXTURES / name / "config.json").read_text())


def make_model_module():
    spec = importlib.util.spec_from_file_location("make_model", str(ROOT / "lab" / "make_model.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SPARK = dict(total_memory_gib=119.7, reserve_gib=12, max_model_len=8192, max_num_seqs=64)


def test_plan_from_config(run_module):
    args = dict(SPARK, model="meta-llama/Meta-Llama-3-8B", model_config=config("llama-3-8b"), weights_bytes=16060522496)
    failed, result = run_module(vllm_flags, args)
    assert not failed and result["changed"] is False
    budget = result["budget"]
    for key in (
        "weights_bytes",
        "kv_cache_bytes",
        "bytes_per_token",
        "num_blocks",
        "kv_tokens",
        "max_concurrency",
        "activation_reserve_bytes",
        "reserve_bytes",
        "gpu_memory_utilization",
    ):
        assert key in budget
    assert budget["bytes_per_token"] == 2 * 8 * 128 * 2 * 32
    assert result["argv"][:3] == ["vllm", "serve", "meta-llama/Meta-Llama-3-8B"]
    assert result["argv"][result["argv"].index("--kv-cache-memory-bytes") + 1] == str(budget["kv_cache_bytes"])
    assert "GPU KV cache size" in result["msg"] and result["expected_log"][0].startswith("GPU KV cache size: ")
    assert "unified memory: KV budget pinned with --kv-cache-memory-bytes" in result["msg"]


def test_check_mode_gives_the_same_plan(run_module):
    args = dict(SPARK, model="m", model_config=config("qwen3-32b"), weights_bytes=65527752704, max_model_len=32768)
    _unused, normal = run_module(vllm_flags, args)
    failed, checked = run_module(vllm_flags, args, check_mode=True)
    assert not failed and checked["changed"] is False and checked["argv"] == normal["argv"]


def test_refusal_carries_the_numbers(run_module):
    args = dict(
        model="m",
        model_config=config("deepseek-v2-lite"),
        kv_cache_memory_bytes=int(0.93 * GIB),
        max_model_len=32768,
        vllm_version="0.8.3",
    )
    failed, result = run_module(vllm_flags, args)
    assert failed
    assert result["msg"].startswith("option 'max_model_len' = 32768: ")
    assert "0.95 GiB KV cache is needed" in result["msg"]
    assert result["budget"]["kv_needed_bytes"] == 27 * 32768 * 576 * 2
    assert 0 < result["budget"]["largest_max_model_len"] < 32768


@pytest.mark.parametrize(
    "args,words",
    [
        (
            dict(model="m", model_config=config("llama-3-8b"), kv_cache_memory_bytes=GIB, tensor_parallel_size=5),
            "tensor_parallel_size",
        ),
        (
            dict(model="m", model_config=config("llama-3-8b"), kv_cache_memory_bytes=GIB, kv_cache_dtype="int2"),
            "kv_cache_dtype",
        ),
        (dict(model_path="/nonexistent/model", kv_cache_memory_bytes=GIB), "model_path"),
        (
            dict(
                model="m",
                model_config=config("llama-3-8b"),
                kv_cache_memory_bytes=GIB,
                vllm_version="0.18.0",
                extra_args=["--swap-space", "4"],
            ),
            "removed in 0.18.0",
        ),
        (dict(model="m", model_config=config("llama-3-8b"), kv_cache_memory_bytes=GIB, dtype="int8"), "dtype"),
        (dict(model="m", kv_cache_memory_bytes=GIB), "one of the following is required"),
        (dict(model_path="/x", model_config={"a": 1}), "mutually exclusive"),
    ],
)
def test_bad_input_fails_cleanly(run_module, args, words):
    failed, result = run_module(vllm_flags, args)
    assert failed and words in result["msg"]


def test_real_model_dir(run_module, tmp_path):
    make_model = make_model_module()
    written = make_model.write_model(
        str(tmp_path / "tiny"), shards=3, pad_gib=0.01, seed=1, dtype="bfloat16", pad_mode="rotary"
    )
    assert len(written["files"]) == 3 and (tmp_path / "tiny" / "model.safetensors.index.json").exists()
    failed, result = run_module(
        vllm_flags,
        dict(
            model_path=str(tmp_path / "tiny"),
            kv_cache_memory_bytes=GIB,
            max_model_len=512,
            max_num_seqs=4,
            unified_memory=False,
        ),
    )
    assert not failed, result["msg"]
    assert result["budget"]["weights_bytes"] == written["bytes"] >= int(0.01 * GIB)
    # tiny Llama: 2 layers x 2 KV heads x 64 x bf16 x (K, V)
    assert result["budget"]["bytes_per_token"] == 2 * 2 * 2 * 64 * 2
    assert result["model"]["layer_kinds"] == {"full": 2}


def test_make_model_layers_pad_mode(tmp_path):
    make_model = make_model_module()
    written = make_model.write_model(
        str(tmp_path / "m"), shards=1, pad_gib=0.02, seed=0, dtype="float32", pad_mode="layers"
    )
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["num_hidden_layers"] == written["layers"] > 2
    assert written["bytes"] >= int(0.02 * GIB)
    assert not (tmp_path / "m" / "model.safetensors.index.json").exists()


def test_recorded_real_run_of_the_tiny_model(run_module, tmp_path):
    """The 6th real observation: vLLM 0.32 served lab/make_model.py's model with a
    1 GiB KV cache (VLLM_CPU_KVCACHE_SPACE=1) and logged the recorded KV lines."""
    run = json.loads((FIXTURES / "tiny_llama_run.json").read_text())
    make_model = make_model_module()
    written = make_model.write_model(
        str(tmp_path / "tiny"), shards=2, pad_gib=0.1, seed=0, dtype="bfloat16", pad_mode="rotary"
    )
    assert written["bytes"] == run["inputs"]["checkpoint_bytes"]
    failed, result = run_module(
        vllm_flags,
        dict(
            model_path=str(tmp_path / "tiny"),
            unified_memory=False,
            kv_cache_memory_bytes=run["inputs"]["kv_cache_memory_bytes"],
            max_model_len=run["inputs"]["max_model_len"],
            max_num_seqs=run["inputs"]["max_num_seqs"],
            vllm_version=run["inputs"]["vllm_version"],
            extra_args=["--enforce-eager"],
        ),
    )
    assert not failed, result["msg"]
    assert result["budget"]["kv_tokens"] == run["logged"]["kv_tokens"]
    assert result["budget"]["max_concurrency_logged"] == run["logged"]["max_concurrency"]
    logged = next(line for line in run["log_excerpt"] if "KV cache size:" in line)
    assert "{:,} tokens".format(result["budget"]["kv_tokens"]) in logged
