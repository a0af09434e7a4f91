# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A real Prometheus server for the lab (tests only, not shipped).

Runs the host's Prometheus (Debian's package, ``/usr/bin/prometheus``) in a
temporary directory with a scrape config for the lab nodes' node-exporters
(the textfile metrics the collection writes) and the engines' ``/metrics``,
and with the collection's own alert rules
(``roles/monitoring/files/prometheus/uma-vllm-rules.yml``, unchanged). Only
the scrape and evaluation intervals are short (1 s by default) so a lab run
sees a fault firing within seconds; ``for:`` clauses and rate windows stay as
shipped.

As a library (Molecule verifiers, integration tests)::

    from lab_prometheus import LabPrometheus
    with LabPrometheus(nodes={"ai1": "172.17.0.2:9100"}, engines={"ai1": "172.17.0.2:8000"}) as prom:
        prom.wait_targets_up(60)
        prom.wait_alert("UmaVllmWatchdogGaveUp", {"engine": "never"}, timeout=60)
        prom.query('uma_vllm_watchdog_gave_up')

From a shell (prints JSON; ``serve`` runs until interrupted)::

    python3 tests/lab_prometheus.py serve --node ai1=172.17.0.2:9100 --engine ai1=172.17.0.2:8000
    python3 tests/lab_prometheus.py targets --url http://127.0.0.1:PORT
    python3 tests/lab_prometheus.py alerts --url http://127.0.0.1:PORT
    python3 tests/lab_prometheus.py query --url http://127.0.0.1:PORT 'up'

Every HTTP call has a timeout; every wait has a deadline and fails naming what
it waited for and what it saw last.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Dict, List, Optional

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
RULES = os.path.join(REPO, "roles", "monitoring", "files", "prometheus", "uma-vllm-rules.yml")
PROMETHEUS = os.environ.get("UMA_PROMETHEUS", "/usr/bin/prometheus")


class LabPrometheusError(AssertionError):
    """A wait ran out or the server did not come up (an AssertionError: tests report it as a failure)."""


def docker_ip(container: str) -> str:
    """The container's address on its Docker network (the host reaches it directly)."""
    out = subprocess.run(
        ["docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}", container],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    addrs = out.stdout.split()
    if out.returncode != 0 or not addrs:
        raise LabPrometheusError("no address for container %s: %s" % (container, out.stderr.strip() or out.stdout))
    return addrs[0]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape_config(
    nodes: Dict[str, str],
    engines: Dict[str, str],
    rule_files: List[str],
    scrape_interval: str = "1s",
    evaluation_interval: str = "1s",
) -> Dict[str, Any]:
    """The prometheus.yml as a dict (JSON is YAML): job ``node`` for node-exporters, ``vllm`` for engines.

    ``instance`` is relabelled to the node's name (ai1:9100), as the rules and the dashboard expect
    ``instance`` to start with the host name."""

    def job(name: str, targets: Dict[str, str], port_of: Callable[[str], str]) -> Dict[str, Any]:
        return {
            "job_name": name,
            "scrape_timeout": scrape_interval,
            "static_configs": [
                {"targets": [addr], "labels": {"instance": "%s:%s" % (host, port_of(addr))}}
                for host, addr in sorted(targets.items())
            ],
        }

    def port(addr: str) -> str:
        return addr.rsplit(":", 1)[1]

    jobs = []
    if nodes:
        jobs.append(job("node", nodes, port))
    if engines:
        jobs.append(job("vllm", engines, port))
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval},
        "rule_files": rule_files,
        "scrape_configs": jobs,
    }


