# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The watchdog's decisions: config refusals, floors, busy vs wedged, backoff, window limit, peers.

Everything here is pure: observations and time are made up, so every branch is
driven exactly; the real program is exercised in test_uma_watchdog.py.
"""

from __future__ import annotations

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.node.watchdog import logic as w
from ansible_collections.uma.vllm.plugins.module_utils.system.sysctl import size_min_free_kbytes

GIB = 1 << 30
MIB = 1 << 20


def cfg(**over):
    raw = {"engine": "main"}
    raw.update(over)
    return w.validate(raw)


FLOORS = w.size_floors(24 * GIB)
PLENTY = {"available": 16 * GIB, "gpu_headroom": None}


def ok_obs(**over):
    obs = {
        "unit": "active",
        "n_restarts": 0,
        "local": {"ok": True, "reason": "3 processes"},
        "health": {"ok": True, "latency_s": 0.01},
        "metrics": {"running": 0, "waiting": 0, "progress": {"vllm:generation_tokens_total": 10.0}},
        "probe": {"ok": True, "latency_s": 0.2},
        "mem": dict(PLENTY),
    }
    obs.update(over)
    return obs


def run(c, observations, start=0.0, step=5.0, state=None, floors=None):
    """Feed observations one tick apart; return the final state and every (t, action)."""
    floors = floors or FLOORS
    state = state or w.new_state(start)
    done = []
    t = start
    for obs in observations:
        state, actions = w.decide(c, floors, state, obs, t)
        done += [(t, a) for a in actions]
        t += step
    return state, done


def healthy_state(c, t=0.0):
    state, _unused = run(c, [ok_obs()], start=t)
    assert state["phase"] == "healthy"
    return state


# --------------------------------------------------------------------------
# config


@pytest.mark.parametrize(
    "raw, key",
    [
        ([], "config"),
        ({"engine": "main", "interval": 5}, "interval"),
        ({}, "engine"),
        ({"engine": "a b"}, "engine"),
        ({"engine": "main", "rank": -1}, "rank"),
        ({"engine": "main", "rank": True}, "rank"),
        ({"engine": "main", "interval_s": 0}, "interval_s"),
        ({"engine": "main", "interval_s": "5"}, "interval_s"),
        ({"engine": "main", "fail_threshold": 0}, "fail_threshold"),
        ({"engine": "main", "max_restarts": 1.5}, "max_restarts"),
        ({"engine": "main", "status_port": 70000}, "status_port"),
        ({"engine": "main", "backoff_initial_s": 60, "backoff_max_s": 30}, "backoff_max_s"),
        ({"engine": "main", "probe_timeout_s": 700}, "busy_stall_s"),
        ({"engine": "main", "base_url": "127.0.0.1:8000"}, "base_url"),
        ({"engine": "main", "evict_scope": "all"}, "evict_scope"),
        ({"engine": "main", "peers": {"ai2": "x"}}, "peers"),
        ({"engine": "main", "peers": [{"name": "ai2"}], "status_port": 9411}, "peers"),
        ({"engine": "main", "peers": [{"name": "ai2", "url": "http://a/s"}] * 2, "status_port": 9411}, "peers"),
        ({"engine": "main", "peers": [{"name": "ai2", "url": "http://a/s"}]}, "status_port"),
        ({"engine": "main", "rank": 1, "status_port": 9411}, "leader_url"),
        ({"engine": "main", "rank": 1, "leader_url": "http://ai1:9411/status"}, "status_port"),
        (
            {
                "engine": "main",
                "rank": 1,
                "leader_url": "http://a/s",
                "status_port": 1,
                "peers": [{"name": "x", "url": "http://x/s"}],
            },
            "peers",
        ),
        ({"engine": "main", "processes": [{"match": "("}]}, "processes"),
        ({"engine": "main", "processes": [{"match": "x", "min": 0}]}, "processes"),
        ({"engine": "main", "warn_floor_mib": -1}, "warn_floor_mib"),
        ({"engine": "main", "unified_memory": "yes"}, "unified_memory"),
        ({"engine": "main", "container": "a;rm -rf /"}, "container"),
        ({"engine": "main", "healthy_reset_s": 0}, "healthy_reset_s"),
        ({"engine": "main", "healthy_reset_s": "600"}, "healthy_reset_s"),
        ({"engine": "main", "probe_idle_s": -60}, "probe_idle_s"),
        ({"engine": "main", "probe_idle_s": True}, "probe_idle_s"),
    ],
)
def test_config_refusals_name_the_key_and_the_fix(raw, key):
    with pytest.raises(UmaError) as info:
        w.validate(raw)
    assert info.value.option == key
    assert info.value.message.startswith("option '%s' = " % key)
    assert info.value.fix


def test_config_defaults_and_derived_values():
    c = cfg(base_url="http://127.0.0.1:8000/")
    assert c["unit"] == "uma-vllm@main.service"
    assert c["base_url"] == "http://127.0.0.1:8000"
    assert c["meminfo_root"] == "/proc"
    assert c["rank"] == 0 and c["peers"] == []
    peer = w.validate({"engine": "m", "rank": 1, "leader_url": "http://ai1:9411/status", "status_port": 9411})
    assert peer["rank"] == 1


# --------------------------------------------------------------------------
# floors


@pytest.mark.parametrize("ram_gib", [8, 24, 64, 119, 121, 480])
def test_floors_follow_the_reserve_rule(ram_gib):
    ram = ram_gib * GIB
    floors = w.size_floors(ram)
    reserve = size_min_free_kbytes(ram)["min_free_kbytes"] * 1024
    assert floors["critical_bytes"] == reserve
    assert floors["warn_bytes"] == 2 * reserve
    assert floors["warn_bytes"] < ram


def test_floors_overrides_and_refusals():
    floors = w.size_floors(24 * GIB, warn_mib=4096, critical_mib=1024)
    assert (floors["warn_bytes"], floors["critical_bytes"], floors["rule"]) == (4 * GIB, GIB, "explicit")
    with pytest.raises(UmaError) as info:
        w.size_floors(24 * GIB, warn_mib=512, critical_mib=1024)
    assert info.value.option == "warn_floor_mib"
    with pytest.raises(UmaError):
        w.size_floors(2 * GIB, warn_mib=4096)


def test_memory_view_reads_mem_available_and_on_uma_the_gpu_headroom():
    meminfo = {"MemAvailable": 10 * GIB, "MemFree": 3 * GIB, "Cached": 7 * GIB}
    assert w.memory_view(meminfo, False) == {"available": 10 * GIB, "gpu_headroom": None}
    assert w.memory_view(meminfo, True, GIB) == {"available": 10 * GIB, "gpu_headroom": 2 * GIB}
    assert w.memory_view({"MemAvailable": 1, "MemFree": 0}, True, GIB)["gpu_headroom"] == 0


@pytest.mark.parametrize(
    "available, headroom, level",
    [
        (16 * GIB, None, "ok"),
        (FLOORS["warn_bytes"] - 1, None, "warn"),
        (FLOORS["critical_bytes"] - 1, None, "critical"),
        (16 * GIB, FLOORS["warn_bytes"] - 1, "warn"),  # cache the GPU cannot use in time: evict, no restart
        (16 * GIB, 0, "warn"),
        (None, None, "ok"),
    ],
)
def test_floor_levels(available, headroom, level):
    assert w.floor_level({"available": available, "gpu_headroom": headroom}, FLOORS)[0] == level


# --------------------------------------------------------------------------
# metrics text and liveness

VLLM_METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 2.0
vllm:num_requests_waiting{engine="0",model_name="tiny"} 1.0
vllm:generation_tokens_total{engine="0",model_name="tiny"} 1234.0
vllm:prompt_tokens_total{engine="0",model_name="tiny"} 99.0
vllm:iteration_tokens_total_count{engine="0",model_name="tiny"} 17.0
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="tiny"} 3.0
http_requests_total{handler="/health",method="GET"} 5.0
python_gc_objects_collected_total{generation="0"} NaN
"""


