# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The watchdog's reading of vLLM's own counters (private to the collection, stdlib only, pure).

vLLM's ``/metrics`` says whether the engine has work (the gauges) and whether it makes
progress (the counters). From them the watchdog decides when its idle probe, a real
1-token completion, is worth sending: only after the counters have shown the engine idle
for ``probe_idle_s`` and at most once per ``probe_idle_s`` (default 60 s). An engine whose
counters move serves requests: a probe would prove nothing more, and every probe is a
request that vLLM counts like any other.

What vLLM's metrics can and cannot tell apart (checked against vLLM 0.32,
``vllm/v1/metrics/loggers.py``): every ``vllm:*`` series carries only the labels
``model_name`` and ``engine`` (plus ``finished_reason``, ``reason``, ``source`` on a few);
there is no per-client or per-request label. So a probe *cannot* be kept out of
``vllm:request_success_total``, ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``
or the latency histograms. It is recognisable elsewhere: its ``X-Request-Id`` header
(``uma-vllm-watchdog-...``) becomes vLLM's request id (``cmpl-uma-vllm-watchdog-...`` in
vLLM's request log), it carries ``"user": "uma-vllm-watchdog"``, and the watchdog counts
what it sent in ``uma_vllm_watchdog_probes_total{engine}`` so that an alert or a dashboard
can subtract it (``increase(vllm:request_success_total[1h]) - increase(uma_vllm_watchdog_probes_total[1h])``).

Used by ``_watchdog_logic`` (which re-exports the names it always had) and through it by the
watchdog program; no I/O, no clock: ``now`` is given.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional

# vLLM's own Prometheus names (vllm/v1/metrics/loggers.py). The gauges say
# whether the engine has work; the counters say whether it makes progress.
METRIC_RUNNING = "vllm:num_requests_running"
METRIC_WAITING = "vllm:num_requests_waiting"
METRIC_SUCCESS = "vllm:request_success_total"
PROGRESS_METRICS = (
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:iteration_tokens_total_count",
    METRIC_SUCCESS,
)
PROBE_USER = "uma-vllm-watchdog"  # the probe's "user" field and X-Request-Id prefix


def is_busy(metrics: Optional[Dict[str, Any]]) -> bool:
    if not metrics:
        return False
    return (metrics.get("running") or 0) > 0 or (metrics.get("waiting") or 0) > 0


def needs_probe(metrics: Optional[Dict[str, Any]]) -> bool:
    """The 1-token completion is never sent to a busy engine (it would queue behind the load)."""
    return not is_busy(metrics)


def parse_prometheus(text: str) -> Dict[str, float]:
    """Sum of every sample per metric name (labels dropped) of a Prometheus text exposition."""
    sums: Dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _sep, rest = line.partition(" ")
        if "{" in line:
            name_part = line[: line.index("{")]
            rest = line[line.rindex("}") + 1 :]
        fields = rest.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        if math.isnan(value):
            continue
        sums[name_part] = sums.get(name_part, 0.0) + value
    return sums


def metrics_view(samples: Dict[str, float]) -> Optional[Dict[str, Any]]:
    """running / waiting / progress counters; None when the text is not vLLM's /metrics."""
    if METRIC_RUNNING not in samples and METRIC_WAITING not in samples:
        return None
    return {
        "running": int(samples.get(METRIC_RUNNING, 0)),
        "waiting": int(samples.get(METRIC_WAITING, 0)),
        "progress": {k: samples[k] for k in PROGRESS_METRICS if k in samples},
    }


def progressed(before: Optional[Dict[str, float]], after: Optional[Dict[str, float]]) -> bool:
    """Any of vLLM's counters moved (a counter that went down = the engine restarted: also movement)."""
    if not before or not after:
        return False
    return any(after.get(k) != before.get(k) for k in set(before) | set(after))


def _only_probes(before: Dict[str, float], after: Dict[str, float], probes: int) -> bool:
    """The movement is the watchdog's own probes' (sent since ``before`` was read), not a client's."""
    if probes <= 0:
        return False
    if METRIC_SUCCESS in before and METRIC_SUCCESS in after:
        # each probe finishes as one request; more finished requests = a client was served too
        return after[METRIC_SUCCESS] - before[METRIC_SUCCESS] <= probes
    return True


def track_idle(state: Dict[str, Any], obs: Dict[str, Any], now: float) -> None:
    """Remember since when the counters show the engine idle, and the probe this tick sent.

    The probe of a tick is sent after that tick's /metrics was read, so its counts show in
    the next reading: movement that the probes sent since the last reading explain does not
    end the idle stretch; any other movement (a client served) or work (running/waiting) does.
    """
    probe = obs.get("probe")
    if probe is not None:
        state["last_probe_at"] = now
        state["probe_failed"] = not probe.get("ok")
        state["counts"]["probes"] = state["counts"].get("probes", 0) + 1
    metrics = obs.get("metrics")
    sent = 1 if probe is not None else 0
    if not metrics or metrics.get("progress") is None:
        state["probes_pending"] = state.get("probes_pending", 0) + sent
        return
    counters = metrics["progress"]
    before = state.get("idle_counters")
    if is_busy(metrics):
        state["idle_since"] = None
    elif state.get("idle_since") is None:
        state["idle_since"] = now
    elif before is not None and progressed(before, counters):
        if not _only_probes(before, counters, state.get("probes_pending", 0)):
            state["idle_since"] = now  # a client's request finished: the engine served it
    state["idle_counters"] = counters
    state["probes_pending"] = sent


def probe_due(cfg: Dict[str, Any], state: Dict[str, Any], metrics: Optional[Dict[str, Any]], now: float) -> bool:
    """Send the idle probe this tick? (called after /health answered 200, before decide)."""
    if is_busy(metrics):
        return False  # it would queue behind the load; busy_stall_s watches a busy engine
    if state.get("phase") in ("starting", "suspect", "backoff") or state.get("probe_failed"):
        return True  # a start must answer one; a failed probe is confirmed (or cleared) at once
    last = state.get("last_probe_at")
    if last is not None and now - last < cfg["probe_idle_s"]:
        return False
    if not metrics:
        return True  # no counters to read: the completion is the only evidence, once per probe_idle_s
    since = state.get("idle_since")
    return since is not None and now - since >= cfg["probe_idle_s"]
