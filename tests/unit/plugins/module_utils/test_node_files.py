"""plugins/module_utils/plumbing/node_files.py: plan -> diff -> execute -> result on temporary directories.

The owner and group of every entry are the user running the tests (root in CI, anyone else
on a laptop), so the tests act on real files without privileges; a chown to another user is
checked as root, and as anyone else its refusal is.
"""

from __future__ import annotations

import grp
import hashlib
import json
import os
import pwd
import stat
import subprocess
import sys

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.plumbing import node_files as nf
from ansible_collections.uma.vllm.plugins.module_utils.plumbing.node_install import package_dirs, program_names

USER = pwd.getpwuid(os.getuid()).pw_name
GROUP = grp.getgrgid(os.getgid()).gr_name
SECRET = "HF_TOKEN=hf_s3cr3t-do-not-show-0123456789\n"
ME = (USER, GROUP)


def entry(path, **kw):
    return dict({"path": str(path), "owner": USER, "group": GROUP}, **kw)


def request(tmp_path, **kw):
    """A typical set: two directories, a file and a secret file under them."""
    etc = tmp_path / "etc"
    req = {
        "directories": [entry(etc), entry(etc / "engines", mode="0750")],
        "files": [entry(etc / "engines" / "a.json", content='{"a": 1}\n')],
        "secret_files": [entry(etc / "engines" / "a.env", content=SECRET)],
    }
    req.update(kw)
    return req


def run(req, check=False, **kw):
    """The flow as the module runs it: plan, diff, execute unless check mode, result."""
    p = nf.plan(req, **kw)
    diff = nf.diff(p)
    if p.changed and not check:
        nf.execute(p)
    return nf.result(p), diff


def refusal(req, **kw):
    with pytest.raises(UmaError) as err:
        nf.plan(req, **kw)
    return err.value


def tree(root):
    """Every path under root with its type, mode, owner and content (to prove nothing changed)."""
    found = {}
    for base, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(base, name)
            info = os.lstat(path)
            content = open(path, "rb").read() if stat.S_ISREG(info.st_mode) else None
            found[path] = (stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode), info.st_uid, content)
    return found


def test_first_run_creates_everything_and_the_second_changes_nothing(tmp_path):
    req = request(tmp_path)
    first, _diff = run(req)
    etc = tmp_path / "etc"
    paths = [str(etc), str(etc / "engines"), str(etc / "engines" / "a.env"), str(etc / "engines" / "a.json")]
    assert first["changed"] is True
    assert first["changed_paths"] == sorted(paths)
    assert first["directories"] == {
        str(etc): {"changed": True, "created": True},
        str(etc / "engines"): {"changed": True, "created": True},
    }
    assert (etc / "engines" / "a.json").read_text() == '{"a": 1}\n'
    assert (etc / "engines" / "a.env").read_text() == SECRET
    assert stat.S_IMODE(os.stat(etc / "engines").st_mode) == 0o750
    assert stat.S_IMODE(os.stat(etc / "engines" / "a.env").st_mode) == 0o600  # the secret files' default
    assert stat.S_IMODE(os.stat(etc / "engines" / "a.json").st_mode) == 0o644
    second, diff = run(req)
    assert second["changed"] is False and second["changed_paths"] == [] and diff == []
    assert all(not v["changed"] and not v["created"] for v in list(second["files"].values()))
    assert second["files"] == {k: dict(v, changed=False, created=False) for k, v in first["files"].items()}


def test_the_checksum_is_the_sha1_ansible_stat_gives(tmp_path):
    result, _diff = run(request(tmp_path))
    for path, found in result["files"].items():
        assert found["checksum"] == hashlib.sha1(open(path, "rb").read()).hexdigest()
    out = subprocess.run(
        ["sha1sum", str(tmp_path / "etc" / "engines" / "a.json")], capture_output=True, text=True, check=True
    )
    assert result["files"][str(tmp_path / "etc" / "engines" / "a.json")]["checksum"] == out.stdout.split()[0]


def test_check_mode_writes_nothing_and_predicts_the_run(tmp_path):
    req = request(tmp_path)
    (tmp_path / "keep").write_text("x")
    before = tree(tmp_path)
    predicted, diff = run(req, check=True)
    assert tree(tmp_path) == before
    done = run(req)[0]
    assert predicted == done  # check mode says exactly what the run then does
    assert [d["before_header"] for d in diff][:2] == [str(tmp_path / "etc"), str(tmp_path / "etc" / "engines")]