def test_parse_vllm_metrics():
    view = w.metrics_view(w.parse_prometheus(VLLM_METRICS))
    assert view == {
        "running": 2,
        "waiting": 1,
        "progress": {
            "vllm:generation_tokens_total": 1234.0,
            "vllm:prompt_tokens_total": 99.0,
            "vllm:iteration_tokens_total_count": 17.0,
        },
    }
    assert w.metrics_view(w.parse_prometheus("up 1\n")) is None
    assert w.is_busy(view) and not w.needs_probe(view)
    assert w.needs_probe(None) and w.needs_probe({"running": 0, "waiting": 0})


def test_progress():
    a = {"vllm:generation_tokens_total": 1.0}
    assert not w.progressed(a, dict(a))
    assert w.progressed(a, {"vllm:generation_tokens_total": 2.0})
    assert w.progressed(a, {"vllm:generation_tokens_total": 0.0})  # counter reset = new engine
    assert not w.progressed(None, a)


def busy(tokens, running=1, waiting=0):
    return {"running": running, "waiting": waiting, "progress": {"vllm:generation_tokens_total": float(tokens)}}


def test_busy_engine_with_moving_counters_is_never_wedged():
    c = cfg(busy_stall_s=60)
    state = healthy_state(c)
    obs = [ok_obs(metrics=busy(i * 10), probe=None) for i in range(1, 500)]  # 41 min of load
    state, done = run(c, obs, start=5.0)
    assert state["phase"] == "healthy"
    assert [a for _t, a in done if a["do"] in ("restart", "stop")] == []
    assert state["counts"]["wedges"] == 0


def test_long_prefill_without_counter_progress_stays_below_the_stall_bound():
    # vLLM counts prompt tokens only when the first token comes out: a long prefill moves nothing
    c = cfg(busy_stall_s=600)
    state = healthy_state(c)
    obs = [ok_obs(metrics=busy(10), probe=None) for _unused in range(110)]  # 550 s of one prefill
    obs += [ok_obs(metrics=busy(11), probe=None)]  # first token
    obs += [ok_obs(metrics=busy(11 + i), probe=None) for i in range(1, 50)]
    state, done = run(c, obs, start=5.0)
    assert state["phase"] == "healthy" and done == []


