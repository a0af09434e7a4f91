# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The diagnosis split by step (issue 13): the old names still import, the files stay readable.

``_diagnose`` was one 1,600-line file; it is now parse / watchdog / facts / rules / render
(+ ``_diagnose_node`` for the module). Importers keep using ``_diagnose.<name>``; these
tests fail when a name disappears from there, when one of the files grows past the
project's size limits again, or when a node program starts importing the diagnosis
(it is module logic: nothing ships it to the nodes).
"""

from __future__ import annotations

import ast
import os

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.diagnose import core as _diagnose
from ansible_collections.uma.vllm.plugins.module_utils.diagnose import facts as _diagnose_facts
from ansible_collections.uma.vllm.plugins.module_utils.diagnose import parse as _diagnose_parse
from ansible_collections.uma.vllm.plugins.module_utils.diagnose import render as _diagnose_render
from ansible_collections.uma.vllm.plugins.module_utils.diagnose import rules as _diagnose_rules
from ansible_collections.uma.vllm.plugins.module_utils.diagnose import watchdog as _diagnose_watchdog

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", "..", ".."))

# Every public name diagnose/core.py had before the split (taken from the 1,600-line file).
OLD_PUBLIC_NAMES = (
    "CLASSES DEFAULTS DEFAULT_MODE GIB GUARD_MODE MIB RULES TITLES WATCHDOG_ACTIONS WATCHDOG_LISTED"
    " align_samples classify diagnose flags_from_argv fmt_bytes gather_facts launch_epoch line_time"
    " parse_journal parse_kernel_log parse_metrics parse_samples parse_time record_time render_markdown"
    " rule_admission_refused rule_fragmentation rule_page_cache_starvation rule_prefix_cache_pressure"
    " rule_profiling_race rule_runtime_burst rule_startup_oom settings_in_force size_to_bytes"
    " summarize_watchdog watchdog_lines"
).split()

FILES = [
    "plugins/module_utils/diagnose/core.py",
    "plugins/module_utils/diagnose/parse.py",
    "plugins/module_utils/diagnose/watchdog.py",
    "plugins/module_utils/diagnose/facts.py",
    "plugins/module_utils/diagnose/rules.py",
    "plugins/module_utils/diagnose/render.py",
    "plugins/module_utils/diagnose/node.py",
    "plugins/module_utils/diagnose/timeline.py",
    "plugins/modules/oom_diagnose.py",
]


def test_every_old_name_still_imports_from_diagnose():
    missing = [name for name in OLD_PUBLIC_NAMES if not hasattr(_diagnose, name)]
    assert not missing
    assert sorted(_diagnose.__all__) == sorted(OLD_PUBLIC_NAMES)


@pytest.mark.parametrize(
    "name, home",
    [
        ("parse_journal", _diagnose_parse),
        ("summarize_watchdog", _diagnose_watchdog),
        ("gather_facts", _diagnose_facts),
        ("RULES", _diagnose_rules),
        ("classify", _diagnose_rules),
        ("render_markdown", _diagnose_render),
        ("watchdog_lines", _diagnose_render),
    ],
)
def test_the_names_are_the_objects_of_their_new_home(name, home):
    assert getattr(_diagnose, name) is getattr(home, name)


def test_the_rule_table_names_every_class_but_none_in_report_order():
    assert [class_id for class_id, _rule in _diagnose.RULES] + ["none"] == list(_diagnose.CLASSES)


@pytest.mark.parametrize("path", FILES)
def test_files_and_functions_stay_short(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as handle:
        text = handle.read()
    assert len(text.splitlines()) <= 700, "%s has %d lines" % (path, len(text.splitlines()))
    long = [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(ast.parse(text))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 80
    ]
    assert not long, "%s: functions over 80 lines: %s" % (path, long)


def test_no_node_program_imports_the_diagnosis():
    """The diagnosis runs inside the module (AnsiballZ ships it); nothing of the node package (what
    the roles install on the nodes) imports it."""
    from ansible_collections.uma.vllm.plugins.module_utils.plumbing import node_install

    for mod in node_install.NODE_MODULES:
        name = mod.__file__
        with open(name, encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        # "from ...module_utils import _diagnose" names the module as an imported name
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert not any("diagnose" in m or "timeline" in m for m in imported), name
