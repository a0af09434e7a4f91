# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One regression case per defect listed in issue 10 (each failed before its fix)."""

from __future__ import annotations

import json
import os
import sys

import harness_core as h
import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.base import blockdev as _blockdev
from ansible_collections.uma.vllm.plugins.module_utils.node.base import common as _common
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError, require_int, systemd_quote
from ansible_collections.uma.vllm.plugins.module_utils.plan import planner as plan_mod
from ansible_collections.uma.vllm.plugins.module_utils.system import sysctl as _sysctl
from ansible_collections.uma.vllm.plugins.modules import node_facts, oom_diagnose, uma_sysctl, vllm_flags

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_harness_modules import Diagnose, Flags, Sysctl


def run(module, args, root, check_mode=False):
    with h.patched():
        with h.patch_module_args(dict(args, _ansible_check_mode=check_mode, _ansible_remote_tmp=str(root))):
            try:
                module.main()
            except h._Exit as done:
                json.dumps(done.result, allow_nan=False, default=str)
                return done.failed, done.result
    raise AssertionError("no exit_json/fail_json")


@pytest.fixture
def sysctl_node(tmp_path):
    args = Sysctl().build(str(tmp_path))
    return args, tmp_path


# ---- uma_sysctl -------------------------------------------------------------------------


@pytest.mark.parametrize("ram", [0.5, 0.1, "0.59"])
def test_sysctl_tiny_ram_is_refused_not_negative(sysctl_node, ram):
    args, root = sysctl_node
    failed, result = run(uma_sysctl, dict(args, ram_gib=ram), root)
    assert failed and result["option"] == "ram_gib", result
    assert not os.path.exists(args["path"])


@pytest.mark.parametrize("value", [0, "0"])
def test_sysctl_vfs_cache_pressure_zero_refused(sysctl_node, value):
    args, root = sysctl_node
    failed, result = run(uma_sysctl, dict(args, vfs_cache_pressure=value), root)
    assert failed and "vfs_cache_pressure" in result["msg"] and "is 0" in result["msg"]


def test_sysctl_extra_huge_value_refused(sysctl_node):
    args, root = sysctl_node
    failed, result = run(uma_sysctl, dict(args, extra={"vm.swappiness": 10**40}), root)
    assert failed and result["option"] == "extra" and "larger than any kernel setting" in result["msg"]


def test_sysctl_parent_is_a_file(sysctl_node):
    args, root = sysctl_node
    (root / "plainfile").write_text("x")
    failed, result = run(uma_sysctl, dict(args, path=str(root / "plainfile" / "90-vllm.conf")), root)
    assert failed and result["option"] == "path" and "parent that is not a directory" in result["msg"]


def test_sysctl_state_dir_is_a_file(sysctl_node):
    args, root = sysctl_node
    (root / "statefile").write_text("x")
    failed, result = run(uma_sysctl, dict(args, state_dir=str(root / "statefile")), root)
    assert failed and result["option"] == "state_dir"


def test_sysctl_conf_symlink_to_directory_and_non_utf8_files_are_not_tracebacks(sysctl_node):
    args, root = sysctl_node
    etc = root / "etc" / "sysctl.d"
    (root / "somedir").mkdir()
    os.symlink(str(root / "somedir"), str(etc / "95-dir.conf"))
    (etc / "96-bytes.conf").write_bytes(b"vm.dirty_ratio = \xff\xfe\n")
    (root / "proc" / "meminfo").write_bytes(b"MemTotal:       126877696 kB\n\xff\xfe junk\n")
    failed, result = run(uma_sysctl, args, root)
    assert not failed, result
    assert any(c["path"].endswith("96-bytes.conf") for c in result["conflicts"])