def test_busy_engine_stuck_past_the_stall_bound_is_wedged():
    c = cfg(busy_stall_s=60, fail_threshold=2)
    state = healthy_state(c)
    _state, done = run(c, [ok_obs(metrics=busy(10), probe=None) for _unused in range(20)], start=5.0, state=state)
    restarts = [(t, a) for t, a in done if a["do"] == "restart"]
    assert restarts, done
    t, action = restarts[0]
    assert action["kind"] == "busy_stall"
    assert 65.0 <= t <= 75.0  # stalled >= 60 s at the first failing tick, then one more tick
    assert "no counter progress" in action["reason"]


def test_idle_engine_whose_completion_fails_is_wedged_after_the_threshold():
    c = cfg(fail_threshold=3)
    state = healthy_state(c)
    bad = ok_obs(probe={"ok": False, "latency_s": 20.0, "error": "timed out"})
    state, done = run(c, [bad, bad], start=5.0, state=state)
    assert state["phase"] == "suspect" and done == []
    state, done = run(c, [bad], start=15.0, state=state)
    assert [a["do"] for _t, a in done] == ["restart"]
    assert done[0][1]["kind"] == "probe" and "timed out" in done[0][1]["reason"]
    assert state["phase"] == "starting" and state["epoch"] == 1 and state["counts"]["wedges"] == 1


def test_one_failed_probe_then_success_recovers_without_action():
    c = cfg(fail_threshold=2)
    state = healthy_state(c)
    bad = ok_obs(probe={"ok": False, "error": "HTTP 500"})
    state, done = run(c, [bad, ok_obs()], start=5.0, state=state)
    assert state["phase"] == "healthy" and done == [] and state["fails"] == 0


@pytest.mark.parametrize(
    "over, kind",
    [
        ({"health": {"ok": False, "error": "connection refused"}}, "health"),
        ({"local": {"ok": False, "reason": "process 12 is stopped"}}, "local"),
        ({"peers": {"ai2": {"ok": False, "reason": "no process left"}}}, "peer"),
        ({"peers": {"ai2": {"ok": True, "critical_floor": True}}}, "peer_floor"),
    ],
)
def test_each_failure_kind_leads_to_a_restart(over, kind):
    c = cfg(fail_threshold=2)
    state = healthy_state(c)
    state, done = run(c, [ok_obs(**over)] * 2, start=5.0, state=state)
    assert [(a["do"], a["kind"]) for _t, a in done] == [("restart", kind)]


def test_rank1_dead_while_rank0_health_says_200_is_detected_within_the_bound():
    # without the launchers' rank link (grace 0) the watchdog acts within its own bound
    c = cfg(
        fail_threshold=2,
        interval_s=5,
        peers=[{"name": "ai2", "url": "http://ai2:9411/status"}],
        status_port=9411,
        rank_link_grace_s=0,
    )
    state = healthy_state(c)
    dead = ok_obs(peers={"ai2": w.peer_view({"unit": "active", "local": {"ok": False, "reason": "0 of 1"}}, 1, c)})
    state, done = run(c, [dead, dead], start=5.0, state=state)
    assert done and done[0][0] - 5.0 <= c["fail_threshold"] * c["interval_s"]
    assert done[0][1]["kind"] == "peer"


# --------------------------------------------------------------------------
# starting, stopped, systemd's own restarts


def test_a_loading_engine_is_not_wedged_before_the_start_timeout():
    c = cfg(start_timeout_s=100)
    down = ok_obs(unit="activating", health=None, metrics=None, probe=None)
    state, done = run(c, [down] * 19, start=0.0)
    assert state["phase"] == "starting" and done == []
    state, done = run(c, [down] * 3, start=95.0, state=state)
    assert [a["kind"] for _t, a in done if a["do"] == "restart"] == ["start_timeout"]


def test_a_restart_after_a_start_timeout_gives_the_new_start_its_own_timeout():
    # an engine that never becomes healthy: the first restart comes at the start timeout (no
    # backoff before the first); the start it makes must get the whole start_timeout_s again
    # (found in the lab: gave up 1 tick after the first restart, 4.5 s with start_timeout_s 3)
    c = cfg(start_timeout_s=100, max_restarts=1)
    dead = ok_obs(local={"ok": False, "reason": "0 of 1 processes"}, health={"ok": False}, metrics=None, probe=None)
    state, done = run(c, [dead] * 22, start=0.0)  # t = 0 .. 105
    restarts = [t for t, a in done if a["do"] == "restart"]
    assert restarts == [100.0] and state["phase"] == "starting"
    assert state["phase_since"] == 100.0
    state, done = run(c, [dead] * 18, start=110.0, state=state)  # t = 110 .. 195: inside the new start's 100 s
    assert done == [] and state["phase"] == "starting"
    state, done = run(c, [dead], start=200.0, state=state)
    assert [a["do"] for _t, a in done] == ["stop"] and state["phase"] == "gave_up"


