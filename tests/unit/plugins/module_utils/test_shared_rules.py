"""One home for each rule the controller and the node share (issue 36 item 2): the environment-name
and secret patterns (node/base/checks.py), the engine-name pattern (node/base/paths.py) and an
engine's default URL on its node (service/base.py api_url). The users hold the same objects."""

from __future__ import annotations

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.base import checks, paths
from ansible_collections.uma.vllm.plugins.module_utils.node.base import systemd as node_systemd
from ansible_collections.uma.vllm.plugins.module_utils.plan import checks as plan_checks
from ansible_collections.uma.vllm.plugins.module_utils.service import base, engines, launch_wrapper


def test_the_env_and_secret_rules_have_one_home():
    assert base.ENV_RE is checks.ENV_NAME_RE
    assert engines.SECRET_ENV_RE is plan_checks.SECRET_ENV_RE is checks.SECRET_ENV_RE
    assert engines.SECRET_FLAGS is plan_checks.SECRET_FLAGS is checks.SECRET_FLAGS
    assert base.NAME_RE.pattern == node_systemd.NAME_RE.pattern == paths.ENGINE_NAME_PATTERN


@pytest.mark.parametrize(
    "host, url",
    [
        ("0.0.0.0", "http://127.0.0.1:8000/health"),
        ("::", "http://127.0.0.1:8000/health"),
        ("", "http://127.0.0.1:8000/health"),
        ("10.0.0.2", "http://10.0.0.2:8000/health"),
        ("fe80::1", "http://[fe80::1]:8000/health"),
    ],
)
def test_an_engines_default_url_is_one_rule_for_the_model_and_the_launcher(host, url):
    assert base.api_url(host, 8000) == url
    assert engines.health_url({}, host, 8000, False, None) == url
    assert launch_wrapper._health_url({"host": host, "port": 8000}) == url


def test_a_headless_rank_waits_on_rank_0s_api():
    assert engines.health_url({}, "0.0.0.0", 8000, True, "10.0.0.1") == "http://10.0.0.1:8000/health"
    assert engines.health_url({}, "10.0.0.2", 8000, True, "10.0.0.1") == "http://10.0.0.2:8000/health"
    assert engines.health_url({"health_url": "http://x:1/h"}, "::", 8000, True, None) == "http://x:1/h"
