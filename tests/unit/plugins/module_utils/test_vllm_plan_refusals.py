"""Every refusal of the planner, and the version gates of the flags it emits."""

from __future__ import annotations

import json
import os
import pathlib
import struct

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.plan import planner as plan_mod

FIXTURES = pathlib.Path(__file__).parents[3] / "unit" / "fixtures" / "models"
GIB = 1 << 30


def config(name):
    return json.loads((FIXTURES / name / "config.json").read_text())


def base(fixture="llama-3-8b", **params):
    out = {"model": fixture, "model_config": config(fixture), "kv_cache_memory_bytes": 4 * GIB, "max_model_len": 8192}
    out.update(params)
    return out


def without(cfg, key):
    cfg = dict(cfg)
    cfg.pop(key)
    return cfg


# (id, params, option named in the message, words the message must contain)
REFUSALS = [
    ("negative-total", base(total_memory_gib=-1, weights_bytes=1), "total_memory_gib", "must be >"),
    ("zero-total", base(total_memory_gib=0, weights_bytes=1), "total_memory_gib", "must be >"),
    ("negative-reserve", base(reserve_gib=-2), "reserve_gib", "must be >="),
    ("negative-kv-bytes", base(kv_cache_memory_bytes=-5), "kv_cache_memory_bytes", "below the minimum"),
    ("negative-weights", base(weights_bytes=-1), "weights_bytes", "below the minimum"),
    ("nan-total", base(total_memory_gib="nan", weights_bytes=1), "total_memory_gib", "finite"),
    ("gmu-above-one", base(gpu_memory_utilization=1.5), "gpu_memory_utilization", "(0, 1]"),
    ("tp-not-dividing-heads", base(tensor_parallel_size=3), "tensor_parallel_size", "32 attention heads"),
    (
        "tp-not-dividing-kv-heads",
        base("qwen2.5-1.5b-instruct", tensor_parallel_size=3),
        "tensor_parallel_size",
        "2 KV heads",
    ),
    (
        "tp-not-dividing-gdn-heads",
        base("qwen3.5-0.8b", tensor_parallel_size=8, max_model_len=4096)
        | {
            "model_config": dict(
                config("qwen3.5-0.8b"),
                text_config=dict(
                    config("qwen3.5-0.8b")["text_config"],
                    num_attention_heads=16,
                    num_key_value_heads=8,
                    linear_num_value_heads=12,
                ),
            )
        },
        "tensor_parallel_size",
        "linear_num_value_heads",
    ),
    ("pp-beyond-layers", base(pipeline_parallel_size=33), "pipeline_parallel_size", "32 layers"),
    ("unknown-kv-dtype", base(kv_cache_dtype="int3"), "kv_cache_dtype", "planner can size"),
    ("kv-dtype-too-new", base(kv_cache_dtype="bfloat16", vllm_version="0.10.2"), "kv_cache_dtype", "0.11.0"),
    (
        "unknown-model-dtype",
        base(model_config=dict(config("llama-3-8b"), torch_dtype="int4")),
        "model_config",
        "cannot size",
    ),
    (
        "missing-layers",
        base(model_config=without(config("llama-3-8b"), "num_hidden_layers")),
        "model_config",
        "num_hidden_layers",
    ),
    (
        "missing-heads",
        base(model_config=without(config("llama-3-8b"), "num_attention_heads")),
        "model_config",
        "num_attention_heads",
    ),
    (
        "missing-kv-lora-rope",
        base("deepseek-v3", model_config=without(config("deepseek-v3"), "qk_rope_head_dim")),
        "model_config",
        "qk_rope_head_dim",
    ),
    (
        "missing-sliding-window",
        base("gpt-oss-20b", model_config=without(config("gpt-oss-20b"), "sliding_window")),
        "model_config",
        "sliding_window",
    ),
    (
        "unknown-layer-type",
        base(model_config=dict(config("llama-3-8b"), layer_types=["chunked_attention"] * 32)),
        "model_config",
        "attention type",
    ),
    (
        "layer-types-count",
        base(model_config=dict(config("llama-3-8b"), layer_types=["full_attention"] * 3)),
        "model_config",
        "3 layer types for 32 layers",
    ),
    ("config-not-a-dict", base(model_config=[1, 2]), "model_config", "not a config.json mapping"),
    ("no-model", {"max_model_len": 10, "kv_cache_memory_bytes": 1}, "model_path", "neither"),
    ("both-model-sources", base(model_path="/tmp"), "model_config", "together with model_path"),
    ("bad-version", base(vllm_version="banana"), "vllm_version", "not a vLLM version"),
    ("too-old-version", base(vllm_version="0.4.3"), "vllm_version", "0.5.0"),
    ("hybrid-on-old-version", base("qwen3.5-0.8b", vllm_version="0.9.2", max_model_len=4096), "vllm_version", "0.10.0"),
    ("too-long-context", base(max_model_len=16384), "max_model_len", "max_position_embeddings (8192)"),
    (
        "batched-below-seqs",
        base(max_num_batched_tokens=128, max_num_seqs=256),
        "max_num_batched_tokens",
        "below max_num_seqs",
    ),
    ("block-size-256-on-0.11.0", base(block_size=256, vllm_version="0.11.0"), "block_size", "--block-size choices"),
    ("block-size-512-on-0.17", base(block_size=512, vllm_version="0.17.1"), "block_size", "--block-size choices"),
    ("planned-flag-in-extra", base(extra_args=["--max-model-len", "4096"]), "extra_args", "computes"),
    ("planned-alias-in-extra", base(extra_args=["-tp=2"]), "extra_args", "computes"),
    ("extra-args-string", base(extra_args="--enforce-eager"), "extra_args", "not a list"),
    (
        "swap-space-gone-in-0.18",
        base(extra_args=["--swap-space", "4"], vllm_version="0.18.0"),
        "extra_args",
        "removed in 0.18.0",
    ),
    (
        "disable-log-requests-gone",
        base(extra_args=["--disable-log-requests"], vllm_version="0.17.1"),
        "extra_args",
        "removed in 0.17.0",
    ),
    (
        "nnodes-before-0.11.1",
        base(nnodes=2, master_addr="10.0.0.1", tensor_parallel_size=2, vllm_version="0.11.0"),
        "nnodes",
        "--nnodes",
    ),
    ("nnodes-without-master", base(nnodes=2, tensor_parallel_size=2), "master_addr", "required"),
    (
        "node-rank-too-big",
        base(nnodes=2, node_rank=2, tensor_parallel_size=2, master_addr="h"),
        "node_rank",
        "below nnodes",
    ),
    ("nnodes-not-dividing", base(nnodes=3, tensor_parallel_size=2, master_addr="h"), "nnodes", "does not divide"),
    ("env-not-a-dict", base(env=["A=1"]), "env", "not a mapping"),
    (
        "bad-pp-partition",
        base(pipeline_parallel_size=2, env={"VLLM_PP_LAYER_PARTITION": "10,10"}),
        "env",
        "add up to 32",
    ),
    (
        "mamba-all-mode",
        base("qwen3.5-0.8b", mamba_cache_mode="all", max_model_len=4096),
        "mamba_cache_mode",
        "not modelled",
    ),
    (
        "needs-total-or-kv",
        {"model": "m", "model_config": config("llama-3-8b"), "max_model_len": 8192},
        "total_memory_gib",
        "kv_cache_memory_bytes",
    ),
    ("weights-needed-for-fit", base(total_memory_gib=128), "weights_bytes", "required"),
    (
        "unified-gmu-eats-reserve",
        base(
            total_memory_gib=100,
            reserve_gib=20,
            weights_bytes=GIB,
            gpu_memory_utilization=0.9,
            kv_cache_memory_bytes=None,
        ),
        "gpu_memory_utilization",
        "exceeds",
    ),
]


