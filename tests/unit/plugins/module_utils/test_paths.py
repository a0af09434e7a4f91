"""The collection's paths and names agree everywhere with plugins/module_utils/node/base/paths.py (issue 13).

Python imports the constants; role YAML cannot, so this test reads the roles' defaults,
argument_specs, vars, tasks and templates and names the file and the value that disagree.
"""

from __future__ import annotations

import ast
import glob
import os
import re

import pytest
import yaml

from ansible_collections.uma.vllm.plugins.module_utils.node.base import blockdev as _blockdev
from ansible_collections.uma.vllm.plugins.module_utils.node.base import paths as _paths
from ansible_collections.uma.vllm.plugins.module_utils.node.base import systemd as _systemd
from ansible_collections.uma.vllm.plugins.module_utils.system import readahead as _readahead

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", "..", ".."))

# role variable -> the value its default must have
ROLE_DEFAULTS = {
    "launch_wrapper": {
        "launch_wrapper_lib_dir": _paths.LIB_DIR,
        "launch_wrapper_config_dir": _paths.CONFIG_DIR,
        "launch_wrapper_state_dir": _paths.STATE_DIR,
        "launch_wrapper_python": _paths.PYTHON,
    },
    "monitoring": {
        "monitoring_state_dir": _paths.STATE_DIR,
        "monitoring_lib_dir": _paths.LIB_DIR + "/monitoring",
    },
    "node_prep": {"node_prep_state_dir": _paths.STATE_DIR},
    "vllm_service": {
        "vllm_service_config_dir": _paths.CONFIG_DIR,
        "vllm_service_state_dir": _paths.STATE_DIR,
        "vllm_service_python": _paths.PYTHON,
    },
}
# A uma-vllm directory spelled anywhere (also misspelt: uma_vllm, umavllm).
DIR_RE = re.compile(r"/(?:var/lib|usr/local/lib|etc|run)/uma[-_]?vllm\b")
DIR_CONSTANTS = (_paths.STATE_DIR, _paths.LIB_DIR, _paths.CONFIG_DIR, _paths.RUN_DIR)
# An engine-name check in a role: '^[A-Za-z0-9][...]{0,N}$'
NAME_PATTERN_RE = re.compile(r"\^\[A-Za-z0-9\]\[[^\]]*\]\{0,\d+\}\$")
# Node programs allowed to spell a path (none: every node program ships with node/base/paths.py).
PYTHON_LITERAL_ALLOWED: set = set()


def load(path):
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def role_files():
    patterns = (
        "defaults/*.yml",
        "meta/argument_specs.yml",
        "vars/*.yml",
        "tasks/*.yml",
        "templates/*",
        "handlers/*.yml",
    )
    for role in sorted(os.listdir(os.path.join(ROOT, "roles"))):
        for pattern in patterns:
            yield from sorted(glob.glob(os.path.join(ROOT, "roles", role, pattern)))


@pytest.mark.parametrize("role", sorted(ROLE_DEFAULTS))
def test_role_defaults_and_argument_specs_agree_with_the_constants(role):
    defaults_file = os.path.join(ROOT, "roles", role, "defaults", "main.yml")
    specs_file = os.path.join(ROOT, "roles", role, "meta", "argument_specs.yml")
    defaults = load(defaults_file)
    options = load(specs_file)["argument_specs"]["main"]["options"]
    wrong = []
    for var, want in ROLE_DEFAULTS[role].items():
        if str(defaults.get(var)) != want:
            wrong.append(
                "%s: %s = %r, _paths says %r" % (os.path.relpath(defaults_file, ROOT), var, defaults.get(var), want)
            )
        spec_default = options.get(var, {}).get("default")
        if str(spec_default) != want:
            wrong.append(
                "%s: %s default %r, _paths says %r" % (os.path.relpath(specs_file, ROOT), var, spec_default, want)
            )
    assert not wrong, "\n".join(wrong)


def test_the_default_image_is_the_pinned_vllm_release():
    """vllm_service_vllm_version is unset (read from the image or venv, issue 19 item 4); the
    default image's tag is the pinned release."""
    role = os.path.join(ROOT, "roles", "vllm_service")
    defaults = load(os.path.join(role, "defaults", "main.yml"))
    options = load(os.path.join(role, "meta", "argument_specs.yml"))["argument_specs"]["main"]["options"]
    assert defaults["vllm_service_vllm_version"] is None and "default" not in options["vllm_service_vllm_version"]
    assert "default('%s', true)" % _paths.VLLM_VERSION in defaults["vllm_service_image"]
    assert options["vllm_service_image"]["default"] == "vllm/vllm-openai:v" + _paths.VLLM_VERSION


def test_every_uma_vllm_directory_in_the_roles_is_one_of_the_constants():
    wrong = []
    for path in role_files():
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                for match in DIR_RE.finditer(line):
                    if match.group(0) not in DIR_CONSTANTS:
                        wrong.append("%s:%d: %s" % (os.path.relpath(path, ROOT), number, match.group(0)))
    assert not wrong, "not one of %s:\n%s" % (DIR_CONSTANTS, "\n".join(wrong))


