"""Prints the bad-input harness's counts per module at the end of the run."""

from __future__ import annotations

import harness_core


def pytest_terminal_summary(terminalreporter):
    if not harness_core.COUNTS:
        return
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
    for name in sorted(harness_core.COUNTS):
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