class LabPrometheus:
    """One Prometheus server on 127.0.0.1 with its own temp dir; ``stop()`` removes both."""

    def __init__(
        self,
        nodes: Optional[Dict[str, str]] = None,
        engines: Optional[Dict[str, str]] = None,
        rules: Optional[List[str]] = None,
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
        port: int = 0,
        workdir: Optional[str] = None,
    ) -> None:
        self.nodes = dict(nodes or {})
        self.engines = dict(engines or {})
        self.rules = list(rules if rules is not None else [RULES])
        self.scrape_interval = scrape_interval
        self.evaluation_interval = evaluation_interval
        self.port = port or _free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self._own_dir = workdir is None
        self.dir = workdir or ""  # made by start()
        self.proc: Optional[subprocess.Popen] = None

    # ---- life cycle
    def write_config(self) -> str:
        os.makedirs(os.path.join(self.dir, "rules"), exist_ok=True)
        copies = []
        for path in self.rules:
            dest = os.path.join(self.dir, "rules", os.path.basename(path))
            shutil.copyfile(path, dest)
            copies.append(dest)
        cfg = scrape_config(self.nodes, self.engines, copies, self.scrape_interval, self.evaluation_interval)
        path = os.path.join(self.dir, "prometheus.yml")
        with open(path + ".tmp", "w", encoding="utf-8") as handle:
            json.dump(cfg, handle, indent=2)
        os.replace(path + ".tmp", path)
        check = subprocess.run(
            [os.path.join(os.path.dirname(PROMETHEUS), "promtool"), "check", "config", path],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if check.returncode != 0:
            raise LabPrometheusError("promtool check config %s failed:\n%s%s" % (path, check.stdout, check.stderr))
        return path

    @property
    def log_path(self) -> str:
        return os.path.join(self.dir, "prometheus.log")

    def start(self, timeout: float = 60.0) -> LabPrometheus:
        if not os.path.exists(PROMETHEUS):
            raise LabPrometheusError("%s is missing: apt-get install prometheus (Debian's package)" % PROMETHEUS)
        if not self.dir:
            self.dir = tempfile.mkdtemp(prefix="uma-lab-prometheus-")
        config = self.write_config()
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [
                PROMETHEUS,
                "--config.file=%s" % config,
                "--storage.tsdb.path=%s" % os.path.join(self.dir, "data"),
                "--web.listen-address=127.0.0.1:%d" % self.port,
                "--web.enable-lifecycle",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise LabPrometheusError("prometheus exited %s:\n%s" % (self.proc.returncode, self.log_tail()))
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        self.stop()
        raise LabPrometheusError("prometheus not ready within %ss:\n%s" % (timeout, self.log_tail()))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
        if self._own_dir and self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = ""

    def __enter__(self) -> LabPrometheus:
        return self.start()

    def __exit__(self, *_exc: Any) -> None:
        self.stop()

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as handle:
                return "".join(handle.readlines()[-lines:])
        except OSError:
            return ""

    # ---- the HTTP API
    def api(self, path: str, params: Optional[Dict[str, str]] = None) -> Any:
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.loads(resp.read().decode())
        if body.get("status") != "success":
            raise LabPrometheusError("%s: %s" % (url, body))
        return body["data"]

    def targets(self) -> List[Dict[str, Any]]:
        return list(self.api("/api/v1/targets", {"state": "active"})["activeTargets"])

    def alerts(self) -> List[Dict[str, Any]]:
        return list(self.api("/api/v1/alerts")["alerts"])

    def query(self, expr: str) -> List[Dict[str, Any]]:
        return list(self.api("/api/v1/query", {"query": expr})["result"])

    def rule_evaluations(self) -> Dict[str, str]:
        """Alert name -> its rule's lastEvaluation (RFC 3339), from /api/v1/rules."""
        out = {}
        for group in self.api("/api/v1/rules", {"type": "alert"})["groups"]:
            for rule in group["rules"]:
                out[rule["name"]] = rule.get("lastEvaluation", "")
        return out

    # ---- waits
    def _wait(self, what: str, probe: Callable[[], Any], timeout: float, seen: Callable[[], Any]) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            try:
                got = probe()
            except (urllib.error.URLError, OSError, ValueError) as err:
                got = None
                last_err = err
            else:
                last_err = None
            if got:
                return got
            if time.monotonic() >= deadline:
                try:
                    last = seen()
                except Exception as err:  # only for the message
                    last = "unreadable: %s" % err
                raise LabPrometheusError(
                    "%s: not within %ss (last error %s); last seen: %s" % (what, timeout, last_err, last)
                )
            time.sleep(0.5)

    def wait_targets_up(self, timeout: float = 60.0) -> List[Dict[str, Any]]:
        want = len(self.nodes) + len(self.engines)

        def probe() -> Any:
            targets = self.targets()
            return targets if len(targets) == want and all(t["health"] == "up" for t in targets) else None

        def seen() -> Any:
            return [(t["labels"].get("instance"), t["health"], t.get("lastError")) for t in self.targets()]

        return self._wait("all %d targets up" % want, probe, timeout, seen)

    def firing(self, name: str, labels: Optional[Dict[str, str]] = None, state: str = "firing") -> List[Dict]:
        return [
            a
            for a in self.alerts()
            if a["labels"].get("alertname") == name
            and a["state"] == state
            and all(a["labels"].get(k) == v for k, v in (labels or {}).items())
        ]

    def wait_alert(
        self, name: str, labels: Optional[Dict[str, str]] = None, timeout: float = 60.0, state: str = "firing"
    ) -> Dict[str, Any]:
        def seen() -> Any:
            return [(a["labels"], a["state"]) for a in self.alerts()]

        found = self._wait(
            "alert %s %s %s" % (name, labels or {}, state), lambda: self.firing(name, labels, state), timeout, seen
        )
        return dict(found[0])

    def wait_query(self, expr: str, timeout: float = 60.0) -> List[Dict[str, Any]]:
        """Wait until ``expr`` returns at least one sample (use a comparison: ``x == 1``)."""
        return self._wait("query %s" % expr, lambda: self.query(expr), timeout, lambda: self.query(expr))

    def wait_evaluated_after(self, moment: float, timeout: float = 30.0) -> None:
        """Wait until every alert rule was evaluated after ``moment`` (Unix time)."""

        def probe() -> bool:
            evals = self.rule_evaluations()
            return bool(evals) and all(rfc3339_to_unix(v) > moment for v in evals.values())

        self._wait("every alert rule evaluated after %.3f" % moment, probe, timeout, self.rule_evaluations)


def rfc3339_to_unix(text: str) -> float:
    """Prometheus' lastEvaluation (nanosecond RFC 3339) -> Unix time; 0 when unparsable."""
    import datetime

    if not text:
        return 0.0
    head, _dot, frac = text.partition(".")
    tz = "+00:00"
    if frac:
        digits = "".join(ch for ch in frac if ch.isdigit())
        rest = frac[len(digits) :]
        tz = "+00:00" if rest in ("Z", "") else rest
        frac_s = float("0." + digits) if digits else 0.0
    else:
        if head.endswith("Z"):
            head = head[:-1]
        frac_s = 0.0
    try:
        base = datetime.datetime.fromisoformat(head + tz)
    except ValueError:
        return 0.0
    return base.timestamp() + frac_s


def _pairs(values: List[str], option: str) -> Dict[str, str]:
    out = {}
    for value in values:
        name, sep, addr = value.partition("=")
        if not sep or ":" not in addr:
            raise SystemExit("%s %r: give NAME=HOST:PORT, e.g. ai1=172.17.0.2:9100" % (option, value))
        out[name] = addr
    return out


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description="A real Prometheus for the uma.vllm lab (tests only).")
    sub = p.add_subparsers(dest="cmd", required=True)
    serve = sub.add_parser("serve", help="run Prometheus until interrupted")
    serve.add_argument("--node", action="append", default=[], help="NAME=HOST:PORT of a node-exporter")
    serve.add_argument("--engine", action="append", default=[], help="NAME=HOST:PORT of a vLLM engine (/metrics)")
    serve.add_argument("--port", type=int, default=0)
    serve.add_argument("--interval", default="1s", help="scrape and evaluation interval")
    for name in ("targets", "alerts", "query"):
        cmd = sub.add_parser(name)
        cmd.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:9090")
        if name == "query":
            cmd.add_argument("expr")
    args = p.parse_args(argv)
    if args.cmd == "serve":
        prom = LabPrometheus(
            _pairs(args.node, "--node"),
            _pairs(args.engine, "--engine"),
            port=args.port,
            scrape_interval=args.interval,
            evaluation_interval=args.interval,
        )
        prom.start()
        print(json.dumps({"url": prom.url, "dir": prom.dir}), flush=True)
        stop = []
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_a: stop.append(1))
        try:
            while not stop and prom.proc is not None and prom.proc.poll() is None:
                time.sleep(0.5)
        finally:
            prom.stop()
        return 0
    client = LabPrometheus()
    client.url = args.url
    data = {"targets": client.targets, "alerts": client.alerts}.get(args.cmd)
    print(json.dumps(data() if data else client.query(args.expr), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