def test_sysctl_live_apply_is_all_or_nothing(sysctl_node, monkeypatch):
    """The kernel refuses vm.min_free_kbytes after two keys were set: everything goes back."""
    args, root = sysctl_node
    real = _sysctl.write_live

    def kernel(proc_root, key, value):
        if key == "vm.min_free_kbytes" and value != "45056":
            raise UmaError(key, value, "was refused: could not be written (Invalid argument)", "x")
        real(proc_root, key, value)

    monkeypatch.setattr(_sysctl, "write_live", kernel)
    before = h.snapshot(str(root))
    failed, result = run(uma_sysctl, args, root)
    assert failed, result
    assert "kernel refused vm.min_free_kbytes" in result["msg"] and "Nothing was changed" in result["msg"]
    assert h.snapshot(str(root)) == before  # live values, the drop-in and the record as they were


# ---- _common.require_int ------------------------------------------------------------------


@pytest.mark.parametrize(
    "option", ["read_ahead_kb", "duration", "threshold_mib", "min_available_mib", "until_pid", "lines"]
)
@pytest.mark.parametrize("value", ["\u00b2", "--5", "\u0663", "1\u00b2", "- 5"])
def test_require_int_refuses_unicode_digits_and_double_minus(option, value):
    with pytest.raises(UmaError) as err:
        require_int(option, value)
    assert err.value.option == option


def test_require_int_still_takes_plain_numbers():
    assert require_int("x", " -5 ") == -5 and require_int("x", "12") == 12 and require_int("x", 3.0) == 3


# ---- vllm_flags ---------------------------------------------------------------------------


@pytest.fixture
def flags_base(tmp_path):
    target = Flags()
    return target.build(str(tmp_path)), tmp_path


@pytest.mark.parametrize("option", ["total_memory_gib", "reserve_gib", "activation_reserve_gib"])
def test_flags_huge_floats_refused(flags_base, option):
    args, root = flags_base
    failed, result = run(vllm_flags, dict(args, **{option: 1e308}), root)
    assert failed and option in result["msg"], result


@pytest.mark.parametrize(
    "key,value", [("sliding_window_pattern", "2"), ("max_window_layers", "x"), ("architectures", 3)]
)
def test_flags_string_numbers_in_model_config_refused(flags_base, key, value):
    args, root = flags_base
    config = dict(args["model_config"], **{key: value})
    failed, result = run(vllm_flags, dict(args, model_config=config), root)
    assert failed and "model_config" in result["msg"] and key in result["msg"], result


@pytest.mark.parametrize(
    "extra",
    [
        ["--max_model_len=131072"],
        ["--max_model_len", "131072"],
        ["--max-model-len=131072"],
        ["--kv_cache_memory_bytes=1"],
        ["--gpu_memory_utilization", "0.9"],
        ["-tp=2"],
        ["--max-model=4096"],
        ["--model", "other"],
        ["--dtype=float16"],
    ],
)
def test_flags_planned_flag_never_overridden_by_extra_args(flags_base, extra):
    args, root = flags_base
    failed, result = run(vllm_flags, dict(args, extra_args=extra), root)
    assert failed and "extra_args" in result["msg"] and "planner computes" in result["msg"], result


@pytest.mark.parametrize(
    "kw,option",
    [
        (dict(master_port=-1), "master_port"),
        (dict(master_port=70000), "master_port"),
        (dict(data_parallel_rpc_port=65536, data_parallel_size=2), "data_parallel_rpc_port"),
        (dict(data_parallel_start_rank=2, data_parallel_size=2), "data_parallel_start_rank"),
        (dict(data_parallel_size_local=3, data_parallel_size=2), "data_parallel_size_local"),
        (dict(master_addr="10.0.0.1 evil", nnodes=2), "master_addr"),
        (dict(data_parallel_address="a\tb", data_parallel_size=2), "data_parallel_address"),
        (dict(reserve_gib=True), "reserve_gib"),
        (dict(total_memory_gib="nan"), "total_memory_gib"),
        (dict(max_model_len="\u0663"), "max_model_len"),
    ],
)
def test_flags_nonsense_refused(flags_base, kw, option):
    args, root = flags_base
    failed, result = run(vllm_flags, dict(args, **kw), root)
    assert failed and option in result["msg"], result


