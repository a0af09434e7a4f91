# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vLLM 0.33.0 rows of the version table (read off the vllm==0.33.0 wheel's sources)."""

from __future__ import annotations

import json
import pathlib

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.plan import planner as plan_mod
from ansible_collections.uma.vllm.plugins.module_utils.plan import versions

MODELS = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "models"
V32, V33 = (0, 32, 0), (0, 33, 0)


@pytest.mark.parametrize(
    "flag, in_032, in_033",
    [
        ("--no-enable-prefix-caching", True, True),  # hidden in 0.33, still parsed
        ("--disable-prefix-caching", False, True),
        ("--enable-prefix-caching", True, True),
        ("--no-enable-chunked-prefill", True, True),
        ("--disable-chunked-prefill", False, True),
        ("--disable-log-requests", False, True),  # gone in 0.17, back in 0.33 as --enable-log-requests' pair
        ("--enable-hybrid-kv-cache-manager", False, True),
        ("--kv-cache-memory-bytes", True, True),
        ("--mamba-cache-mode", True, True),  # deprecated in 0.33, still parsed
    ],
)
def test_flags_that_moved_in_033(flag, in_032, in_033):
    assert versions.flag_supported(flag, V32) is in_032
    assert versions.flag_supported(flag, V33) is in_033


def test_a_flag_that_came_back_names_both_ranges():
    assert versions.flag_supported("--disable-log-requests", (0, 10, 0)) is True
    assert versions.flag_supported("--disable-log-requests", (0, 20, 0)) is False
    text = versions.flag_range_text("--disable-log-requests")
    assert "removed in 0.17.0" in text and "vLLM >= 0.33.0" in text


def test_033_is_known_and_extra_args_follow_it():
    params = dict(
        model="m",
        model_config=json.loads((MODELS / "llama-3-8b" / "config.json").read_text()),
        weights_bytes=16060522496,
        total_memory_gib=119.7,
        max_model_len=8192,
        max_num_seqs=64,
        vllm_version="0.33.0",
        extra_args=["--disable-prefix-caching"],
    )
    result = plan_mod.plan(params)
    assert not any("newer than the newest" in w for w in result["warnings"])
    with pytest.raises(UmaError) as err:
        plan_mod.plan(dict(params, vllm_version="0.32.0", extra_args=["--disable-prefix-caching"]))
    assert "rejected by vLLM 0.32.0" in err.value.message


def test_gb10_keeps_the_small_batch_tier_from_033():
    params = dict(
        model="m",
        model_config=json.loads((MODELS / "llama-3-8b" / "config.json").read_text()),
        weights_bytes=16060522496,
        total_memory_gib=119.7,
        max_model_len=8192,
    )
    old = plan_mod.plan(dict(params, vllm_version="0.32.0"))["argv"]
    new = plan_mod.plan(dict(params, vllm_version="0.33.0"))["argv"]
    assert old[old.index("--max-num-batched-tokens") + 1] == "8192" and old[old.index("--max-num-seqs") + 1] == "1024"
    assert new[new.index("--max-num-batched-tokens") + 1] == "2048" and new[new.index("--max-num-seqs") + 1] == "256"
    # a discrete 80 GiB GPU keeps the large tier
    disc = plan_mod.plan(dict(params, vllm_version="0.33.0", unified_memory=False, total_memory_gib=79.2))["argv"]
    assert disc[disc.index("--max-num-batched-tokens") + 1] == "8192"


def test_mamba_cache_mode_is_ignored_from_033():
    params = dict(
        model="m",
        model_config=json.loads((MODELS / "qwen3.5-0.8b" / "config.json").read_text()),
        weights_bytes=1846835200,
        kv_cache_memory_bytes=4 << 30,
        max_model_len=32768,
        mamba_cache_mode="none",
    )
    old = plan_mod.plan(dict(params, vllm_version="0.32.0"))
    new = plan_mod.plan(dict(params, vllm_version="0.33.0"))
    assert old["budget"]["mamba_cache_mode"] == "none"
    assert new["budget"]["mamba_cache_mode"] == "align"  # prefix caching is on by default for hybrid models
    assert any("mamba_cache_mode 'none' is ignored by vLLM 0.33.0" in w for w in new["warnings"])
    off = plan_mod.plan(dict(params, vllm_version="0.33.0", extra_args=["--disable-prefix-caching"]))
    assert off["budget"]["mamba_cache_mode"] == "none"
