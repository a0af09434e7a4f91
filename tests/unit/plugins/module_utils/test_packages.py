"""module_utils/system/packages.py: which of node_prep's packages dpkg's status marks installed
(node_facts reads it so that the apt task runs only where one is missing)."""

from __future__ import annotations

from ansible_collections.uma.vllm.plugins.module_utils.system import packages

STATUS = """Package: python3-psutil
Status: install ok installed
Priority: optional
Architecture: amd64
Version: 5.9.4-1+b1

Package: nftables
Status: deinstall ok config-files
Architecture: amd64

Package: iperf3
Status: hold ok installed
Architecture: amd64

Package: half-done
Status: install ok unpacked
Architecture: amd64
"""


def test_installed_only_what_dpkg_marks_installed():
    assert packages.installed(STATUS) == {"python3-psutil", "iperf3"}


def test_missing_keeps_order_and_names_removed_and_half_installed_packages():
    assert packages.missing(["nftables", "python3-psutil", "half-done", "iperf3", "qperf"], STATUS) == [
        "nftables",
        "half-done",
        "qperf",
    ]


def test_what_dpkg_cannot_decide_is_left_to_the_package_manager():
    # a version, an architecture, a wildcard, a release: apt decides (reported missing)
    asks = ["python3-psutil=5.9.4-1+b1", "python3-psutil:amd64", "python3-psu*", "python3-psutil/bookworm"]
    assert packages.missing(asks, STATUS) == asks


def test_no_status_file_is_none_not_empty():
    assert packages.missing(["python3-psutil"], None) is None
    assert packages.missing([], STATUS) == []


def test_bad_names_are_refused_naming_the_option_and_the_fix():
    import pytest

    from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError

    for value, where in (("python3-psutil", "packages"), (["ok", "bad name"], "packages[1]"), ([""], "packages[0]")):
        with pytest.raises(UmaError) as err:
            packages.check_names("packages", value)
        assert err.value.message.startswith("option '%s' = " % where) and "python3-psutil" in err.value.message
