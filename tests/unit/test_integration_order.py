# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The integration files handed to the workers first (tests/integration/conftest.py ``LONGEST``)
exist, each once, and tests/all.sh keeps that order (``--no-loadscope-reorder``): a renamed file
would silently drop back into xdist's own order, the long quick-start test last."""

from __future__ import annotations

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _longest():
    path = ROOT / "tests" / "integration" / "conftest.py"
    spec = importlib.util.spec_from_file_location("integration_conftest", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_listed_file_exists_once():
    names = _longest().LONGEST
    assert names and len(names) == len(set(names))
    missing = [n for n in names if not (ROOT / "tests" / "integration" / n).is_file()]
    assert not missing, "tests/integration/conftest.py LONGEST names files that are not there: %s" % missing


def test_the_order_puts_the_listed_files_first_and_keeps_each_files_own_order():
    module = _longest()

    class Item:
        def __init__(self, name, test):
            self.path = pathlib.Path("/x") / name
            self.test = test

    first, second = module.LONGEST[0], module.LONGEST[1]
    items = [Item("test_a.py", 1), Item(second, 1), Item("test_a.py", 2), Item(first, 1), Item(second, 2)]
    module.pytest_collection_modifyitems(None, None, items)
    assert [(i.path.name, i.test) for i in items] == [
        (first, 1), (second, 1), (second, 2), ("test_a.py", 1), ("test_a.py", 2)
    ]  # fmt: skip


def test_all_sh_keeps_the_order():
    text = (ROOT / "tests" / "all.sh").read_text()
    assert "--dist loadfile --no-loadscope-reorder" in text