def test_flags_kv_heads_must_divide_heads(flags_base):
    args, root = flags_base
    config = dict(args["model_config"], num_key_value_heads=3)
    failed, result = run(vllm_flags, dict(args, model_config=config), root)
    assert failed and "num_key_value_heads does not divide" in result["msg"]


def test_flags_canonical_flag():
    assert plan_mod.canonical_flag("--max_model_len=1") == "--max-model-len"
    assert plan_mod.canonical_flag("-tp") == "--tensor-parallel-size"


# ---- readahead_window and every file type written on the node ---------------------------


def test_boot_unit_quotes_every_execstart_word():
    unit = _blockdev.render_boot_unit("/usr/bin/python3", "/usr/local/lib/uma-vllm", "/var/lib/uma-vllm", "/x y")
    exec_line = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert exec_line == [
        "ExecStart=/usr/bin/python3 /usr/local/lib/uma-vllm/uma_readahead.py restore --all --state-dir "
        '/var/lib/uma-vllm --sysfs-root "/x y"'
    ]


@pytest.mark.parametrize(
    "raw,quoted",
    [
        ("/sys", "/sys"),
        ("a\nExecStartPre=/bin/false", '"a\\nExecStartPre=/bin/false"'),
        ("%h", '"%%h"'),
        ("$HOME", '"$$HOME"'),
        ('a"b', '"a\\"b"'),
        ("back\\slash", '"back\\\\slash"'),
        ("tab\there", '"tab\\x09here"'),
    ],
)
def test_systemd_quote(raw, quoted):
    assert systemd_quote(raw) == quoted
    assert "\n" not in systemd_quote(raw)


def test_readahead_sysfs_root_with_newline_refused(tmp_path):
    from test_harness_modules import Readahead

    target = Readahead()
    args = target.build(str(tmp_path))
    evil = args["sysfs_root"] + "\nExecStartPre=/bin/false"
    os.makedirs(os.path.dirname(evil))
    os.symlink(args["sysfs_root"], evil)  # the path exists: only validation stops it
    args["sysfs_root"] = evil
    with h.patched(target.runner(), target.extra_patches()):
        with h.patch_module_args(dict(args, _ansible_remote_tmp=str(tmp_path))):
            with pytest.raises(h._Exit) as done:
                from ansible_collections.uma.vllm.plugins.modules import readahead_window

                readahead_window.main()
    assert done.value.failed and "sysfs_root" in done.value.result["msg"]
    assert not (tmp_path / "systemd" / "uma-readahead-restore.service").exists()


def test_env_file_escaping_matches_systemd_rules():
    """engine.env.j2 escapes \\, " and newlines inside double quotes (systemd.exec EnvironmentFile=)."""
    import jinja2

    template = open(os.path.join(HERE, "..", "..", "..", "roles", "vllm_service", "templates", "engine.env.j2")).read()
    env = jinja2.Environment()
    env.filters["comment"] = lambda text: "# " + text
    env.filters["uma.vllm.vllm_service_secrets"] = None
    body = template.split("\n", 2)[2]  # the loop only
    body = body.replace(
        "vllm_service_engines | uma.vllm.vllm_service_secrets(item.name, inventory_hostname)", "secrets"
    )
    rendered = env.from_string(body).render(secrets={"HF_TOKEN": 'a"b\\c\nExecStartPre=/bin/false'}, item={})
    assert rendered.strip() == 'HF_TOKEN="a\\"b\\\\c\\nExecStartPre=/bin/false"'
    assert len(rendered.strip().splitlines()) == 1


def test_json_files_are_json_dumps():
    """Engine configs and records are json.dumps output: any value round-trips and stays one document."""
    value = {"x": 'a"\n\x00\u2028'}
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "uma-issue10-json-%d.json" % os.getpid())
    try:
        _common.atomic_write_json(path, value)
        assert json.loads(open(path).read()) == value
    finally:
        os.unlink(path)


