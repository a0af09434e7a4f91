"""Prints the bad-input harness's counts per module at the end of the run."""

from __future__ import annotations

import harness_core


def pytest_terminal_summary(terminalreporter):
    modules = sorted(name for name in harness_core.COUNTS if not name.startswith("node:"))
    if modules:
        _modules(terminalreporter, modules)
    _nodes(terminalreporter)
    if harness_core.COUNTS:
        where = harness_core.SCRATCH or "the system's temp directory"
        terminalreporter.write_line("the harness's cases were made under %s (%s)" % (where, harness_core.SCRATCH_WHY))


def _modules(terminalreporter, modules):
    terminalreporter.section("bad-input harness (fixed seed)")
    header = "%-22s %6s %6s %8s %10s %8s %8s %9s %5s" % (
        "target",
        "cases",
        "ok",
        "refused",
        "traceback",
        "partial",
        "unclear",
        "nonsense",
        "core",
    )
    terminalreporter.write_line(header)
    for name in modules:
        c = harness_core.COUNTS[name]
        terminalreporter.write_line(
            "%-22s %6d %6d %8d %10d %8d %8d %9d %5d"
            % (
                name,
                c["cases"],
                c["ok"],
                c["refused"],
                c["traceback"],
                c["partial"],
                c["unclear"],
                c["nonsense"],
                c["core"],
            )
        )


def _nodes(terminalreporter):
    nodes = sorted(name for name in harness_core.COUNTS if name.startswith("node:"))
    if nodes:
        terminalreporter.section("node-side bad-input harness (real programs, fixed seed)")
        keys = ("cases", "refused", "ok", "traceback", "hang", "silent", "unclear", "false_refusal")
        terminalreporter.write_line(
            "%-22s %6s %13s %6s %10s %5s %7s %7s %14s" % ("program", *keys[:1], "config-error", *keys[2:])
        )
        for name in nodes:
            c = harness_core.COUNTS[name]
            terminalreporter.write_line(
                "%-22s %6d %13d %6d %10d %5d %7d %7d %14d" % (name[len("node:") :], *(c[k] for k in keys))
            )
