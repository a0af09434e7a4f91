"""The node-side programs ship with every file they import.

On the node the programs run from one directory with the node's python3 and no Ansible, so
each import falls back to a plain sibling module (``from _common import ...``). A sibling
missing from the list a role copies, or from the modules a module installs through
_nodefiles, is an ImportError on the node that no controller-side test would see.
"""

from __future__ import annotations

import ast
import os

import yaml

from ansible_collections.uma.vllm.plugins.module_utils import _guard_service, _node_programs

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", "..", ".."))
MODULE_UTILS = os.path.join(ROOT, "plugins", "module_utils")


def sibling_imports(name: str) -> set:
    """Module names (files in module_utils) that ``name`` imports in its node-side fallback."""
    with open(os.path.join(MODULE_UTILS, name), encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for module in names:
            if os.path.exists(os.path.join(MODULE_UTILS, module + ".py")):
                found.add(module + ".py")
    return found


def closure(start: str) -> set:
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(sibling_imports(name) - seen)
    return seen


def role_programs(role: str, var: str) -> set:
    with open(os.path.join(ROOT, "roles", role, "vars", "main.yml"), encoding="utf-8") as handle:
        return set(yaml.safe_load(handle)[var])


def role_program_list(role: str, var: str):
    """The role's list as written (None where the role has none)."""
    with open(os.path.join(ROOT, "roles", role, "vars", "main.yml"), encoding="utf-8") as handle:
        return yaml.safe_load(handle).get(var)


def test_the_closure_finds_the_guards_parts():
    assert {"uma_guard.py", "_common.py", "_guard_config.py", "_guard_sweeper.py", "_guard_residency.py"} <= closure(
        "uma_guard.py"
    )


NODE_PROGRAM_CLOSURE = closure("uma_launch.py") | closure("uma_guard.py") | closure("uma_watchdog.py")


def test_node_programs_is_the_import_closure_of_the_three_programs():
    """uma.vllm.node_files (programs: true) installs exactly this set: nothing missing, nothing extra."""
    names = _node_programs.program_names()
    assert len(names) == len(set(names))
    assert set(names) == NODE_PROGRAM_CLOSURE, "plugins/module_utils/_node_programs.py NODE_PROGRAMS: %s" % sorted(
        set(names) ^ NODE_PROGRAM_CLOSURE
    )


def differ(written, where):
    """Why a hand-written program list is not NODE_PROGRAMS (in its order), or '' when it is."""
    names = _node_programs.program_names()
    if written == names:
        return ""
    return "%s is not NODE_PROGRAMS (plugins/module_utils/_node_programs.py): missing %s, extra %s%s" % (
        where,
        sorted(set(names) - set(written)),
        sorted(set(written) - set(names)),
        ", or in another order: write it as %s" % names if set(written) == set(names) else "",
    )


def test_differ_names_what_is_missing_extra_or_out_of_order():
    names = _node_programs.program_names()
    assert differ(list(names), "x") == ""
    assert "missing ['uma_watchdog.py'], extra []" in differ([n for n in names if n != "uma_watchdog.py"], "x")
    assert "extra ['_readahead.py']" in differ([*names, "_readahead.py"], "x")
    assert "in another order" in differ(list(reversed(names)), "x")


def test_the_launch_wrapper_roles_list_is_node_programs():
    """node_files installs NODE_PROGRAMS; state=absent removes __launch_wrapper_programs: the same, in order."""
    programs = role_program_list("launch_wrapper", "__launch_wrapper_programs")
    assert programs is not None, "roles/launch_wrapper/vars/main.yml has no __launch_wrapper_programs"
    assert not differ(programs, "roles/launch_wrapper/vars/main.yml __launch_wrapper_programs")


def test_drop_cache_loop_installs_everything_the_guard_imports():
    installed = {module.__name__.rpartition(".")[2] + ".py" for module in _guard_service.NODE_PROGRAM}
    assert closure("uma_guard.py") == installed


def test_monitoring_ships_everything_its_collector_imports():
    programs = role_programs("monitoring", "__monitoring_programs")
    for program in programs:
        missing = closure(program) - programs
        assert not missing, "roles/monitoring/vars/main.yml __monitoring_programs lacks %s" % sorted(missing)


def test_the_alerts_scenario_installs_node_programs():
    """molecule/monitoring_alerts copies the programs by hand (not through the role): NODE_PROGRAMS, in order."""
    with open(os.path.join(ROOT, "molecule", "monitoring_alerts", "prepare.yml"), encoding="utf-8") as handle:
        plays = yaml.safe_load(handle)
    lists = [
        task["loop"]
        for play in plays
        for task in play.get("tasks", [])
        if "uma_watchdog.py" in (task.get("loop") or [])
    ]
    assert len(lists) == 1, "the task that installs uma_watchdog.py was not found"
    assert not differ(lists[0], "molecule/monitoring_alerts/prepare.yml's install loop")


def test_readahead_window_installs_everything_its_restorer_imports():
    from ansible_collections.uma.vllm.plugins.module_utils import _readahead

    installed = {module.__name__.rpartition(".")[2] + ".py" for module in _readahead.NODE_FILES}
    assert closure("_blockdev.py") == installed