def test_a_content_change_is_rewritten_atomically_and_shown_as_text(tmp_path):
    req = request(tmp_path)
    run(req)
    target = tmp_path / "etc" / "engines" / "a.json"
    inode = os.stat(target).st_ino
    req["files"][0]["content"] = '{"a": 2}\n'
    result, diff = run(req)
    assert result["changed_paths"] == [str(target)]
    assert result["files"][str(target)] == {
        "checksum": hashlib.sha1(b'{"a": 2}\n').hexdigest(), "changed": True, "created": False,
    }  # fmt: skip
    assert diff == [{"before_header": str(target), "after_header": str(target),
                     "before": '{"a": 1}\n', "after": '{"a": 2}\n'}]  # fmt: skip
    assert os.stat(target).st_ino != inode  # a new file renamed over the old one
    assert sorted(os.listdir(target.parent)) == ["a.env", "a.json"]  # no temporary file left


def test_only_the_mode_differs_it_is_corrected_in_place(tmp_path):
    req = request(tmp_path)
    run(req)
    target = tmp_path / "etc" / "engines" / "a.json"
    os.chmod(target, 0o600)
    os.chmod(tmp_path / "etc", 0o700)
    inode = os.stat(target).st_ino
    result, diff = run(req)
    assert result["changed_paths"] == sorted([str(tmp_path / "etc"), str(target)])
    assert os.stat(target).st_ino == inode and stat.S_IMODE(os.stat(target).st_mode) == 0o644
    assert stat.S_IMODE(os.stat(tmp_path / "etc").st_mode) == 0o755
    assert result["directories"][str(tmp_path / "etc")] == {"changed": True, "created": False}
    assert {d["before_header"]: (d["before"], d["after"]) for d in diff} == {
        "%s (type, mode, owner:group)" % (tmp_path / "etc"): (
            "directory 0700 %s:%s\n" % ME, "directory 0755 %s:%s\n" % ME),
        "%s (type, mode, owner:group)" % target: ("file 0600 %s:%s\n" % ME, "file 0644 %s:%s\n" % ME),
    }  # fmt: skip
    assert run(req)[0]["changed"] is False


def test_a_wrong_owner_is_corrected_or_refused_without_root(tmp_path):
    req = request(tmp_path)
    run(req)
    other = pwd.getpwnam("nobody")
    req["files"][0]["owner"] = "nobody"
    target = tmp_path / "etc" / "engines" / "a.json"
    if os.geteuid() == 0:
        result, diff = run(req)
        assert os.stat(target).st_uid == other.pw_uid and result["changed_paths"] == [str(target)]
        assert diff[0]["after"] == "file 0644 nobody:%s\n" % GROUP
        assert run(req)[0]["changed"] is False
    else:
        with pytest.raises(UmaError) as err:
            run(req)
        assert "files[0].path" in err.value.message and "become: true" in err.value.message


def test_a_permission_error_names_the_entry_and_says_what_was_done(tmp_path, monkeypatch):
    """Fault injection (as root a chown cannot fail here): the error of a non-root run."""
    req = request(tmp_path)
    run(req)
    req["files"][0]["mode"] = "0640"
    req["secret_files"][0]["mode"] = "0640"

    def refuse(path, *_a, **_kw):
        if str(path).endswith(".env"):
            raise PermissionError(1, "Operation not permitted", str(path))
        return real(path, *_a, **_kw)

    real = os.chmod
    monkeypatch.setattr(nf.os, "chmod", refuse)
    p = nf.plan(req)
    with pytest.raises(UmaError) as err:
        nf.execute(p)
    message = err.value.message
    assert message.startswith("option 'secret_files[0].path' = '%s'" % (tmp_path / "etc" / "engines" / "a.env"))
    assert "Operation not permitted" in message and "become: true" in message
    assert "already done: %s" % (tmp_path / "etc" / "engines" / "a.json") in message
    assert nf.failed_result(p) == {"changed": True, "changed_paths": [str(tmp_path / "etc" / "engines" / "a.json")]}
    assert "s3cr3t" not in message