def test_a_critical_floor_while_starting_is_recorded_not_restarted():
    """The load's own memory dips under the floor (VM lab: launches at the planner's KV size, and each
    restart killed a load that would have served): recorded once per start, left to the start timeout."""
    c = cfg(start_timeout_s=100, floor_samples=2)
    low = ok_obs(unit="activating", health=None, metrics=None, probe=None, mem={"available": 100 * MIB})
    state, done = run(c, [low] * 6, start=50.0)  # t = 50 .. 75
    assert [a["do"] for _t, a in done if a["do"] != "evict"] == ["record"]
    (note,) = [a for _t, a in done if a["do"] == "record"]
    assert note["action"] == "floor-while-starting" and "critical floor" in note["reason"], note
    assert note["evidence"]["mem"]["available"] == 100 * MIB
    assert state["phase"] == "starting" and state["phase_since"] == 50.0
    # the memory comes back and the engine answers: healthy, nothing restarted
    state, done = run(c, [ok_obs()], start=80.0, state=state)
    assert state["phase"] == "healthy" and [a for _t, a in done if a["do"] == "restart"] == []
    # once healthy, the same floor restarts as before (after floor_samples ticks)
    state, done = run(c, [ok_obs(mem={"available": 100 * MIB})] * 2, start=85.0, state=state)
    assert [(t, a["kind"]) for t, a in done if a["do"] == "restart"] == [(90.0, "floor")]


def test_a_start_under_the_floor_still_ends_at_the_start_timeout():
    c = cfg(start_timeout_s=30, floor_samples=2)
    low = ok_obs(unit="active", health={"ok": False, "error": "refused"}, metrics=None, probe=None,
                 mem={"available": 100 * MIB})  # fmt: skip
    _state, done = run(c, [low] * 10, start=0.0)  # t = 0 .. 45
    assert [(t, a["kind"]) for t, a in done if a["do"] == "restart"] == [(30.0, "start_timeout")]
    # noted once in each start (the restart's start counts floor_samples ticks afresh)
    assert [t for t, a in done if a["do"] == "record"] == [5.0, 40.0]


def test_an_operator_stop_is_never_fought():
    c = cfg()
    state = healthy_state(c)
    state, done = run(c, [ok_obs(unit="inactive", local={"ok": False, "reason": "unit inactive"})] * 50, state=state)
    assert state["phase"] == "stopped"
    assert [a["do"] for _t, a in done] == ["record"]
    state, _unused = run(c, [ok_obs(unit="activating")], start=300.0, state=state)
    assert state["phase"] == "starting"
    state, _unused = run(c, [ok_obs()], start=305.0, state=state)
    assert state["phase"] == "healthy"


def test_systemd_restarts_count_in_the_window_and_reach_the_limit():
    c = cfg(max_restarts=3, window_s=3600)
    state = healthy_state(c)
    state, _unused = run(c, [ok_obs(unit="activating", n_restarts=2)], start=10.0, state=state)
    assert len(state["restarts"]) == 2 and state["phase"] == "starting"
    state, _unused = run(c, [ok_obs(n_restarts=2)], start=20.0, state=state)
    assert len(state["restarts"]) == 2  # the same NRestarts is not counted twice
    bad = ok_obs(n_restarts=2, health={"ok": False, "error": "refused"})
    state, done = run(c, [bad] * 20, start=30.0, state=state)
    # systemd's two restarts at t=10 set the backoff: 30 s * 2^(2-1) = 60 s, so not before t=70
    assert [(t, a["do"]) for t, a in done] == [(70.0, "restart")]
    # our restart (systemctl start) resets NRestarts to 0: a drop is a new baseline, not a restart
    state, _unused = run(c, [ok_obs(n_restarts=0)], start=200.0, state=state)
    assert len(state["restarts"]) == 3
    bad = ok_obs(n_restarts=0, health={"ok": False, "error": "refused"})
    state, done = run(c, [bad] * 2, start=210.0, state=state)
    assert [a["do"] for _t, a in done] == ["stop"]
    assert state["phase"] == "gave_up" and "gave up after 3 restarts" in state["reason"]


# --------------------------------------------------------------------------
# bounded healing


@pytest.mark.parametrize("k, expected", [(0, 0), (1, 30), (2, 60), (3, 120), (5, 480), (6, 600), (20, 600)])
def test_backoff_doubles_and_is_capped(k, expected):
    assert w.backoff_s(cfg(backoff_initial_s=30, backoff_max_s=600), k) == expected


def wedge_cycle(c, state, t, settle=True):
    """One healthy tick (after a restart) then failures until an action; returns state, t, action."""
    if settle:
        state, _unused = run(c, [ok_obs()], start=t, state=state)
        t += 5
    bad = ok_obs(probe={"ok": False, "error": "timed out"})
    for _unused in range(1000):
        state, actions = w.decide(c, FLOORS, state, bad, t)
        if actions:
            return state, t, actions[-1]
        t += 5
    raise AssertionError("no action")


