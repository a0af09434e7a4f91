"""KV cache arithmetic of the vLLM planner, table-driven.

Every expected number below is written as the formula it comes from (vLLM's
page size, layer counts, block rounding), not copied from the planner.
"""

from __future__ import annotations

import json
import pathlib

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.plan import planner as plan_mod

FIXTURES = pathlib.Path(__file__).parents[3] / "unit" / "fixtures" / "models"
GIB = 1 << 30


def config(name):
    return json.loads((FIXTURES / name / "config.json").read_text())


def run(fixture, **params):
    params.setdefault("model", fixture)
    params["model_config"] = config(fixture)
    return plan_mod.plan(params)


# (id, fixture, params, expected budget subset)
# page = coef * block_size * kv_heads_per_rank * head_size * dtype_bytes
KV_TABLE = [
    # GQA, one group of 32 layers: 4096 blocks of 16 tokens; int(4096 / (8192/16) * 8192)
    (
        "llama3-8b-tp1",
        "llama-3-8b",
        dict(kv_cache_memory_bytes=8 * GIB, max_model_len=8192),
        dict(
            bytes_per_token=2 * 8 * 128 * 2 * 32,
            page_bytes=16 * 2 * 8 * 128 * 2,
            num_blocks=8 * GIB // (32 * 16 * 2 * 8 * 128 * 2),
            kv_tokens=int(4096 / 512 * 8192),
            kv_cache_groups=1,
        ),
    ),
    # TP 2 splits the 8 KV heads: 4 per rank
    (
        "llama3-8b-tp2",
        "llama-3-8b",
        dict(kv_cache_memory_bytes=8 * GIB, max_model_len=8192, tensor_parallel_size=2),
        dict(
            bytes_per_token=2 * 4 * 128 * 2 * 32, num_blocks=8 * GIB // (32 * 16 * 2 * 4 * 128 * 2), kv_heads_per_rank=4
        ),
    ),
    # TP 16 > 8 KV heads: each rank keeps one replicated KV head
    (
        "llama3-8b-tp16-replicated",
        "llama-3-8b",
        dict(kv_cache_memory_bytes=8 * GIB, max_model_len=8192, tensor_parallel_size=16),
        dict(bytes_per_token=2 * 1 * 128 * 2 * 32, kv_heads_per_rank=1),
    ),
    # fp8 KV cache: one byte per element
    (
        "llama3-8b-fp8",
        "llama-3-8b",
        dict(kv_cache_memory_bytes=8 * GIB, max_model_len=8192, kv_cache_dtype="fp8_e5m2"),
        dict(bytes_per_token=2 * 8 * 128 * 1 * 32, num_blocks=8 * GIB // (32 * 16 * 2 * 8 * 128)),
    ),
    # block rounding: a budget 1 byte short of 4097 blocks gives 4096 blocks; block 32 halves the count
    (
        "llama3-8b-block-rounding",
        "llama-3-8b",
        dict(kv_cache_memory_bytes=4097 * 32 * 65536 - 1, max_model_len=8192),
        dict(num_blocks=4096, kv_tokens=4096 * 16),
    ),
    (
        "llama3-8b-block32",
        "llama-3-8b",
        dict(kv_cache_memory_bytes=8 * GIB, max_model_len=8000, block_size=32),
        # 8000 tokens need cdiv(8000, 32) = 250 blocks; tokens = int(blocks / 250 * 8000)
        dict(num_blocks=8 * GIB // (32 * 32 * 2 * 8 * 128 * 2), kv_tokens=int(2048 / 250 * 8000), block_size=32),
    ),
    # PP 3 over 80 layers -> [27, 27, 26] (get_pp_indices); the 27-layer stages set the block count
    (
        "llama3-70b-pp3",
        "llama-3-70b",
        dict(kv_cache_memory_bytes=8 * GIB, max_model_len=8192, pipeline_parallel_size=3),
        dict(pp_layers=[27, 27, 26], num_blocks=8 * GIB // (27 * 65536), bytes_per_token=27 * 2 * 8 * 128 * 2),
    ),
    # PP 6 over 80 layers: 13 each, the 2 left over go to the stages before the last one
    (
        "llama3-70b-pp6",
        "llama-3-70b",
        dict(kv_cache_memory_bytes=8 * GIB, max_model_len=8192, pipeline_parallel_size=6),
        dict(pp_layers=[13, 13, 13, 14, 14, 13], num_blocks=8 * GIB // (14 * 65536)),
    ),
    # PP with an explicit VLLM_PP_LAYER_PARTITION
    (
        "llama3-70b-pp2-env",
        "llama-3-70b",
        dict(
            kv_cache_memory_bytes=8 * GIB,
            max_model_len=8192,
            pipeline_parallel_size=2,
            env={"VLLM_PP_LAYER_PARTITION": "50,30"},
        ),
        dict(pp_layers=[50, 30], num_blocks=8 * GIB // (50 * 65536)),
    ),
    # MLA: one latent of kv_lora_rank + qk_rope_head_dim = 576, replicated over TP, block 64
    (
        "deepseek-v3-mla-tp8",
        "deepseek-v3",
        dict(kv_cache_memory_bytes=8 * GIB, max_model_len=32768, tensor_parallel_size=8),
        dict(
            bytes_per_token=(512 + 64) * 2 * 61,
            block_size=64,
            page_bytes=64 * 576 * 2,
            num_blocks=8 * GIB // (61 * 64 * 576 * 2),
            kv_heads_per_rank=1,
        ),
    ),
    (
        "deepseek-v3-mla-fp8",
        "deepseek-v3",
        dict(kv_cache_memory_bytes=8 * GIB, max_model_len=32768, kv_cache_dtype="fp8"),
        dict(bytes_per_token=(512 + 64) * 1 * 61),
    ),
    (
        "deepseek-v2-lite-mla",
        "deepseek-v2-lite",
        dict(kv_cache_memory_bytes=2 * GIB, max_model_len=32768, vllm_version="0.11.0"),
        dict(bytes_per_token=(512 + 64) * 2 * 27, kv_needed_bytes=27 * 32768 * 576 * 2),
    ),
    # gpt-oss: 12 sliding (window 128) + 12 full layers -> 2 groups of 12; page 16*2*8*64*2.
    # 0.32: a request holds 512 full blocks + cdiv(min(127 + (1+1)*2048, 8192), 16) + 1 sliding blocks
    (
        "gpt-oss-20b-0.32",
        "gpt-oss-20b",
        dict(kv_cache_memory_bytes=4 * GIB, max_model_len=8192, max_num_batched_tokens=2048, max_num_seqs=64),
        dict(
            kv_cache_groups=2,
            bytes_per_block=12 * 32768,
            num_blocks=4 * GIB // (12 * 32768),
            blocks_per_request=512 + (-(-(127 + 2 * 2048) // 16) + 1),
            kv_tokens=int((4 * GIB // (12 * 32768)) / (512 + 265) * 8192),
            bytes_per_token=12 * 2 * 8 * 64 * 2,
        ),
    ),
    # 0.20: in-flight = max_num_batched_tokens; tokens = num_blocks // groups * block_size
    (
        "gpt-oss-20b-0.20",
        "gpt-oss-20b",
        dict(
            kv_cache_memory_bytes=4 * GIB,
            max_model_len=8192,
            max_num_batched_tokens=2048,
            max_num_seqs=64,
            vllm_version="0.20.0",
        ),
        dict(blocks_per_request=512 + (-(-(127 + 2048) // 16) + 1), kv_tokens=(4 * GIB // (12 * 32768)) // 2 * 16),
    ),
    # 0.8.5: no hybrid KV cache manager, sliding layers are promoted to full attention (one group of 24)
    (
        "gpt-oss-20b-0.8.5",
        "gpt-oss-20b",
        dict(
            kv_cache_memory_bytes=4 * GIB,
            max_model_len=8192,
            max_num_batched_tokens=2048,
            max_num_seqs=64,
            vllm_version="0.8.5",
        ),
        dict(kv_cache_groups=1, num_blocks=4 * GIB // (24 * 32768), kv_tokens=(4 * GIB // (24 * 32768)) * 16),
    ),
    # --disable-hybrid-kv-cache-manager promotes them too
    (
        "gpt-oss-20b-hybrid-disabled",
        "gpt-oss-20b",
        dict(
            kv_cache_memory_bytes=4 * GIB,
            max_model_len=8192,
            max_num_batched_tokens=2048,
            max_num_seqs=64,
            extra_args=["--disable-hybrid-kv-cache-manager"],
        ),
        dict(kv_cache_groups=1, num_blocks=4 * GIB // (24 * 32768)),
    ),
    # Gemma 3 27B: every 6th of 62 layers is full -> 10 full + 52 sliding (window 1024);
    # group size 10 -> 1 + cdiv(52, 10) = 7 groups; page 16*2*16*128*2
    (
        "gemma3-27b",
        "gemma-3-27b-it",
        dict(kv_cache_memory_bytes=16 * GIB, max_model_len=32768, max_num_batched_tokens=8192, max_num_seqs=64),
        dict(
            kv_cache_groups=7,
            bytes_per_block=10 * 16 * 2 * 16 * 128 * 2,
            num_blocks=16 * GIB // (10 * 131072),
            blocks_per_request=2048 + 6 * (-(-(1023 + 2 * 8192) // 16) + 1),
        ),
    ),
    # Qwen3-Next TP2: GDN state per rank = conv (8192/2 x 3) bf16 + temporal (32/2 x 128 x 128) bf16
    # = 548864 B; attention page per token = 2*1*256*2 = 1024 -> block 16*cdiv(548864, 16*1024) = 544;
    # 12 full + 36 linear layers -> 4 groups of 12
    (
        "qwen3-next-tp2",
        "qwen3-next-80b-a3b-instruct",
        dict(kv_cache_memory_bytes=16 * GIB, max_model_len=65536, tensor_parallel_size=2),
        dict(
            block_size=544,
            kv_cache_groups=4,
            bytes_per_block=12 * 544 * 1024,
            mamba_padding_pct=round(100.0 * (544 * 1024 - 548864) / 548864, 2),
            # align mode: 2 state blocks per linear group
            blocks_per_request=-(-65536 // 544) + 3 * 2,
        ),
    ),
    # Qwen3.5 0.8B: ssm state float32 from its config -> state 18432*2 + 262144*4 = 1085440 B;
    # attention page per token 2*2*256*2 = 2048 -> block 16*cdiv(1085440, 32768) = 544
    (
        "qwen3.5-0.8b-0.28",
        "qwen3.5-0.8b",
        dict(kv_cache_memory_bytes=8 * GIB, max_model_len=262144, vllm_version="0.28.0"),
        dict(
            block_size=544,
            mamba_padding_pct=round(100.0 * (544 * 2048 - 1085440) / 1085440, 2),
            num_blocks=8 * GIB // (6 * 544 * 2048),
            blocks_per_request=-(-262144 // 544) + 3 * 2,
        ),
    ),
    # before 0.26 prefix caching is off for hybrid models: mamba_cache_mode none, one state block
    (
        "qwen3.5-0.8b-0.24",
        "qwen3.5-0.8b",
        dict(kv_cache_memory_bytes=8 * GIB, max_model_len=262144, vllm_version="0.24.0"),
        dict(blocks_per_request=-(-262144 // 544) + 3 * 1, mamba_cache_mode="none"),
    ),
    # --no-enable-prefix-caching on 0.28 turns the mamba cache mode back to none
    (
        "qwen3.5-0.8b-0.28-no-prefix-caching",
        "qwen3.5-0.8b",
        dict(
            kv_cache_memory_bytes=8 * GIB,
            max_model_len=262144,
            vllm_version="0.28.0",
            extra_args=["--no-enable-prefix-caching"],
        ),
        dict(blocks_per_request=-(-262144 // 544) + 3 * 1, mamba_cache_mode="none"),
    ),
    # 0.20 logs num_blocks // groups * block_size
    (
        "qwen3.5-0.8b-0.20",
        "qwen3.5-0.8b",
        dict(kv_cache_memory_bytes=8 * GIB, max_model_len=262144, vllm_version="0.20.0"),
        dict(kv_tokens=(8 * GIB // (6 * 544 * 2048)) // 4 * 544),
    ),
]


@pytest.mark.parametrize("case_id,fixture,params,expected", KV_TABLE, ids=[row[0] for row in KV_TABLE])
def test_kv_arithmetic(case_id, fixture, params, expected):
    budget = run(fixture, **params)["budget"]
    for key, value in expected.items():
        assert budget[key] == value, "%s: %s = %r, expected %r" % (case_id, key, budget[key], value)


# startup check (needed memory for one max_model_len request) per version:
# gpt-oss 0.13 sums every layer: 12 x 512 + 12 x (cdiv(127 + 2048, 16) + 1) pages;
# 0.14-0.18 only count the first group (the sliding one: layer 0);
# 0.19+ sum the groups; 0.29+ keep (1+1) x 2048 in flight.
PAGE_OSS = 16 * 2 * 8 * 64 * 2
NEEDED_TABLE = [
    ("0.13.0", 12 * PAGE_OSS * 512 + 12 * PAGE_OSS * 137),
    ("0.14.1", 12 * PAGE_OSS * 137),
    ("0.18.0", 12 * PAGE_OSS * 137),
    ("0.20.0", 12 * PAGE_OSS * (512 + 137)),
    ("0.32.0", 12 * PAGE_OSS * (512 + 265)),
]


@pytest.mark.parametrize("version,needed", NEEDED_TABLE)
def test_needed_memory_per_version(version, needed):
    budget = run(
        "gpt-oss-20b",
        kv_cache_memory_bytes=4 * GIB,
        max_model_len=8192,
        max_num_batched_tokens=2048,
        max_num_seqs=64,
        vllm_version=version,
    )["budget"]
    assert budget["kv_needed_bytes"] == needed


# 0.29 plans the check against the budget minus the BlockPool's null block.
@pytest.mark.parametrize("version,fits", [("0.28.0", True), ("0.29.0", False)])
def test_null_block_reservation(version, fits):
    needed = 32 * (8192 // 16) * 65536  # llama-3-8b, one 8192-token request
    params = dict(kv_cache_memory_bytes=needed, max_model_len=8192, vllm_version=version)
    if fits:
        assert run("llama-3-8b", **params)["budget"]["kv_needed_bytes"] == needed
    else:
        with pytest.raises(plan_mod.PlanRefused) as err:
            run("llama-3-8b", **params)
        assert err.value.details["estimated_max_model_len"] == 8192 - 16


@pytest.mark.parametrize("version,text", [("0.13.0", "1.00"), ("0.14.1", "1.0")])
def test_needed_gib_is_formatted_like_the_version(version, text):
    budget = run("llama-3-8b", kv_cache_memory_bytes=2 * GIB, max_model_len=8192, vllm_version=version)["budget"]
    assert budget["kv_needed_bytes"] == GIB and budget["kv_needed_gib_logged"] == text


def test_expected_log_lines_match_vllm_format():
    result = run(
        "qwen2.5-1.5b-instruct", kv_cache_memory_bytes=int(5.03 * GIB), max_model_len=32768, vllm_version="0.11.2"
    )
    blocks = int(5.03 * GIB) // (28 * 16 * 2 * 2 * 128 * 2)
    assert result["expected_log"] == [
        "GPU KV cache size: {:,} tokens".format(blocks * 16),
        "Maximum concurrency for 32,768 tokens per request: %.2fx" % (blocks / 2048.0),
    ]


def test_hybrid_log_names_the_raised_block_size():
    result = run("qwen3.5-0.8b", kv_cache_memory_bytes=8 * GIB, max_model_len=262144, vllm_version="0.28.0")
    assert result["expected_log"][0].startswith("Setting attention block size to 544 tokens")


# 13 full + 12 sliding layers: until 0.17 groups hold min(13, 12) = 12 layers
# (full splits into 2 groups, 3 groups in all); from 0.18 13 < 1.5 x 12 so groups
# hold 13 layers (2 groups) and a block costs 13 pages.
@pytest.mark.parametrize("version,groups,layers_per_group", [("0.17.1", 3, 12), ("0.18.0", 2, 13)])
def test_group_size_rule(version, groups, layers_per_group):
    cfg = dict(
        config("gpt-oss-20b"),
        num_hidden_layers=25,
        layer_types=["full_attention"] + ["sliding_attention", "full_attention"] * 12,
    )
    result = plan_mod.plan(
        dict(
            model="m",
            model_config=cfg,
            kv_cache_memory_bytes=4 * GIB,
            max_model_len=8192,
            max_num_seqs=64,
            vllm_version=version,
        )
    )
    assert result["budget"]["kv_cache_groups"] == groups
    assert result["budget"]["bytes_per_block"] == layers_per_group * 16 * 2 * 8 * 64 * 2


# model_config summaries as the observation rows carry them (architectures as a string,
# layer_types as text): parsed when they name every layer, else the family rule decides.
SUMMARIES = [
    ("[S,S,S,S,S,F] x 10 + [S,S]", {"sliding": 52, "full": 10}),
    ("62 layers: 52 sliding + 10 full", {"sliding": 52, "full": 10}),  # not parsed: Gemma 3's every-6th rule
    ("62 x full_attention (+vision)", {"full": 62}),
]


@pytest.mark.parametrize("layer_types,kinds", SUMMARIES)
def test_summary_layer_types(layer_types, kinds):
    summary = {
        "architectures": "Gemma3ForConditionalGeneration",
        "num_hidden_layers": 62,
        "num_attention_heads": 32,
        "num_key_value_heads": 16,
        "head_dim": 128,
        "hidden_size": 5376,
        "sliding_window": 1024,
        "layer_types": layer_types,
        "torch_dtype": "bfloat16",
    }
    result = plan_mod.plan(dict(model="m", model_config=summary, kv_cache_memory_bytes=16 * GIB, max_model_len=32768))
    assert result["model"]["layer_kinds"] == kinds


def test_v0_release_uses_uniform_arithmetic():
    result = run("llama-3-8b", kv_cache_memory_bytes=8 * GIB, max_model_len=8192, vllm_version="0.6.3")
    assert result["budget"]["kv_tokens"] == 8 * GIB // (32 * 65536) * 16
    assert any("V0 engine" in w for w in result["warnings"])
