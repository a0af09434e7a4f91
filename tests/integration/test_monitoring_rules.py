# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The monitoring role's Prometheus rules, their promtool unit tests, the textfile format and the
Grafana dashboard, checked with the real tools and schemas.

promtool comes from Debian's ``prometheus`` package (tests/setup.sh installs it). Without it these
tests skip, unless UMA_REQUIRE_TOOLS=1 (CI) makes a missing promtool a failure. The dashboard is
validated with the Grafana dashboard / panel / Prometheus-query JSON schemas that Grafana publishes
in grafana/grafana-foundation-sdk (generated from Grafana's own schema definitions), vendored
under fixtures/grafana.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess

import jsonschema
import pytest
import yaml

from ansible_collections.uma.vllm.plugins.module_utils.node.base import common as _common
from ansible_collections.uma.vllm.plugins.module_utils.node.base import metrics as m
from ansible_collections.uma.vllm.plugins.module_utils.node.watchdog import program as uma_watchdog

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ROLE_FILES = os.path.join(ROOT, "roles", "monitoring", "files")
RULES = os.path.join(ROLE_FILES, "prometheus", "uma-vllm-rules.yml")
RULE_TESTS = os.path.join(ROLE_FILES, "prometheus", "uma-vllm-rules.test.yml")
DASHBOARD = os.path.join(ROLE_FILES, "grafana", "uma-vllm-dashboard.json")
SCHEMAS = os.path.join(os.path.dirname(__file__), "fixtures", "grafana")


@pytest.fixture(scope="module")
def promtool():
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("UMA_REQUIRE_TOOLS") == "1":
            pytest.fail("promtool is not installed (apt-get install --no-install-recommends prometheus)")
        pytest.skip("promtool is not installed")
    return path


def run(argv, **kwargs):
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, **kwargs)


def load_yaml(path):
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def alerts():
    return [r["alert"] for g in load_yaml(RULES)["groups"] for r in g["rules"] if "alert" in r]


def test_promtool_check_rules(promtool):
    result = run([promtool, "check", "rules", RULES])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: %d rules found" % (len(alerts()) + 1) in result.stdout