def test_restarts_back_off_then_stop_at_the_window_limit_and_stay_stopped():
    c = cfg(fail_threshold=2, backoff_initial_s=30, backoff_max_s=600, max_restarts=3, window_s=3600)
    state = healthy_state(c)
    times = []
    t = 5.0
    for _unused in range(3):
        state, t, action = wedge_cycle(c, state, t)
        assert action["do"] == "restart"
        times.append(t)
        t += 5
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert gaps[0] >= 30 and gaps[1] >= 60, times  # backoff between restarts
    state, t, action = wedge_cycle(c, state, t)
    assert action["do"] == "stop" and state["phase"] == "gave_up"
    assert state["counts"]["restarts"] == 3 and state["counts"]["gave_up"] == 1
    # left stopped: nothing more happens however long the failure lasts
    state, done = run(c, [ok_obs(unit="inactive", health=None)] * 500, start=t + 5, state=state)
    assert done == [] and state["phase"] == "gave_up"


def test_the_window_forgets_old_restarts():
    c = cfg(fail_threshold=1, backoff_initial_s=1, backoff_max_s=1, max_restarts=2, window_s=100)
    state = healthy_state(c)
    state, t, a1 = wedge_cycle(c, state, 5.0)
    state, t, a2 = wedge_cycle(c, state, t + 5)
    state, t, a3 = wedge_cycle(c, state, t + 200)  # both older than the window
    assert [a1["do"], a2["do"], a3["do"]] == ["restart", "restart", "restart"]


