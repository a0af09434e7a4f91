"""Issue 10: the role refuses secrets outside `secrets` (env keys, flags) naming the key, never the value."""

from __future__ import annotations

import pytest

from ansible_collections.uma.vllm.plugins.filter import vllm_service as vs

NATIVE = {"runtime": "native", "native_command": ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"]}
TOKEN = "hf_canary_0123456789"


def _check(**kw):
    engine = dict({"name": "e", "port": 8000, "model_path": "/models/x"}, **kw)
    return vs.check(vs.host_engines([engine], "ai1", "mp"), NATIVE, ["ai1"], {})


@pytest.mark.parametrize("key", ["HF_TOKEN", "VLLM_API_KEY", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY", "db_password"])
def test_secret_env_key_refused_without_its_value(key):
    errors = _check(env={key: TOKEN})
    assert any(key in e and "secrets" in e for e in errors), errors
    assert not any(TOKEN in e for e in errors)


@pytest.mark.parametrize(
    "words", [["--api-key", TOKEN], ["--api-key=%s" % TOKEN], ["--api_key=%s" % TOKEN], ["--hf-token", TOKEN]]
)
def test_secret_flag_in_extra_args_refused_without_its_value(words):
    errors = _check(plan={"extra_args": words})
    assert any("secret on the command line" in e for e in errors), errors
    assert not any(TOKEN in e for e in errors)


def test_secret_flag_in_a_custom_command_refused():
    errors = _check(command=["vllm", "serve", "--api-key", TOKEN])
    assert any("VLLM_API_KEY" in e for e in errors), errors


def test_plain_env_and_secrets_accepted():
    assert _check(env={"VLLM_CPU_KVCACHE_SPACE": "1"}, secrets={"HF_TOKEN": TOKEN}) == []
