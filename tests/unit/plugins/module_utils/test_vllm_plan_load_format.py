"""load_format and safetensors_load_strategy (issue 37 item 3): emitted as vLLM's flags, checked
against the target release (refused naming it), owned by the planner (refused in extra_args), and
what each does with the page cache said in the plan."""

from __future__ import annotations

import json
import pathlib

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.plan import planner as plan_mod
from ansible_collections.uma.vllm.plugins.module_utils.plan import versions

FIXTURES = pathlib.Path(__file__).parents[3] / "unit" / "fixtures" / "models"
GIB = 1 << 30


def params(**extra):
    fixture = "llama-3-8b"
    out = {
        "model": fixture,
        "model_config": json.loads((FIXTURES / fixture / "config.json").read_text()),
        "kv_cache_memory_bytes": 4 * GIB,
        "max_model_len": 8192,
    }
    out.update(extra)
    return out


def flag_value(argv, flag):
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_unset_is_vllms_default_and_no_flag():
    result = plan_mod.plan(params())
    assert "--load-format" not in result["argv"] and "--safetensors-load-strategy" not in result["argv"]
    assert result["load"] == {"format": "auto", "strategy": None, "page_cache": "mapped", "package": None, "gpu": False}


@pytest.mark.parametrize(
    "fmt, page_cache, package, gpu",
    [
        ("safetensors", "mapped", None, False),
        ("runai_streamer", "own", "runai_model_streamer", False),
        ("fastsafetensors", "own", "fastsafetensors", True),
    ],
)
def test_a_format_is_emitted_with_what_it_does(fmt, page_cache, package, gpu):
    result = plan_mod.plan(params(load_format=fmt))
    assert flag_value(result["argv"], "--load-format") == fmt
    assert result["load"]["page_cache"] == page_cache and result["load"]["package"] == package
    assert result["load"]["gpu"] is gpu
    assert any("CUDA device" in w for w in result["warnings"]) is gpu


@pytest.mark.parametrize("strategy, page_cache", [("eager", "read"), ("lazy", "mapped"), ("prefetch", "read")])
def test_a_strategy_is_emitted_and_changes_the_page_cache_said(strategy, page_cache):
    result = plan_mod.plan(params(load_format="auto", safetensors_load_strategy=strategy))
    assert flag_value(result["argv"], "--safetensors-load-strategy") == strategy
    assert result["load"]["strategy"] == strategy and result["load"]["page_cache"] == page_cache


@pytest.mark.parametrize(
    "extra, option, words",
    [
        ({"load_format": "zip"}, "load_format", "is not a value the planner knows (vLLM 0.32.0 has: auto,"),
        ({"load_format": 3}, "load_format", "is not a value the planner knows"),
        ({"safetensors_load_strategy": "eager", "vllm_version": "0.10.2"}, "safetensors_load_strategy",
         "is not in vLLM 0.10.2 (it exists in vLLM >= 0.11.0)"),
        ({"safetensors_load_strategy": "eager", "load_format": "runai_streamer"}, "safetensors_load_strategy",
         "applies to the safetensors formats only, not load_format runai_streamer"),
        ({"safetensors_load_strategy": "whole"}, "safetensors_load_strategy", "is not a value the planner knows"),
    ],
)  # fmt: skip
def test_refusals_name_the_option_the_value_and_the_release(extra, option, words):
    with pytest.raises(UmaError) as err:
        plan_mod.plan(params(**extra))
    assert err.value.option == option and words in err.value.message and "Give" in err.value.message


def test_a_format_the_release_lacks_is_refused_naming_the_release():
    since = versions.LOAD_FORMATS["runai_streamer"]["rows"][0]
    older = "%d.%d.%d" % (since[0], since[1] - 1, 0)
    with pytest.raises(UmaError) as err:
        plan_mod.plan(params(load_format="runai_streamer", vllm_version=older))
    assert "is not in vLLM %s" % older in err.value.message


@pytest.mark.parametrize(
    "option, value, older, newer",
    [
        ("safetensors_load_strategy", "prefetch", "0.13.0", "0.21.0"),
        ("load_format", "instanttensor", "0.13.0", "0.21.0"),
        ("load_format", "runai_streamer_sharded", "0.10.2", "0.11.0"),
    ],
)
def test_what_the_release_sources_showed(option, value, older, newer):
    """Dated from the releases' sources (versions.py): absent in the older, present in the newer."""
    assert plan_mod.plan(params(**{option: value, "vllm_version": newer}))["load"]
    with pytest.raises(UmaError) as err:
        plan_mod.plan(params(**{option: value, "vllm_version": older}))
    assert "is not in vLLM %s" % older in err.value.message


@pytest.mark.parametrize(
    "words", [["--load-format", "auto"], ["--load-format=pt"], ["--safetensors-load-strategy", "eager"]]
)
def test_the_flags_are_the_planners_in_extra_args(words):
    with pytest.raises(UmaError) as err:
        plan_mod.plan(params(extra_args=words))
    assert err.value.option == "extra_args" and "a flag the planner computes" in err.value.message
    assert "load_format" in err.value.message or "safetensors_load_strategy" in err.value.message


def test_every_row_names_its_page_cache_behaviour():
    for table in (versions.LOAD_FORMATS, versions.SAFETENSORS_LOAD_STRATEGIES):
        for name, row in table.items():
            assert row["page_cache"] in ("mapped", "read", "own"), name