def test_the_engine_name_checks_of_the_roles_are_the_constant():
    found, wrong = 0, []
    for path in role_files():
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                for match in NAME_PATTERN_RE.finditer(line):
                    found += 1
                    if match.group(0) != _paths.ENGINE_NAME_PATTERN:
                        wrong.append("%s:%d: %s" % (os.path.relpath(path, ROOT), number, match.group(0)))
    assert found >= 1, "the roles' engine-name check was not found (vllm_service absent.yml)"
    assert not wrong, "engine-name pattern is not %s:\n%s" % (_paths.ENGINE_NAME_PATTERN, "\n".join(wrong))


def test_the_lab_image_builds_the_pinned_vllm():
    with open(os.path.join(ROOT, "lab", "build-image.sh"), encoding="utf-8") as handle:
        pinned = re.search(r"UMA_LAB_VLLM_VERSION:-([0-9.]+)\}", handle.read())
    assert pinned and pinned.group(1) == _paths.VLLM_VERSION, "lab/build-image.sh pins %s, _paths says %s" % (
        pinned and pinned.group(1),
        _paths.VLLM_VERSION,
    )


def _literals(path):
    """String constants of a Python file outside docstrings and DOCUMENTATION/EXAMPLES/RETURN."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                skip.add(id(body[0].value))
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id in ("DOCUMENTATION", "EXAMPLES", "RETURN") for t in node.targets
        ):
            skip.add(id(node.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            yield node.lineno, node.value


def test_python_code_imports_the_paths_instead_of_spelling_them():
    values = set(DIR_CONSTANTS) | {_paths.PYTHON, _paths.ENGINE_NAME_PATTERN}
    wrong = []
    for path in sorted(glob.glob(os.path.join(ROOT, "plugins", "**", "*.py"), recursive=True)):
        name = os.path.basename(path)
        if path.endswith(os.path.join("node", "base", "paths.py")) or name in PYTHON_LITERAL_ALLOWED:
            continue
        for line, value in _literals(path):
            if value in values:
                wrong.append("%s:%d: %r" % (os.path.relpath(path, ROOT), line, value))
    assert not wrong, "use plugins/module_utils/node/base/paths.py:\n" + "\n".join(wrong)


def test_module_defaults_are_the_constants():
    assert _readahead.WindowRequest().state_dir == _paths.STATE_DIR
    assert _readahead.WindowRequest().lib_dir == _paths.LIB_DIR
    assert _readahead.WindowRequest().python == _paths.PYTHON
    assert _systemd.NAME_RE.pattern == _paths.ENGINE_NAME_PATTERN


def test_launch_wrapper_keeps_what_the_readahead_boot_unit_runs():
    """state=absent keeps readahead_window's restorer: the same files, the same unit path."""
    variables = load(os.path.join(ROOT, "roles", "launch_wrapper", "vars", "main.yml"))
    kept = variables["__launch_wrapper_readahead_programs"]
    assert kept == ["uma_vllm_node", "uma_readahead.py"]  # the package and the restorer's entry script
    assert set(kept) <= set(variables["__launch_wrapper_programs"])
    assert variables["__launch_wrapper_readahead_boot_unit"] == os.path.join(
        _readahead.WindowRequest().systemd_dir, _blockdev.BOOT_UNIT
    )
    unit = _blockdev.render_boot_unit(_paths.PYTHON, _paths.LIB_DIR, _paths.STATE_DIR)
    # the role looks for this string in the unit to know the unit needs its lib dir
    assert _paths.LIB_DIR + "/uma_readahead.py" in unit


def test_launch_wrapper_absent_removes_files_not_the_shared_directory():
    tasks = load(os.path.join(ROOT, "roles", "launch_wrapper", "tasks", "main.yml"))
    absent = next(t for t in tasks if t.get("when") == "launch_wrapper_state == 'absent'")
    assert absent["ansible.builtin.include_tasks"] == "absent.yml"
    removals = [
        t
        for t in load(os.path.join(ROOT, "roles", "launch_wrapper", "tasks", "absent.yml"))
        if "ansible.builtin.file" in t
    ]
    unconditional = [t for t in removals if "when" not in t]
    text = yaml.safe_dump(unconditional)
    assert 'launch_wrapper_lib_dir }}"' not in text and "- '{{ launch_wrapper_lib_dir }}'" not in text
    for task in unconditional:
        loop = task.get("loop")
        assert not (isinstance(loop, list) and "{{ launch_wrapper_lib_dir }}" in loop), task["name"]
    guarded = [t for t in removals if t.get("when") == "__launch_wrapper_lib_left.matched == 0"]
    assert len(guarded) == 1 and guarded[0]["ansible.builtin.file"]["path"] == "{{ launch_wrapper_lib_dir }}"