def healthy_for(c, state, t, seconds):
    """Healthy serving (one tick every 5 s) for ``seconds``; returns state, t after it, the actions."""
    state, done = run(c, [ok_obs()] * int(seconds // 5), start=t, state=state)
    return state, t + 5 * int(seconds // 5), [a for _t, a in done]


def test_healed_faults_leave_the_restart_budget():
    """Issue 19: three separate faults within an hour, each healed and followed by healthy serving,
    made the fourth give up (every rank left stopped). With healthy_reset_s (default 600 s) each
    healed restart leaves the budget: the fourth fault is restarted at once, like the first."""
    c = cfg()
    assert (c["max_restarts"], c["window_s"], c["healthy_reset_s"]) == (3, 3600.0, 600.0)
    state = healthy_state(c)
    t, first = 5.0, None
    for fault in range(4):
        state, t, action = wedge_cycle(c, state, t)
        first = t if first is None else first
        assert action["do"] == "restart" and action["kind"] == "probe", (fault, action)
        state, t, done = healthy_for(c, state, t + 5, 660)
        assert [a["do"] for a in done if a.get("action") == "budget-reset"] == ["reset-start-limit"]
        assert state["restarts"] == [] and state["phase"] == "healthy"
    assert t - first < 3600  # four faults inside one window
    assert state["counts"]["restarts"] == 4 and state["counts"]["gave_up"] == 0


@pytest.mark.parametrize("rank", [0, 1])
def test_healed_systemd_restarts_also_clear_systemds_start_limit(rank):
    """The faults the rank link heals (a dead rank process: exit 69, systemd's Restart=) count against
    the unit's StartLimitBurst (3 starts per 1800 s) as well as the watchdog's budget. Found in the
    container lab's drills: the fourth such fault in half an hour was refused by systemd ("Start request
    repeated too quickly") and the engine stayed down. Each node's watchdog now clears its own unit's
    start limit when the restarts healed (healthy for healthy_reset_s); a crash loop does not."""
    peer = (
        {"leader_url": "http://ai1:9411/status"}
        if rank
        else {"peers": [{"name": "ai2", "url": "http://ai2:9411/status"}]}
    )
    c = cfg(rank=rank, status_port=9411, **peer)
    state = healthy_state(c)
    t, restarts = 5.0, 0
    for _fault in range(4):
        restarts += 1
        # exit 69, systemd restarts the unit (RestartSec), the engine loads, then serves 11 minutes
        down = {"unit": "activating", "n_restarts": restarts, "exit_status": 69,
                "local": {"ok": False, "reason": "0 processes"},
                "health": {"ok": False, "latency_s": None}}  # fmt: skip
        state, done = run(c, [ok_obs(**down)] * 4 + [ok_obs(n_restarts=restarts)] * 133, start=t, state=state)
        t += 5 * 137
        assert [a["action"] for _t, a in done][:1] == ["systemd-restart"], done
        resets = [a for _t, a in done if a.get("action") == "budget-reset"]
        assert [a["do"] for a in resets] == ["reset-start-limit"], done
        assert "systemd's start limit" in resets[0]["reason"]
    assert state["counts"]["gave_up"] == 0


def test_a_crash_loop_keeps_systemds_start_limit():
    """Restarts that are not followed by healthy_reset_s of serving leave systemd's start limit alone."""
    c = cfg()
    state = healthy_state(c)
    state, done = run(c, [ok_obs(n_restarts=1, exit_status=69)] + [ok_obs(n_restarts=1)] * 12, start=5.0,
                      state=state)  # fmt: skip
    assert not [a for _t, a in done if a["do"] == "reset-start-limit"]


def test_without_the_reset_the_fourth_healed_fault_gives_up():
    """The same four healed faults when a healthy stretch never resets (healthy_reset_s > window_s):
    the old behaviour, the fourth gives up."""
    c = cfg(healthy_reset_s=7200)
    state = healthy_state(c)
    t = 5.0
    actions = []
    for _fault in range(4):
        state, t, action = wedge_cycle(c, state, t)
        actions.append(action["do"])
        if action["do"] == "stop":
            break
        state, t, _done = healthy_for(c, state, t + 5, 660)
    assert actions == ["restart", "restart", "restart", "stop"] and state["phase"] == "gave_up"


def test_a_crash_loop_still_gives_up():
    """Starts that fail again soon (healthy for one minute, then wedged) keep counting."""
    c = cfg()
    state = healthy_state(c)
    t = 5.0
    actions = []
    for _fault in range(4):
        state, t, action = wedge_cycle(c, state, t)
        actions.append(action["do"])
        if action["do"] == "stop":
            break
        state, t, done = healthy_for(c, state, t + 5, 60)
        assert not [a for a in done if a.get("action") == "budget-reset"]
    assert actions == ["restart", "restart", "restart", "stop"] and state["phase"] == "gave_up"


def test_systemd_restarts_of_a_start_that_never_gets_healthy_still_count():
    """A rank-link exit loop (systemd restarts, the engine never healthy in between) gives up as before."""
    c = cfg(peers=[{"name": "ai2", "url": "http://ai2:9411/status"}], status_port=9411)
    state = healthy_state(c)
    t = 5.0
    for n in range(1, 5):
        state, _actions = w.decide(c, FLOORS, state, ok_obs(unit="activating", n_restarts=n, health=None), t)
        t += 700  # long apart, but never healthy in between: no reset
    assert state["phase"] == "gave_up" and "systemd restarted the engine 4 times" in state["reason"]


def test_an_operator_start_after_giving_up_resumes_watching():
    c = cfg(fail_threshold=1, max_restarts=1)
    state = healthy_state(c)
    state, t, _unused = wedge_cycle(c, state, 5.0)
    state, t, action = wedge_cycle(c, state, t + 5)
    assert action["do"] == "stop"
    state, done = run(c, [ok_obs(unit="activating")], start=t + 5, state=state)
    assert state["phase"] == "starting" and [a["do"] for _t, a in done] == ["record"]


# --------------------------------------------------------------------------
# memory floors


def test_warning_floor_evicts_rate_limited_and_never_restarts():
    c = cfg(evict_every_s=30)
    state = healthy_state(c)
    low = ok_obs(mem={"available": FLOORS["warn_bytes"] - MIB, "gpu_headroom": None})
    state, done = run(c, [low] * 12, start=5.0, state=state)  # 60 s
    assert [a["do"] for _t, a in done] == ["evict", "evict"]
    assert state["counts"]["floor_warn"] == 2 and state["phase"] == "healthy"


def test_critical_floor_restarts_after_floor_samples_even_during_backoff():
    c = cfg(floor_samples=2)
    state = healthy_state(c)
    crit = ok_obs(mem={"available": FLOORS["critical_bytes"] - MIB, "gpu_headroom": None})
    state, done = run(c, [crit, crit], start=5.0, state=state)
    assert [a["do"] for _t, a in done] == ["evict", "restart"]
    assert done[1][1]["kind"] == "floor" and "critical floor" in done[1][1]["reason"]
    assert state["counts"]["floor_critical"] == 1
    # still critical right after: the backoff does not hold a floor restart back
    state, done = run(c, [crit, crit], start=15.0, state=state)
    assert "restart" in [a["do"] for _t, a in done]


def test_critical_floor_on_a_peer_rank_only_reports():
    c = w.validate({"engine": "m", "rank": 1, "leader_url": "http://ai1:9411/status", "status_port": 9411})
    state = healthy_state(c)
    crit = ok_obs(mem={"available": FLOORS["critical_bytes"] - MIB, "gpu_headroom": None})
    state, done = run(c, [crit] * 4, start=5.0, state=state)
    assert [a["do"] for _t, a in done] == ["evict"]
    assert state["floor"] == "critical" and state["phase"] == "suspect"


# --------------------------------------------------------------------------
# peers


def test_peer_view():
    c = cfg(peer_timeout_s=15)
    alive = {"unit": "active", "local": {"ok": True}, "floor": "ok"}
    assert w.peer_view(alive, 1.0, c)["ok"]
    assert w.peer_view(dict(alive, floor="critical"), 1.0, c)["critical_floor"]
    assert not w.peer_view(alive, 16.0, c)["ok"]
    assert "unreachable" in w.peer_view(None, 20.0, c)["reason"]
    assert "inactive" in w.peer_view(dict(alive, unit="inactive"), 1.0, c)["reason"]
    assert w.peer_view(dict(alive, local={"ok": False, "reason": "stopped"}), 1.0, c)["reason"] == "stopped"


@pytest.mark.parametrize(
    "leader, mine, expected",
    [
        (None, {}, None),
        ({"epoch": 0, "phase": "healthy"}, {}, None),
        ({"epoch": 1, "phase": "restart_stop"}, {"acked_stop": 0, "acked_start": 0}, "stop"),
        ({"epoch": 1, "phase": "restart_stop"}, {"acked_stop": 1, "acked_start": 0}, None),
        ({"epoch": 1, "phase": "restart_start"}, {"acked_stop": 1, "acked_start": 0}, "start"),
        ({"epoch": 1, "phase": "restart_start"}, {"acked_stop": 0, "acked_start": 0}, "stop"),
        ({"epoch": 1, "phase": "restart_start"}, {"acked_stop": 1, "acked_start": 1}, None),
        # a fresh peer (or a restarted peer watchdog) never acts on rank 0's own phases
        ({"epoch": 5, "phase": "starting"}, {"acked_stop": 0, "acked_start": 0}, None),
        ({"epoch": 5, "phase": "healthy"}, {"acked_stop": 0, "acked_start": 0}, None),
        ({"epoch": 5, "phase": "suspect"}, {}, None),
        ({"epoch": 2, "phase": "gave_up", "counts": {"gave_up": 1}}, {"acked_gave_up": 0}, "stay_stopped"),
        ({"epoch": 2, "phase": "gave_up", "counts": {"gave_up": 1}}, {"acked_gave_up": 1}, None),
        ({"epoch": 2, "phase": "gave_up", "counts": {"gave_up": 2}}, {"acked_gave_up": 1}, "stay_stopped"),
        # after a give-up and an operator's start, the next restart (epoch 3) is carried out normally
        (
            {"epoch": 3, "phase": "restart_stop", "counts": {"gave_up": 1}},
            {"acked_stop": 2, "acked_gave_up": 1},
            "stop",
        ),
    ],
)
def test_peer_reaction(leader, mine, expected):
    assert w.peer_reaction(leader, mine) == expected


# --------------------------------------------------------------------------
# the launchers' rank link and the watchdog never fight; its restarts are bounded too

PEERS = {"peers": [{"name": "ai2", "url": "http://ai2:9411/status"}], "status_port": 9411}


def _peer(status_local):
    return {"ai2": w.peer_view({"unit": "active", "local": status_local}, 1, cfg(**PEERS))}


def test_a_dead_peer_rank_is_left_to_the_rank_link_for_the_grace_then_counted():
    c = cfg(fail_threshold=2, interval_s=5, rank_link_grace_s=30, **PEERS)
    state = healthy_state(c)
    dead = ok_obs(peers=_peer({"ok": False, "reason": "0 of 1 processes matching 'VLLM::Worker' alive"}))
    state, done = run(c, [dead] * 6, start=5.0, state=state)  # t = 5 .. 30: inside the grace
    assert done == [] and state["phase"] == "suspect" and "left to the rank link" in state["reason"]
    state, done = run(c, [dead] * 3, start=35.0, state=state)  # grace over at t=35, then fail_threshold ticks
    assert [(t, a["do"], a["kind"]) for t, a in done] == [(40.0, "restart", "peer")]


def test_the_rank_link_restart_by_systemd_is_not_repeated_by_the_watchdog():
    c = cfg(fail_threshold=2, interval_s=5, rank_link_grace_s=30, **PEERS)
    state = healthy_state(c)
    dead = ok_obs(peers=_peer({"ok": False, "reason": "0 of 1"}))
    # the rank link: every rank exits 69, systemd restarts (auto-restart = activating), the ranks load
    restarting = ok_obs(unit="activating", n_restarts=1, exit_status=69, health=None, metrics=None, probe=None)
    state, done = run(c, [dead, restarting, restarting, restarting, ok_obs(n_restarts=1)], start=5.0, state=state)
    assert [a["do"] for _t, a in done] == ["record"] and done[0][1]["action"] == "systemd-restart"
    assert "exit status 69" in done[0][1]["reason"]
    assert state["phase"] == "healthy" and len(state["restarts"]) == 1


def test_a_stopped_rank_process_is_a_wedge_for_the_watchdog_at_once():
    c = cfg(fail_threshold=2, interval_s=5, rank_link_grace_s=30, **PEERS)
    state = healthy_state(c)
    wedged = ok_obs(local={"ok": False, "reason": "process 7 (VLLM::EngineCore) is stopped (state T)", "stopped": True})
    state, done = run(c, [wedged] * 2, start=5.0, state=state)
    assert [(t, a["do"], a["kind"]) for t, a in done] == [(10.0, "restart", "local")]
    stopped_peer = ok_obs(peers=_peer({"ok": False, "reason": "process 9 is stopped (state T)", "stopped": True}))
    state, done = run(c, [ok_obs(n_restarts=0)] + [stopped_peer] * 2, start=100.0, state=state)
    assert [a["do"] for _t, a in done if a["do"] != "record"] == ["restart"]


def test_systemd_restarts_over_the_limit_stop_every_rank():
    c = cfg(max_restarts=2, window_s=3600, **PEERS)
    state = healthy_state(c)
    loop = []
    for n in (1, 2, 3):  # an engine that exits 69 at every start: systemd restarts it again and again
        loop += [ok_obs(unit="activating", n_restarts=n, exit_status=1, health=None, metrics=None, probe=None)] * 2
    state, done = run(c, loop[:-1], start=5.0, state=state)  # the stop leaves the unit inactive
    assert [a["do"] for _t, a in done] == ["record", "record", "record", "stop"]
    assert state["phase"] == "gave_up" and state["counts"]["gave_up"] == 1
    assert "systemd restarted the engine 3 times in 3600 s (limit 2; last exit status 1)" in state["reason"]
    state, done = run(c, [ok_obs(unit="inactive", n_restarts=3)] * 5, start=100.0, state=state)
    assert done == [] and state["phase"] == "gave_up"


def test_systemd_start_limit_hit_is_a_give_up_with_its_reason():
    c = cfg(max_restarts=5, **PEERS)
    state = healthy_state(c)
    hit = ok_obs(unit="failed", result="start-limit-hit", exit_status=69, n_restarts=2, local={"ok": False})
    state, done = run(c, [hit, hit], start=5.0, state=state)
    assert [a["do"] for _t, a in done] == ["record", "stop"]
    assert state["phase"] == "gave_up" and "start limit hit" in state["reason"]
    # an operator's stop (result success) is still never fought
    c1 = cfg()
    s1 = healthy_state(c1)
    s1, done = run(c1, [ok_obs(unit="inactive", result="success", local={"ok": False})] * 3, state=s1)
    assert s1["phase"] == "stopped" and [a["do"] for _t, a in done] == ["record"]


@pytest.mark.parametrize("bad", [-1, "30", True, float("nan")])
def test_rank_link_grace_refused_with_fix(bad):
    with pytest.raises(UmaError) as err:
        cfg(rank_link_grace_s=bad)
    assert "rank_link_grace_s" in err.value.message and "Give e.g. 30" in err.value.message


def test_a_unit_that_systemd_stopped_restarting_is_a_give_up():
    # measured in molecule/cluster: NRestarts 3 (= the limit), then the unit failed with Result=exit-code
    c = cfg(max_restarts=3, **PEERS)
    state = healthy_state(c)
    loop = [
        ok_obs(unit="activating", n_restarts=n, exit_status=1, health=None, metrics=None, probe=None) for n in (1, 2, 3)
    ]
    dead = ok_obs(unit="failed", result="exit-code", exit_status=1, n_restarts=3, local={"ok": False})
    state, done = run(c, [*loop, dead], start=5.0, state=state)
    assert [a["do"] for _t, a in done] == ["record", "record", "record", "stop"]
    assert "the engine unit failed (exit-code, last exit status 1) after 3 restart(s)" in state["reason"]
    # the operator starts it again: watched afresh, and the next systemd restart is not a second give-up
    state, done = run(c, [ok_obs(unit="activating", n_restarts=0), ok_obs(n_restarts=0)], start=100.0, state=state)
    assert state["phase"] == "healthy" and state["restarts"] == []
    state, done = run(c, [ok_obs(unit="activating", n_restarts=1, exit_status=69)], start=200.0, state=state)
    assert [a["do"] for _t, a in done] == ["record"] and state["phase"] == "starting"
    # a failed unit systemd never restarted (e.g. exit 78, a refused config) is left alone: watching only
    s1 = healthy_state(c)
    s1, done = run(c, [ok_obs(unit="failed", result="exit-code", exit_status=78, local={"ok": False})] * 2, state=s1)
    assert s1["phase"] == "stopped" and [a["do"] for _t, a in done] == ["record"]


def test_a_restart_between_two_ticks_is_a_new_load_not_a_fault():
    # measured in molecule/cluster: a play's `systemctl restart` of rank 0 (Type=exec: "active" at
    # once) was seen as a healthy engine whose EngineCore was missing; 30 s later the watchdog restarted it
    c = cfg(fail_threshold=2, rank_link_grace_s=30, **PEERS)
    state, _unused = run(c, [ok_obs(invocation="a")])
    assert state["phase"] == "healthy"
    missing = {"ok": False, "reason": "0 of 1 processes matching 'VLLM::EngineCore' alive"}
    loading = ok_obs(invocation="b", local=missing, health={"ok": False, "error": "refused"}, metrics=None, probe=None)
    state, done = run(c, [loading] * 12, start=5.0, state=state)  # 60 s of loading
    assert state["phase"] == "starting" and [a for _t, a in done if a["do"] in ("restart", "stop")] == []
    state, _unused = run(c, [ok_obs(invocation="b")], start=65.0, state=state)
    assert state["phase"] == "healthy"
