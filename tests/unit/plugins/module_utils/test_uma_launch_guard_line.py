# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The line under which the launcher's guard evicts (guard_act_below_free_mib): auto is the engine's request."""

from __future__ import annotations

import io

import node_helpers
import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.node.launch import admission as _admission
from ansible_collections.uma.vllm.plugins.module_utils.node.launch import program as uma_launch

GIB = 1 << 30
MIB = 1 << 20


@pytest.mark.parametrize(
    "config, host_need, expected",
    [
        ({}, 40 * GIB, (40960, "auto: the engine's startup request")),
        ({"guard_act_below_free_mib": "auto"}, 40 * GIB + 1, (40961, "auto: the engine's startup request")),
        ({"plan": {"unified_memory": True}}, 3 * GIB, (3072, "auto: the engine's startup request")),
        ({"plan": {"unified_memory": False}}, 40 * GIB, (0, "auto: a discrete GPU (host memory is not the engine's)")),
        ({}, None, (0, "auto: no startup request in the plan")),
        ({"guard_act_below_free_mib": 0}, 40 * GIB, (0, "guard_act_below_free_mib")),
        ({"guard_act_below_free_mib": 512, "plan": {"unified_memory": False}}, None, (512, "guard_act_below_free_mib")),
    ],
)
def test_guard_free_line(config, host_need, expected):
    assert _admission.guard_free_line(config, host_need) == expected


def base(tmp_path, **extra):
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "model" / "model.safetensors").write_bytes(b"\0" * 4096)
    free_kb = 100 * GIB // 1024
    meminfo = "MemTotal: %d kB\nMemFree: %d kB\nMemAvailable: %d kB\n" % (128 * GIB // 1024, free_kb, free_kb)
    return node_helpers.launch_config(tmp_path, meminfo, **extra)


@pytest.mark.parametrize(
    "value, problem",
    [("lots", "is not auto or a number of MiB"), ("4096", "is not auto or a number of MiB"),
     (-1, "is below the minimum 0"), (True, "boolean"), (2.5, "integer"), (1 << 21, "is above the maximum")],
)  # fmt: skip
def test_the_launcher_refuses_a_bad_line_naming_its_option(tmp_path, value, problem):
    with pytest.raises(UmaError) as err:
        uma_launch.validate(base(tmp_path, guard_act_below_free_mib=value))
    assert err.value.option == "guard_act_below_free_mib"
    assert problem in err.value.message


@pytest.mark.parametrize("value, kept", [("auto", "auto"), (0, 0), (2048, 2048)])
def test_the_launcher_keeps_a_good_line(tmp_path, value, kept):
    assert uma_launch.validate(base(tmp_path, guard_act_below_free_mib=value))["guard_act_below_free_mib"] == kept


class FakeGuard:
    pid = 4242

    def __init__(self, argv, **_unused):
        FakeGuard.argv = argv

    def poll(self):
        return 1


@pytest.mark.parametrize(
    "plan, extra, mode, line",
    [
        ({"requested_memory_bytes": 40 * GIB, "ranks_per_node": 2}, {}, "adaptive", "81920"),
        ({"requested_memory_bytes": 40 * GIB, "unified_memory": False}, {}, "adaptive", "0"),
        (None, {}, "adaptive", "0"),
        ({"requested_memory_bytes": 40 * GIB}, {"guard_act_below_free_mib": 100}, "adaptive", "100"),
        ({"requested_memory_bytes": 40 * GIB}, {}, "files", None),  # the line is the adaptive mode's
    ],
)
def test_the_guard_gets_the_line(tmp_path, monkeypatch, plan, extra, mode, line):
    config = uma_launch.validate(base(tmp_path, plan=plan, guard_mode=mode, **extra))
    launch = uma_launch.Launch(config, uma_launch.Log("e1", out=io.StringIO()))
    monkeypatch.setattr(uma_launch.subprocess, "Popen", FakeGuard)
    monkeypatch.setattr(uma_launch, "GUARD_READY_TIMEOUT_S", 0.0)
    launch.start_guard()
    argv = FakeGuard.argv
    if line is None:
        assert "--act-below-free-mib" not in argv
    else:
        assert argv[argv.index("--act-below-free-mib") + 1] == line
    step = next(s for s in launch.log.steps if s["name"] == "guard-started")
    assert step["act_below_free_mib"] == int(line or 0)
    assert "act_below_free_mib=%d" % int(line or 0) in launch.log.out.getvalue()


def test_a_line_with_a_mode_that_has_no_growth_trigger_is_refused(tmp_path):
    with pytest.raises(UmaError) as err:
        uma_launch.validate(base(tmp_path, guard_mode="files", guard_act_below_free_mib=512))
    assert err.value.option == "guard_act_below_free_mib" and "has no effect with mode=files" in err.value.message
    # auto with files: no line, no refusal (the role's default with an engine that asks for files)
    assert uma_launch.validate(base(tmp_path, guard_mode="files"))["guard_act_below_free_mib"] == "auto"