@pytest.mark.parametrize("case_id,params,option,words", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refusal(case_id, params, option, words):
    with pytest.raises(UmaError) as err:
        plan_mod.plan(params)
    assert err.value.option == option, err.value.message
    assert words in err.value.message
    assert err.value.message.startswith("option '%s' = " % option)


def test_does_not_fit_reports_largest_length():
    # Llama 3 8B with 200 GiB of KV pinned on a 119.7 GiB node: refused with the
    # largest max_model_len the room left after weights and reserve can hold.
    params = base(total_memory_gib=119.7, reserve_gib=12, weights_bytes=16 * GIB, kv_cache_memory_bytes=200 * GIB)
    with pytest.raises(plan_mod.PlanRefused) as err:
        plan_mod.plan(params)
    details = err.value.details
    room = int((119.7 - 12) * GIB) - 16 * GIB - details["activation_reserve_bytes"]
    assert details["kv_room_bytes"] == room
    # the whole 8192 context fits in that room, many times over
    assert details["largest_max_model_len"] == 8192
    assert details["largest_max_num_seqs"] == int(room // (32 * 65536) / 512.0)
    # the KV cache was pinned: the fix is a smaller one, and what that room holds
    assert err.value.option == "kv_cache_memory_bytes"
    assert "Give kv_cache_memory_bytes <= %d" % room in err.value.message
    assert (
        "that holds max_model_len 8192 with up to %d concurrent" % details["largest_max_num_seqs"] in err.value.message
    )


def test_refusal_when_one_sequence_does_not_fit():
    # Llama 3 70B in bf16 (131 GiB) on one 119.7 GiB node: nothing is left for the KV cache
    params = base(
        "llama-3-70b", total_memory_gib=119.7, reserve_gib=10, weights_bytes=141107412992, kv_cache_memory_bytes=None
    )
    with pytest.raises(plan_mod.PlanRefused) as err:
        plan_mod.plan(params)
    assert err.value.details["largest_max_model_len"] == 0
    assert "no memory is left for the KV cache" in err.value.message


def test_short_kv_budget_suggests_length_and_seqs():
    # 1 GiB of KV for Llama 3 8B: 8192 tokens cost 1 GiB + the null block (0.32), so the
    # largest length is 16 tokens shorter (one block), and one sequence fits.
    with pytest.raises(plan_mod.PlanRefused) as err:
        plan_mod.plan(base(kv_cache_memory_bytes=GIB))
    assert err.value.details["largest_max_model_len"] == 8192 - 16
    assert err.value.details["largest_max_num_seqs"] == 1
    assert "1.0 GiB KV cache is needed" in err.value.message


# --- model directories --------------------------------------------------------------


def write_shard(path, tensors):
    header = {}
    offset = 0
    for name, size in tensors:
        header[name] = {"dtype": "BF16", "shape": [size // 2], "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(config("llama-3-8b")))
    write_shard(tmp_path / "model-1.safetensors", [("a", 1000), ("b", 24)])
    write_shard(tmp_path / "model-2.safetensors", [("c", 2048)])
    return tmp_path


def test_reads_weight_bytes_from_headers(model_dir):
    result = plan_mod.plan({"model_path": str(model_dir), "kv_cache_memory_bytes": 4 * GIB, "max_model_len": 8192})
    assert result["budget"]["weights_bytes"] == 1000 + 24 + 2048
    assert result["argv"][2] == str(model_dir)


def test_index_names_the_shards(model_dir):
    (model_dir / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-1.safetensors", "b": "model-1.safetensors"}})
    )
    result = plan_mod.plan({"model_path": str(model_dir), "kv_cache_memory_bytes": 4 * GIB, "max_model_len": 8192})
    assert result["budget"]["weights_bytes"] == 1024


def _write(name, data):
    def mutate(d):
        target = d / name
        if isinstance(data, bytes):
            target.write_bytes(data)
        else:
            target.write_text(data)
        return d

    return mutate


def _unlink(pattern):
    def mutate(d):
        for path in d.glob(pattern):
            path.unlink()
        return d

    return mutate


OUTSIDE = json.dumps({"x": {"dtype": "BF16", "shape": [8], "data_offsets": [0, 99]}}).encode()

DIR_REFUSALS = [
    ("missing-dir", lambda d: d / "nope", "not a readable directory"),
    ("no-config", _unlink("config.json"), "has no config.json"),
    ("bad-config", _write("config.json", "{oops"), "config.json cannot be read"),
    ("no-weights", _unlink("*.safetensors"), "no .safetensors"),
    ("truncated-shard", _write("model-2.safetensors", b"\x10\0\0"), "not a valid safetensors"),
    ("header-too-long", _write("model-2.safetensors", struct.pack("<Q", 1 << 40) + b"{}"), "not a valid safetensors"),
    (
        "offsets-outside",
        _write("model-2.safetensors", struct.pack("<Q", len(OUTSIDE)) + OUTSIDE + b"\0" * 16),
        "outside the file",
    ),
    (
        "index-missing-shard",
        _write("model.safetensors.index.json", json.dumps({"weight_map": {"a": "gone.safetensors"}})),
        "is missing",
    ),
    ("bad-index", _write("model.safetensors.index.json", "[]"), "index file"),
]


@pytest.mark.parametrize("case_id,mutate,words", DIR_REFUSALS, ids=[r[0] for r in DIR_REFUSALS])
def test_model_dir_refusals(model_dir, case_id, mutate, words):
    path = mutate(model_dir)
    with pytest.raises(UmaError) as err:
        plan_mod.plan({"model_path": str(path), "kv_cache_memory_bytes": GIB, "max_model_len": 8192})
    assert err.value.option == "model_path" and words in err.value.message


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_config(model_dir):
    (model_dir / "config.json").chmod(0)
    with pytest.raises(UmaError) as err:
        plan_mod.plan({"model_path": str(model_dir), "kv_cache_memory_bytes": GIB, "max_model_len": 8192})
    assert "cannot be read" in err.value.message


# --- flags per version -----------------------------------------------------------------

FLAG_GATES = [
    # (version, params, flag expected in argv (True) or absent (False))
    ("0.17.1", dict(extra_args=["--swap-space", "4"]), "--swap-space", True),
    ("0.11.1", dict(nnodes=2, node_rank=1, master_addr="10.0.0.1", tensor_parallel_size=2), "--nnodes", True),
    ("0.11.1", dict(nnodes=2, node_rank=1, master_addr="10.0.0.1", tensor_parallel_size=2), "--headless", True),
    ("0.11.1", dict(block_size=256), "--block-size", True),
    ("0.18.0", dict(block_size=512), "--block-size", True),
    (
        "0.10.2",
        dict(total_memory_gib=119.7, weights_bytes=GIB, kv_cache_memory_bytes=None),
        "--kv-cache-memory-bytes",
        True,
    ),
    (
        "0.10.1",
        dict(total_memory_gib=119.7, weights_bytes=GIB, kv_cache_memory_bytes=None),
        "--kv-cache-memory-bytes",
        False,
    ),
    ("0.32.0", dict(), "--pipeline-parallel-size", False),
    ("0.32.0", dict(kv_cache_dtype="auto"), "--kv-cache-dtype", False),
    ("0.32.0", dict(kv_cache_dtype="fp8"), "--kv-cache-dtype", True),
]


@pytest.mark.parametrize("version,params,flag,present", FLAG_GATES)
def test_flag_gates(version, params, flag, present):
    result = plan_mod.plan(base(vllm_version=version, **params))
    assert (flag in result["argv"]) is present


def test_old_release_without_kv_bytes_flag_warns():
    result = plan_mod.plan(
        base(vllm_version="0.10.1", total_memory_gib=119.7, weights_bytes=GIB, kv_cache_memory_bytes=None)
    )
    assert any("no --kv-cache-memory-bytes" in w for w in result["warnings"])


def test_unknown_extra_flag_passes_with_warning():
    result = plan_mod.plan(base(extra_args=["--some-future-flag", "1"]))
    assert result["argv"][-2:] == ["--some-future-flag", "1"]
    assert any("--some-future-flag" in w for w in result["warnings"])