def test_a_failing_write_leaves_the_old_file_and_no_temporary_file(tmp_path, monkeypatch):
    """Fault injection: the disk fills up at the fsync (root writes into a read-only directory)."""
    req = request(tmp_path)
    run(req)
    req["secret_files"][0]["content"] = SECRET + "MORE=1\n"

    def full(_fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(nf.os, "fsync", full)
    with pytest.raises(UmaError) as err:
        run(req)
    target = tmp_path / "etc" / "engines" / "a.env"
    assert "No space left on device" in err.value.message and "stays as it was" in err.value.message
    assert "s3cr3t" not in err.value.message
    assert target.read_text() == SECRET
    assert sorted(os.listdir(target.parent)) == ["a.env", "a.json"]


def test_a_secret_is_never_in_the_result_the_diff_or_an_error(tmp_path):
    req = request(tmp_path)
    created, diff1 = run(req)
    req["secret_files"][0]["content"] = SECRET.replace("0123", "9999")  # same length
    changed, diff2 = run(req)
    os.chmod(tmp_path / "etc" / "engines" / "a.env", 0o640)
    attrs, diff3 = run(req)
    everything = json.dumps([created, diff1, changed, diff2, attrs, diff3])
    assert "s3cr3t" not in everything and "HF_TOKEN" not in everything
    target = str(tmp_path / "etc" / "engines" / "a.env")
    assert changed["changed_paths"] == [target]
    shown = [d for d in diff2 if d["before_header"] == target]
    assert shown == [{"before_header": target, "after_header": target,
                      "before": "(secret content before, 42 bytes)\n",
                      "after": "(secret content after, 42 bytes)\n"}]  # fmt: skip
    assert [d["before"] for d in diff3] == ["file 0640 %s:%s\n" % ME]
    bad = request(tmp_path, secret_files=[entry(tmp_path / "etc" / "x.env", content=SECRET, bogus=SECRET)])
    assert "s3cr3t" not in refusal(bad).message
    bad = request(tmp_path, secret_files=[entry(tmp_path / "etc" / "x.env", content=SECRET, mode="0644")])
    assert "s3cr3t" not in refusal(bad).message


@pytest.mark.parametrize(
    "change, option, value, words",
    [
        ({"files": [{"path": "etc/x", "content": ""}]}, "files[0].path", "etc/x", "not an absolute path"),
        ({"files": [{"path": "/tmp/a\nb", "content": ""}]}, "files[0].path", "/tmp/a\nb", "line-break"),
        ({"files": [{"path": "/tmp/a\x00b", "content": ""}]}, "files[0].path", "/tmp/a\x00b", "NUL"),
        ({"files": [{"path": "/tmp/../etc/x", "content": ""}]}, "files[0].path", "/tmp/../etc/x", "'..'"),
        ({"directories": [{"path": "/tmp//x"}]}, "directories[0].path", "/tmp//x", "normal form"),
        ({"directories": [{"path": "/tmp/x/"}]}, "directories[0].path", "/tmp/x/", "normal form"),
        ({"files": [{"path": "/tmp/x", "content": "", "mode": 644}]}, "files[0].mode", 644, "quote it in YAML"),
        ({"files": [{"path": "/tmp/x", "content": "", "mode": 420}]}, "files[0].mode", 420, "is a number"),
        ({"files": [{"path": "/tmp/x", "content": "", "mode": "0o644"}]}, "files[0].mode", "0o644", "octal"),
        ({"files": [{"path": "/tmp/x", "content": "", "mode": "u+rw"}]}, "files[0].mode", "u+rw", "octal"),
        ({"directories": [{"path": "/tmp/x", "mode": "08"}]}, "directories[0].mode", "08", "octal"),
        ({"files": [{"path": "/tmp/x", "content": "", "mode": True}]}, "files[0].mode", True, "octal"),
        ({"secret_files": [{"path": "/tmp/x", "content": "s", "owner": "no-such-user-uma"}]},
         "secret_files[0].owner", "no-such-user-uma", "not a user on this node"),
        ({"files": [{"path": "/tmp/x", "content": "", "group": "no-such-group-uma"}]},
         "files[0].group", "no-such-group-uma", "not a group on this node"),
        ({"files": [{"path": "/tmp/x"}]}, "files[0].content", None, "not a string"),
        ({"secret_files": [{"path": "/tmp/x", "content": "s", "mode": "0604"}]},
         "secret_files[0].mode", "0604", "every user of the node"),
        ({"files": [{"path": "/tmp/x", "content": "", "size": 3}]}, "files[0].size", 3, "not a known key"),
        ({"files": ["/tmp/x"]}, "files[0]", "/tmp/x", "not a dictionary"),
        ({"files": {"path": "/tmp/x"}}, "files", {"path": "/tmp/x"}, "not a list"),
        ({"files": [{"path": "/tmp/x", "content": ""}, {"path": "/tmp/x", "content": "y"}]},
         "files[1].path", "/tmp/x", "also given by files[0]"),
        ({"directories": [{"path": "/tmp/x"}], "secret_files": [{"path": "/tmp/x", "content": "s"}]},
         "secret_files[0].path", "/tmp/x", "also given by directories[0]"),
        ({"directories": [{"path": "/tmp/uma-nf-missing/a"}, {"path": "/tmp/uma-nf-missing"}]},
         "directories[0].path", "/tmp/uma-nf-missing/a", "does not exist and is not listed earlier"),
        ({"files": [{"path": "/tmp/uma-nf-missing/a", "content": ""}]},
         "files[0].path", "/tmp/uma-nf-missing/a", "does not exist and is not listed in directories"),
        ({"programs": True, "lib_dir": "lib"}, "lib_dir", "lib", "not an absolute path"),
    ],
)  # fmt: skip
def test_every_bad_entry_is_refused_naming_option_and_value(change, option, value, words):
    err = refusal(dict(change))
    assert err.option == option
    if option.startswith("secret_files") and option.endswith(".content"):
        assert err.value != value
    else:
        assert err.value == value
    assert words in err.message, err.message
    assert err.fix


def test_a_refusal_late_in_the_list_changes_nothing(tmp_path):
    req = request(tmp_path)
    req["secret_files"].append(entry(tmp_path / "etc" / "b.env", content="x", owner="no-such-user-uma"))
    with pytest.raises(UmaError) as err:
        run(req)
    assert err.value.option == "secret_files[1].owner"
    assert list(tmp_path.iterdir()) == []


def test_a_path_that_is_not_a_directory_is_refused_and_nothing_changes(tmp_path):
    (tmp_path / "etc").write_text("I am a file\n")
    req = request(tmp_path)
    before = tree(tmp_path)
    with pytest.raises(UmaError) as err:
        run(req)
    assert err.value.option == "directories[0].path" and "exists and is not a directory" in err.value.message
    assert tree(tmp_path) == before


def test_a_symlink_or_a_directory_in_a_files_place_is_refused(tmp_path):
    req = request(tmp_path)
    run(req)
    target = tmp_path / "etc" / "engines" / "a.json"
    target.unlink()
    target.symlink_to(tmp_path / "etc" / "engines" / "a.env")
    assert "symbolic link" in refusal(req).message
    target.unlink()
    target.mkdir()
    assert "not a regular file" in refusal(req).message


def test_a_parent_in_directories_is_fine_in_check_mode(tmp_path):
    req = request(tmp_path)
    result, diff = run(req, check=True)
    assert not (tmp_path / "etc").exists()
    assert result["files"][str(tmp_path / "etc" / "engines" / "a.env")]["created"] is True
    assert diff[2]["before_header"] == "%s (new file 0644 %s:%s)" % (tmp_path / "etc" / "engines" / "a.json", *ME)


def test_programs_install_from_the_modules_own_source_with_a_stable_fingerprint(tmp_path):
    lib = tmp_path / "lib"
    req = {"programs": True, "lib_dir": str(lib)}
    first, diff = run(req, program_owner=ME)
    expected = [str(lib / name) for name in program_names()]
    dirs = package_dirs(str(lib))
    assert first["programs"]["changed_paths"] == sorted([str(lib), *dirs, *expected])
    assert first["changed_paths"] == first["programs"]["changed_paths"]
    found = sorted(os.path.relpath(os.path.join(d, f), str(lib)) for d, _s, fs in os.walk(lib) for f in fs)
    assert found == sorted(program_names())
    assert all(stat.S_IMODE(os.stat(path).st_mode) == 0o755 for path in [str(lib), *dirs])
    source = os.path.join(os.path.dirname(os.path.dirname(nf.__file__)), "node", "guard", "program.py")
    assert (lib / "uma_vllm_node" / "guard" / "program.py").read_bytes() == open(source, "rb").read()
    assert all(stat.S_IMODE(os.stat(path).st_mode) == 0o644 for path in expected)
    assert all("(program " in d["after"] for d in diff if d["before_header"] not in [str(lib), *dirs])
    again, diff = run(req, program_owner=ME)
    assert again["changed"] is False and diff == [] and again["programs"]["changed_paths"] == []
    assert again["programs"]["fingerprint"] == first["programs"]["fingerprint"]
    # a local edit and a wrong mode are both put back
    (lib / "uma_vllm_node" / "base" / "common.py").write_text("# edited\n")
    os.chmod(lib / "uma_launch.py", 0o600)
    os.chmod(lib / "uma_vllm_node" / "guard", 0o700)
    fixed = run(req, program_owner=ME)[0]
    assert fixed["programs"]["changed_paths"] == sorted(
        [
            str(lib / "uma_vllm_node" / "base" / "common.py"),
            str(lib / "uma_launch.py"),
            str(lib / "uma_vllm_node" / "guard"),
        ]
    )
    assert fixed["programs"]["fingerprint"] == first["programs"]["fingerprint"]
    # the installed set runs on its own: no Ansible, nothing else on the path
    for program in ("uma_launch.py", "uma_guard.py", "uma_watchdog.py", "uma_readahead.py", "uma_metrics.py"):
        ran = subprocess.run([sys.executable, "-S", str(lib / program), "--help"], capture_output=True, text=True,
                             cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, timeout=60, check=False)  # fmt: skip
        assert ran.returncode == 0, (program, ran.stderr[-2000:])


def test_a_program_path_listed_as_a_file_is_a_duplicate(tmp_path):
    lib = tmp_path / "lib"
    req = {"programs": True, "lib_dir": str(lib), "directories": [entry(lib)],
           "files": [entry(lib / "uma_launch.py", content="x")]}  # fmt: skip
    err = refusal(req, program_owner=ME)
    assert err.option == "programs[uma_launch.py].path" and "also given by files[0]" in err.message
