# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The idle probe's pacing from vLLM's own counters (issue 21 item 6): pure, made-up time."""

from __future__ import annotations

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.watchdog import counters
from ansible_collections.uma.vllm.plugins.module_utils.node.watchdog import logic as w

GIB = 1 << 30
FLOORS = w.size_floors(24 * GIB)
DAY_S = 86400


def cfg(**over):
    return w.validate(dict({"engine": "main"}, **over))


def metrics(done, running=0, waiting=0):
    """vLLM's /metrics as the watchdog reads it: ``done`` requests finished, one token each."""
    return {"running": running, "waiting": waiting,
            "progress": {"vllm:request_success_total": float(done), "vllm:generation_tokens_total": float(done),
                         "vllm:prompt_tokens_total": 3.0 * done}}  # fmt: skip


def healthy_state(c, t=0.0):
    state = w.new_state(t)
    state["phase"] = "healthy"
    return state


def test_probe_due_rules():
    c = cfg()
    assert c["probe_idle_s"] == 60.0
    s = healthy_state(c)
    assert not counters.probe_due(c, s, metrics(0, running=1), 1000)  # busy: never (busy_stall_s watches)
    s["idle_since"] = 0.0
    assert not counters.probe_due(c, s, metrics(0), 59)  # idle, not long enough
    assert counters.probe_due(c, s, metrics(0), 60)  # idle for probe_idle_s
    s["last_probe_at"] = 30.0
    assert not counters.probe_due(c, s, metrics(0), 60)  # at most once per probe_idle_s
    assert counters.probe_due(c, s, metrics(0), 90)
    s["probe_failed"] = True
    assert counters.probe_due(c, s, metrics(0), 31)  # a failed probe is confirmed at once (fail_threshold)
    s["probe_failed"] = False
    for phase in ("starting", "suspect", "backoff"):
        assert counters.probe_due(c, dict(s, phase=phase), metrics(0), 31), phase
    assert not counters.probe_due(c, s, None, 60) and counters.probe_due(c, s, None, 90)  # no counters: paced


def test_track_idle_tells_the_probes_own_counts_from_a_clients():
    c = cfg()
    s = healthy_state(c)
    counters.track_idle(s, {"metrics": metrics(5)}, 10.0)
    assert s["idle_since"] == 10.0
    counters.track_idle(s, {"metrics": metrics(5), "probe": {"ok": True}}, 70.0)  # a probe sent after this reading
    assert s["last_probe_at"] == 70.0 and s["counts"]["probes"] == 1 and s["probes_pending"] == 1
    counters.track_idle(s, {"metrics": metrics(6)}, 75.0)  # +1 request: the probe's own
    assert s["idle_since"] == 10.0
    counters.track_idle(s, {"metrics": metrics(7)}, 80.0)  # +1 request, no probe pending: a client's
    assert s["idle_since"] == 80.0
    counters.track_idle(s, {"metrics": metrics(7), "probe": {"ok": True}}, 140.0)
    counters.track_idle(s, {"metrics": metrics(9)}, 145.0)  # +2 with one probe pending: a client too
    assert s["idle_since"] == 145.0
    counters.track_idle(s, {"metrics": metrics(9, running=1)}, 150.0)  # work: not idle at all
    assert s["idle_since"] is None
    counters.track_idle(s, {"metrics": metrics(10)}, 155.0)
    assert s["idle_since"] == 155.0
    counters.track_idle(s, {"metrics": None, "probe": {"ok": False}}, 160.0)  # no reading: the probe stays pending
    assert s["probes_pending"] == 1 and s["probe_failed"]


def simulate(c, seconds, client_every=None, tick=5.0):
    """decide() every tick over ``seconds`` on an idle engine, the probe sent when probe_due says so;
    clients (one request each) every ``client_every`` seconds. Returns the probes sent, the final state."""
    state = w.new_state(0.0)
    done, sent, t = 0, 0, 0.0
    next_client = client_every
    while t < seconds:
        if next_client is not None and t >= next_client:
            done += 1
            next_client += client_every
        obs = {"unit": "active", "n_restarts": 0, "local": {"ok": True, "reason": "alive"},
               "health": {"ok": True}, "metrics": metrics(done), "mem": {"available": 16 * GIB}}  # fmt: skip
        if counters.probe_due(c, state, obs["metrics"], t):
            obs["probe"] = {"ok": True, "latency_s": 0.2}
            done += 1  # vLLM counts the probe like any request
            sent += 1
        state, _actions = w.decide(c, FLOORS, state, obs, t)
        t += tick
    return sent, state


def test_an_idle_day_sends_a_probe_a_minute_not_every_tick():
    """Before: a completion every 5 s tick, 17,280 a day. Now: one a minute at most."""
    sent, state = simulate(cfg(), DAY_S)
    assert state["phase"] == "healthy"
    assert 1400 <= sent <= DAY_S // 60 + 1, sent
    assert state["counts"]["probes"] == sent


def test_an_engine_serving_clients_gets_no_probe():
    """Clients every 30 s keep the counters moving: the engine proves itself, no probe after the start."""
    sent, _state = simulate(cfg(), 3600, client_every=30)
    assert sent == 1  # the start's one


@pytest.mark.parametrize("idle_s, most", [(60, 61), (300, 13)])
def test_probe_idle_s_sets_the_pace(idle_s, most):
    sent, _state = simulate(cfg(probe_idle_s=idle_s), 3600)
    assert most - 2 <= sent <= most, sent
