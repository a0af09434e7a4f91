# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""oom_diagnose's reading of the engine watchdog's records (tests/unit/fixtures/watchdog)."""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.diagnose import core as _diagnose

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "watchdog")


def load(case):
    with open(os.path.join(FIXTURES, case, "state.json"), encoding="utf-8") as handle:
        state = json.load(handle)
    with open(os.path.join(FIXTURES, case, "events.json"), encoding="utf-8") as handle:
        events = json.load(handle)
    return state, events


def test_floor_restart_is_summarized_with_its_evidence():
    wd = _diagnose.summarize_watchdog(*load("floor_restart"))
    assert wd["phase"] == "healthy" and wd["gave_up"] is False
    assert (wd["restarts"], wd["floor_restarts"], wd["evictions"], wd["wedges"]) == (1, 1, 1, 0)
    assert wd["counts"]["floor_critical"] == 1 and wd["unreadable"] == 0
    restart = next(e for e in wd["events"] if e["action"] == "restart")
    assert "critical floor" in restart["reason"]
    assert "kind floor" in restart["evidence"]
    assert "MemAvailable 600 MiB (warning floor 1.38 GiB, critical floor 704 MiB)" in restart["evidence"]
    assert "stop done in 3.2 s" in restart["evidence"] and "started again" in restart["evidence"]
    evict = next(e for e in wd["events"] if e["action"] == "evict")
    assert "evicted 1.00 GiB in 4 files" in evict["evidence"]
    # the watchdog's own start is counted, not listed
    assert wd["actions"]["start"] == 1 and all(e["action"] != "start" for e in wd["events"])


def test_gave_up_is_summarized_with_what_failed():
    wd = _diagnose.summarize_watchdog(*load("gave_up"))
    assert wd["gave_up"] is True and wd["phase"] == "gave_up"
    restart = next(e for e in wd["events"] if e["action"] == "restart")
    assert "kind start_timeout" in restart["evidence"]
    assert "local rank: 0 of 1 processes matching 'VLLM::EngineCore' alive" in restart["evidence"]
    assert "/health failed: [Errno 111] Connection refused" in restart["evidence"]
    assert "peer ai2: engine unit is failed" in restart["evidence"]
    assert "peers stopped: not acknowledged by ai2" in restart["evidence"]


def test_report_has_the_watchdog_section_and_a_none_verdict_says_what_it_did():
    state, events = load("gave_up")
    result = _diagnose.diagnose({"engine": "never", "watchdog": _diagnose.summarize_watchdog(state, events)})
    assert result["class"] == "none"  # no out-of-memory cause in the evidence
    assert "watchdog GAVE UP: every rank is stopped and left stopped" in result["evidence"]
    assert any(line.endswith("]") and "watchdog restart: not healthy" in line for line in result["evidence"])
    report = _diagnose.render_markdown("ai2", result)
    assert "## Engine watchdog" in report
    assert (
        "Phase **gave_up** (GAVE UP: every rank left stopped); 2 wedges, 1 restarts (0 for memory), 0 evictions."
        in report
    )
    assert "| 2026-11-23T01:40:09Z | gave_up | gave up after 1 restarts" in report


def test_no_records_no_section():
    assert _diagnose.summarize_watchdog(None, None) is None
    result = _diagnose.diagnose({"engine": "qwen"})
    assert result["watchdog"] is None and "## Engine watchdog" not in _diagnose.render_markdown("n", result)


@pytest.mark.parametrize(
    "state, events",
    [
        ("not a dict", None),
        (None, "not a list"),
        ({"phase": 3, "counts": "x", "floors": [1]}, [1, "x", None, {"no": "action"}, {"action": 5}]),
        (
            {"phase": "healthy"},
            [
                {"action": "restart", "reason": None, "evidence": "garbled"},
                {"action": "evict", "evidence": {"mem": {"available": "lots"}, "result": {"bytes_advised": None}}},
                {"action": "restart", "evidence": {"stop": {"error": None, "duration_s": "x"}, "peers": {"a": 1}}},
                {
                    "action": "restart",
                    "evidence": {"mem": {"available": float("nan")}, "peers_stopped": {"missing": 3}},
                },
            ],
        ),
    ],
)
def test_garbled_records_never_raise(state, events):
    wd = _diagnose.summarize_watchdog(state, events)
    if wd is not None:
        result = _diagnose.diagnose({"engine": "x", "watchdog": wd})
        assert "## Engine watchdog" in _diagnose.render_markdown("n", result)
        _diagnose.watchdog_lines(wd)


def test_garbled_entries_are_counted_not_listed():
    wd = _diagnose.summarize_watchdog({"phase": "healthy"}, [1, "x", {"action": "restart", "reason": "r"}])
    assert wd["unreadable"] == 2 and wd["restarts"] == 1
    assert "2 unreadable records skipped" in _diagnose.render_markdown("n", _diagnose.diagnose({"watchdog": wd}))