def test_promtool_unit_tests_pass(promtool):
    result = run([promtool, "test", "rules", os.path.basename(RULE_TESTS)], cwd=os.path.dirname(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_catch_a_wrong_threshold(promtool, tmp_path):
    """The unit tests are not vacuous: a rule file with a moved threshold fails them."""
    text = open(RULES, encoding="utf-8").read()
    assert "> 0.90 and" in text
    (tmp_path / "uma-vllm-rules.yml").write_text(text.replace("> 0.90 and", "> 0.96 and"))
    shutil.copy(RULE_TESTS, str(tmp_path))
    result = run([promtool, "test", "rules", os.path.basename(RULE_TESTS)], cwd=str(tmp_path))
    assert result.returncode != 0 and "VllmKvCacheUsageHigh" in result.stdout + result.stderr


@pytest.mark.parametrize(
    "alert, old, new",
    [
        ("UmaVllmWatchdogGaveUp", "uma_vllm_watchdog_gave_up == 1", "uma_vllm_watchdog_gave_up == 2"),
        ("UmaVllmWatchdogWedgeDetected", "wedges_total[10m]) > 0", "wedges_total[10m]) > 1"),
        ("UmaVllmWatchdogWedgeDetected", "wedges_total[10m]) > 0", "wedges_total[20m]) > 0"),
        ("UmaVllmWatchdogPeerRankDown", "peer_ok == 0\n        for: 2m", "peer_ok == 0\n        for: 0m"),
        ("UmaVllmWatchdogPeerRankDown", "peer_ok == 0\n        for: 2m", "peer_ok == 0\n        for: 5m"),
        ("UmaVllmWatchdogRestartsInWindow", "restarts_in_window >= 2", "restarts_in_window >= 1"),
        ("UmaVllmWatchdogRestartsInWindow", "restarts_in_window >= 2", "restarts_in_window >= 3"),
        ("UmaVllmWatchdogMemoryFloorWarning", '{level="warn"}[15m]) >= 3', '{level="warn"}[15m]) >= 1'),
        ("UmaVllmWatchdogMemoryFloorWarning", '{level="warn"}[15m]) >= 3', '{level="warn"}[15m]) >= 4'),
        ("UmaVllmWatchdogMemoryFloorCritical", '{level="critical"}[30m]) > 0', '{level=~".+"}[30m]) > 0'),
        ("UmaVllmWatchdogStale", "watchdog_timestamp_seconds > 300", "watchdog_timestamp_seconds > 200"),
        ("UmaVllmWatchdogStale", "watchdog_timestamp_seconds > 300", "watchdog_timestamp_seconds > 600"),
    ],
)
def test_watchdog_rule_tests_catch_a_moved_threshold(promtool, tmp_path, alert, old, new):
    """Each watchdog alert's tests fail when its threshold, window or `for:` moves either way."""
    text = open(RULES, encoding="utf-8").read()
    assert text.count(old) == 1, old
    (tmp_path / "uma-vllm-rules.yml").write_text(text.replace(old, new))
    shutil.copy(RULE_TESTS, str(tmp_path))
    result = run([promtool, "test", "rules", os.path.basename(RULE_TESTS)], cwd=str(tmp_path))
    out = result.stdout + result.stderr
    assert result.returncode != 0 and "alertname: %s," % alert in out, out


def test_every_alert_is_tested_firing_and_both_kv_metric_names_are_used():
    tests = load_yaml(RULE_TESTS)["tests"]
    fired = {t["alertname"] for group in tests for t in group.get("alert_rule_test", []) if t["exp_alerts"]}
    assert set(alerts()) <= fired, set(alerts()) - fired
    series = " ".join(s["series"] for group in tests for s in group["input_series"])
    assert "vllm:kv_cache_usage_perc{" in series and "vllm:gpu_cache_usage_perc{" in series


def test_every_watchdog_alert_is_also_tested_quiet():
    tests = load_yaml(RULE_TESTS)["tests"]
    quiet = {t["alertname"] for group in tests for t in group.get("alert_rule_test", []) if not t["exp_alerts"]}
    watchdog = {a for a in alerts() if a.startswith("UmaVllmWatchdog")}
    assert len(watchdog) == 7, watchdog
    assert watchdog <= quiet, watchdog - quiet


def test_rules_and_dashboard_only_use_metrics_the_textfiles_write():
    """The textfile collector's catalog (_metrics.METRICS) and the watchdog's (uma_watchdog.METRICS)."""
    text = open(RULES, encoding="utf-8").read() + open(DASHBOARD, encoding="utf-8").read()
    used = set(re.findall(r"\buma_vllm_[a-z_]*[a-z]\b", text))  # not the uma_vllm_watchdog_<engine>.prom file name
    known = set(m.METRICS) | set(uma_watchdog.METRICS)
    assert used, "no uma_vllm_ metric used"
    assert used <= known, used - known
    watchdog_used = {name for name in used if name.startswith("uma_vllm_watchdog_")}
    assert watchdog_used == set(uma_watchdog.METRICS), set(uma_watchdog.METRICS) - watchdog_used


def _node_tree(tmp_path):
    state = tmp_path / "state" / "launches" / "qwen" / "20261122T010000Z"
    state.mkdir(parents=True)
    (state / "launch.json").write_text(
        json.dumps(
            {
                "engine": "qwen",
                "started_at": "2026-11-22T01:00:00Z",
                "healthy_at": "2026-11-22T01:01:30Z",
                "kv_alloc_t": 61.5,
                "page_cache_peak_mib": 1024,
                "guard_status": {"state": "stopped", "evictions": 4, "evicted_bytes": 1 << 20, "peak_cache_mib": 1024},
            }
        )
    )
    os.symlink(state.name, str(state.parent / "latest"))
    proc = tmp_path / "proc"
    (proc / "sys" / "vm").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal: 1000 kB\nMemAvailable: 500 kB\nCached: 300 kB\nMapped: 100 kB\n")
    (proc / "sys" / "vm" / "min_free_kbytes").write_text("67584\n")
    body = "vm.min_free_kbytes = 65536\n"
    (tmp_path / "90-vllm.conf").write_text(_common.managed_header("test", body) + body)
    return m.collect(str(tmp_path / "state"), str(tmp_path / "run"), str(tmp_path / "90-vllm.conf"), str(proc))


def test_textfile_passes_promtool_check_metrics(promtool, tmp_path):
    text = m.render(_node_tree(tmp_path))
    assert "uma_vllm_sysctl_drift" in text and "uma_vllm_guard_evictions_total" in text
    result = run([promtool, "check", "metrics"], input=text)
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), (
        result.stdout + result.stderr
    )


def _schema(name, definition=None):
    with open(os.path.join(SCHEMAS, "%s.jsonschema.json" % name), encoding="utf-8") as handle:
        schema = json.load(handle)
    if definition:
        schema = dict(schema, **{"$ref": "#/definitions/%s" % definition})
    return jsonschema.Draft7Validator(schema)


def dashboard_errors(dash):
    errors = ["dashboard %s: %s" % (list(e.absolute_path), e.message) for e in _schema("dashboard").iter_errors(dash)]
    query = _schema("prometheus")
    for panel in dash.get("panels", []):
        where = "panel %s (%s)" % (panel.get("id"), panel.get("title"))
        kind = panel.get("type")
        if kind == "row":  # a row holds no query; the dashboard schema's RowPanel checks it
            continue
        if kind not in ("timeseries", "stat", "gauge"):
            errors.append("%s: panel type %r has no schema here" % (where, kind))
            continue
        errors += [
            "%s options: %s" % (where, e.message)
            for e in _schema(kind, "Options").iter_errors(panel.get("options", {}))
        ]
        if kind == "timeseries":
            custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom", {})
            errors += ["%s custom: %s" % (where, e.message) for e in _schema(kind, "FieldConfig").iter_errors(custom)]
        for target in panel.get("targets", []):
            errors += ["%s target %s: %s" % (where, target.get("refId"), e.message) for e in query.iter_errors(target)]
    return errors


def test_dashboard_validates_against_grafanas_schemas():
    with open(DASHBOARD, encoding="utf-8") as handle:
        dash = json.load(handle)
    assert dashboard_errors(dash) == []
    titles = " ".join(p["title"] for p in dash["panels"]).lower()
    for needed in (
        "kv cache",
        "running / waiting",
        "tokens / s",
        "p99",
        "node memory",
        "watchdog phase",
        "watchdog probe latency",
        "wedges, restarts, floor events",
        "peer ranks down",
        "heartbeat age",
    ):
        assert needed in titles, needed


@pytest.mark.parametrize(
    "breakage",
    [
        lambda d: d.pop("schemaVersion"),
        lambda d: d["panels"][0]["gridPos"].pop("h"),
        lambda d: d["panels"][4]["options"]["legend"].update(displayMode="sideways"),
        lambda d: d["panels"][0]["options"].pop("reduceOptions"),
        lambda d: d["panels"][5]["targets"][0].pop("expr"),
        lambda d: d["templating"]["list"][1].update(type="dropdown"),
        lambda d: next(p for p in d["panels"] if p["type"] == "row").pop("collapsed"),
        lambda d: next(p for p in d["panels"] if p["title"] == "Watchdog phase")["options"].update(textMode="phase"),
    ],
)
def test_schema_validation_rejects_a_broken_dashboard(breakage):
    with open(DASHBOARD, encoding="utf-8") as handle:
        dash = json.load(handle)
    broken = copy.deepcopy(dash)
    breakage(broken)
    assert dashboard_errors(broken)


def test_every_dashboard_query_is_valid_promql(promtool, tmp_path):
    with open(DASHBOARD, encoding="utf-8") as handle:
        dash = json.load(handle)
    rules = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", "5m").replace("$host", "spark1")
            rules.append({"record": "dashboard:panel%d:%s" % (panel["id"], target["refId"].lower()), "expr": expr})
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = run([promtool, "check", "rules", str(path)])
    assert result.returncode == 0, result.stdout + result.stderr
