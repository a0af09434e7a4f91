# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The checks the three node-side validators share (node/base/checks.py)."""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.base import checks as c
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError


@pytest.mark.parametrize(
    "value, problem",
    [
        (True, "is a boolean"),
        (False, "is a boolean"),
        ("5", "is a string"),
        (None, "is not a number"),
        ([1], "is not a number"),
        (float("nan"), "is not a finite number"),
        (float("inf"), "is not a finite number"),
        (1e308, "is out of range (must be > 0 and <= 60)"),
        (0, "is out of range"),
        (-1, "is out of range"),
        (10**40, "is out of range"),
    ],
)
def test_number_refuses(value, problem):
    with pytest.raises(UmaError) as err:
        c.number("opt", value, 0, 60, "Give e.g. 5.", above=True)
    assert err.value.option == "opt" and problem in err.value.message and err.value.message.endswith("Give e.g. 5.")


def test_number_takes_and_bounds():
    assert c.number("o", 60, 0, 60, "") == 60
    assert c.number("o", 0, 0, 60, "") == 0
    assert c.number("o", 8.0, 0, 60, "", integer=True) == 8
    with pytest.raises(UmaError, match="is not a whole number"):
        c.number("o", 8.5, 0, 60, "", integer=True)


@pytest.mark.parametrize("text, expected", [("0.5", 0.5), (" 7 ", 7.0), ("1e1", 10.0)])
def test_number_from_command_line_text(text, expected):
    assert c.number("o", text, 0, 60, "", strings=True) == expected


@pytest.mark.parametrize("text", ["nan", "inf", "1e400", "\uff11", "x", "", "0x10"])
def test_number_from_command_line_text_refused(text):
    with pytest.raises(UmaError):
        c.number("o", text, 0, 60, "", strings=True)


@pytest.mark.parametrize("value", ["false", "true", 0, 1, None, "", []])
def test_boolean_is_a_json_boolean(value):
    with pytest.raises(UmaError, match="is not a boolean"):
        c.boolean("flag", value)


@pytest.mark.parametrize("value", ["", "rel/x", "/a\x00b", "/a\nb", "/a\rb", 5, None, []])
def test_path_refuses(value):
    with pytest.raises(UmaError):
        c.path("p", value, "Give /x.")


def test_path_optional_and_relative():
    assert c.path("p", None, "", optional=True) is None
    assert c.path("p", "rel/x", "", absolute=False) == "rel/x"


@pytest.mark.parametrize("value", ["", "a\nb", "x\x00", 5, None])
def test_text_refuses(value):
    with pytest.raises(UmaError):
        c.text("t", value, "fix")


@pytest.mark.parametrize("value", ["ftp://x", "http://", "http://a b", "http://a\tb", 5, None])
def test_url_refuses(value):
    with pytest.raises(UmaError):
        c.url("u", value, "fix")


def test_known_keys_names_the_unknown_one():
    with pytest.raises(UmaError) as err:
        c.known_keys({"a": 1, "typo": 2}, ["a", "_comment"], "a test")
    assert err.value.option == "typo" and "is not a test option" in err.value.message
    assert "_comment" not in err.value.message


@pytest.mark.parametrize(
    "make, problem",
    [
        (lambda p: None, "cannot be read (No such file or directory)"),
        (lambda p: open(p, "w").close(), "is empty"),
        (os.mkdir, "is a directory"),
        (os.mkfifo, "is not a regular file"),
        (lambda p: (os.symlink(p + ".b", p), os.symlink(p, p + ".b")), "Too many levels of symbolic links"),
        (lambda p: open(p, "wb").write(b'{"a": "\xff"}'), "is not UTF-8"),
        (lambda p: open(p, "w").write('{"a": NaN}'), "NaN is not a JSON number"),
        (lambda p: open(p, "w").write("[1]"), "is not a JSON object (it holds a list)"),
        (lambda p: open(p, "w").write("{" + " " * (c.MAX_CONFIG_BYTES + 1) + "}"), "is larger than"),
        (lambda p: open(p, "w").write('{"a": ' + "[" * 100000 + "]" * 100000 + "}"), "nested too deep"),
        (lambda p: open(p, "w").write('{"a": 1'), "is not valid JSON"),
    ],
)
def test_read_config_refuses_naming_the_file(tmp_path, make, problem):
    path = str(tmp_path / "c.json")
    make(path)
    with pytest.raises(UmaError) as err:
        c.read_config(path, "--config", "Fix it.")
    assert err.value.option == "--config" and err.value.value == path and problem in err.value.message


def test_read_config_follows_a_link_to_a_good_file(tmp_path):
    real = tmp_path / "real.json"
    real.write_text(json.dumps({"a": 1}))
    os.symlink(real, tmp_path / "link.json")
    assert c.read_config(str(tmp_path / "link.json"), "--config", "") == {"a": 1}