# ---- oom_diagnose -------------------------------------------------------------------------


@pytest.fixture
def diag(tmp_path):
    return Diagnose().build(str(tmp_path)), tmp_path


def _stamp(root):
    return root / "state" / "launches" / "e1" / "20260101T000000Z"


@pytest.mark.parametrize("kind", ["list", "dir", "binary"])
def test_diagnose_bad_launch_record_is_evidence(diag, kind):
    args, root = diag
    path = _stamp(root) / "launch.json"
    path.unlink()
    if kind == "list":
        path.write_text("[1, 2]")
    elif kind == "dir":
        path.mkdir()
    else:
        path.write_bytes(b"\xff\xfe\x00\x81")
    failed, result = run(oom_diagnose, args, root)
    assert not failed, result


def test_diagnose_binary_logs_and_infinite_sample(diag):
    args, root = diag
    (root / "dmesg.txt").write_bytes(bytes(range(256)))
    (root / "journal" / "e1.log").write_bytes(b"\xff\xfe\x80 garbage\n")
    (_stamp(root) / "samples.jsonl").write_text('{"t": 1e999}\n{"t": 1, "Cached": 1e999}\n{"t": 2, "Cached": 5}\n')
    failed, result = run(oom_diagnose, args, root)
    assert not failed, result


@pytest.mark.parametrize(
    "kw,option",
    [
        (dict(kernel_commands=[[]], kernel_log_file=None), "kernel_commands"),
        (dict(journal_command=[], journal_dir=None), "journal_command"),
        (dict(engines=["e" * 300]), "engines"),
        (dict(sysctl_keys=["x./etc/hostname"]), "sysctl_keys"),
        (dict(sysctl_keys=["vm.min_free_kbytes/../../meminfo"]), "sysctl_keys"),
        (dict(report_host="../../etc"), "report_host"),
        (dict(timeline_name="../{host}.svg"), "timeline_name"),
        (dict(timeline_name="a/b.svg"), "timeline_name"),
    ],
)
def test_diagnose_refusals(diag, kw, option):
    args, root = diag
    args = {k: v for k, v in dict(args, **kw).items() if v is not None}
    failed, result = run(oom_diagnose, args, root)
    assert failed and option in result["msg"], result


# ---- node_facts ---------------------------------------------------------------------------


@pytest.mark.parametrize("option", ["nvidia_smi", "lscpu"])
def test_node_facts_missing_absolute_tool_is_not_a_failure(tmp_path, option):
    failed, result = run(
        node_facts, {option: str(tmp_path / "no" / "such-tool"), "sysfs_root": str(tmp_path)}, tmp_path
    )
    assert not failed, result
    if option == "nvidia_smi":
        assert "not installed" in " ".join(result["ansible_facts"]["uma_node"]["evidence"])


# ---- least privilege: the root guard's samples file ---------------------------------------


def test_guard_samples_file_never_follows_a_symlink(tmp_path):
    from ansible_collections.uma.vllm.plugins.module_utils.node.guard import status as _guard_status

    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    own = tmp_path / "own"
    own.mkdir(mode=0o755)
    os.symlink(str(victim), str(own / "samples.jsonl"))
    with pytest.raises(OSError):
        _guard_status.open_samples(str(own / "samples.jsonl"))
    assert victim.read_text() == "precious\n"


def test_guard_samples_file_refused_in_a_shared_directory(tmp_path):
    from ansible_collections.uma.vllm.plugins.module_utils.node.guard import status as _guard_status

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    with pytest.raises(PermissionError) as err:
        _guard_status.open_samples(str(shared / "samples.jsonl"))
    assert "writable by nobody else" in str(err.value)
    own = tmp_path / "own"
    own.mkdir(mode=0o755)
    handle = _guard_status.open_samples(str(own / "samples.jsonl"))
    handle.write("{}\n")
    handle.close()
    assert (own / "samples.jsonl").read_text() == "{}\n"
