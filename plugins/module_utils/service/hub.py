# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Models from the Hugging Face Hub in the vllm_service role (issue 21 item 3).

An engine gives either ``model_path`` (a directory already on the node) or ``model`` (a Hub id,
with ``revision``). For ``model`` the role runs ``uma.vllm.model_fetch`` on every node of the
engine before anything is planned or restarted: each node downloads from the Hub (or the mirror
/ stand-in at ``vllm_service_hub_endpoint``) itself into ``<vllm_service_models_dir>/<id>``,
and the safetensors are verified there. The commit the revision resolved to goes into the
engine's environment (``UMA_MODEL_COMMIT``): the engine's launcher config changes with it, so a
new commit restarts the engine -- every rank of a multi-node engine, once -- and the ranks'
launchers compare it before they load. ``served_model_name`` defaults to the id.

Pure functions on plain data, run on the controller (filters in plugins/filter/vllm_service.py;
tests/unit/plugins/module_utils/test_vllm_service_hub.py). The id, revision, endpoint and
patterns are checked by the same rules as the module (models/fetch.py), named as the role's
variables.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from ansible_collections.uma.vllm.plugins.module_utils.models import fetch as mf
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.service.engines import secrets
from ansible_collections.uma.vllm.plugins.module_utils.service.hub_copy import source_errors

DEFAULT_REVISION = "main"
COMMIT_ENV = "UMA_MODEL_COMMIT"
SERVED_FLAG = "--served-model-name"
TOKEN_SECRET = "HF_TOKEN"
BOOL_WORDS = ("true", "false", "yes", "no", "1", "0")


def _err(option: str, value: Any, problem: str, fix: str) -> str:
    return "%s = %r %s. Fix: %s" % (option, value, problem, fix)


def _where(engine: Dict[str, Any], index: int) -> str:
    return "vllm_service_engines[%s]" % (engine.get("name") or index)


def _valid(check: Any, value: Any) -> bool:
    try:
        check(value)
    except UmaError:
        return False
    return True


def _models_dir_ok(models_dir: Any) -> bool:
    return (
        isinstance(models_dir, str)
        and models_dir.startswith("/")
        and os.path.normpath(models_dir) != "/"
        and not any(c in models_dir for c in "\x00\n\r")
    )


def model_dir(models_dir: str, repo_id: str) -> str:
    """Where the model ``repo_id`` lands: ``<models_dir>/<OWNER>/<NAME>``."""
    return "%s/%s" % (os.path.normpath(models_dir), repo_id)


def served_names(engine: Dict[str, Any]) -> List[str]:
    """The engine's served model names: ``served_model_name`` (a name or a list), else the Hub id."""
    value = engine.get("served_model_name")
    if value is None:
        return [engine["model"]] if engine.get("model") is not None else []
    return [value] if isinstance(value, str) else list(value)


def _names_problem(value: Any) -> Optional[str]:
    if value is None:
        return None
    words = [value] if isinstance(value, str) else value
    if not isinstance(words, list) or not words:
        return "is not a name or a non-empty list of names"
    for word in words:
        if not isinstance(word, str) or not word.strip() or word != word.strip() or word.startswith("-"):
            return "has %r, which is not a name (no spaces around it, not starting with '-')" % (word,)
        if any(ord(c) < 32 for c in word) or len(word) > 256:
            return "has %r, which has a control character or is longer than 256 characters" % (word,)
    return None


def hub_engines(engines: List[Dict[str, Any]], models_dir: Any) -> List[Dict[str, Any]]:
    """This host's engines (vllm_service_host_engines) with what the Hub adds: for an engine with
    ``model``, ``hub`` = {repo_id, revision, dest} and ``model_path`` = dest (when the id and
    ``models_dir`` are valid and no model_path is given: hub_errors refuses the rest); for every
    engine with served names, ``--served-model-name`` in its plan's extra_args (unless there already).
    Never raises: what is wrong is hub_errors' to name."""
    out = []
    for raw in engines:
        engine = dict(raw)
        model = engine.get("model")
        if model is not None:
            revision = engine.get("revision")
            hub = {"repo_id": model, "revision": DEFAULT_REVISION if revision in (None, "") else revision}
            # both given: hub_errors refuses it (and no dest, so nothing is fetched into the user's path)
            hub["model_path_given"] = engine.get("model_path") is not None
            if not hub["model_path_given"] and _valid(mf._repo_id, model) and _models_dir_ok(models_dir):
                engine["model_path"] = model_dir(models_dir, model)
            hub["dest"] = None if hub["model_path_given"] else engine.get("model_path")
            engine["hub"] = hub
        plan = dict(engine.get("plan") or {})
        extra = plan.get("extra_args") if plan.get("extra_args") is not None else []
        extra = list(extra) if isinstance(extra, list) else None  # not a list: vllm_flags refuses it
        if _names_problem(engine.get("served_model_name")) is None and extra is not None:
            names = served_names(engine)
            if names and SERVED_FLAG not in extra:
                plan["extra_args"] = [*extra, SERVED_FLAG, *names]
                engine["plan"] = plan
        out.append(engine)
    return out


def _settings_errors(settings: Dict[str, Any]) -> List[str]:
    errors = []
    models_dir = settings.get("models_dir")
    if not _models_dir_ok(models_dir):
        errors.append(
            _err("vllm_service_models_dir", models_dir, "is not an absolute directory path (other than /)",
                 "Give where models from the Hub land, e.g. /var/lib/uma-vllm/models.")
        )  # fmt: skip
    endpoint = settings.get("endpoint")
    if endpoint not in (None, "") and not _valid(mf._endpoint, endpoint):
        errors.append(
            _err("vllm_service_hub_endpoint", endpoint, "is not an http(s) URL of a Hub",
                 "Give the base URL without credentials, query or fragment (e.g. https://hf-mirror.example:8443),"
                 " or null for https://huggingface.co.")
        )  # fmt: skip
    if str(settings.get("verify")).lower() not in BOOL_WORDS:
        errors.append(
            _err("vllm_service_model_verify", settings.get("verify"), "is not a boolean",
                 "true (hash every safetensors file on every run) or false (sizes, and the hashes of what was"
                 " downloaded).")
        )  # fmt: skip
    if "source" in settings:
        errors.extend(source_errors(settings["source"]))
    patterns = settings.get("allow_patterns")
    if patterns is not None and not _valid(mf._patterns, patterns):
        errors.append(
            _err("vllm_service_model_allow_patterns", patterns, "is not a list of 1-100 one-line glob patterns",
                 "Give e.g. ['*.safetensors', '*.json'], or null for the weights, config and tokenizer files.")
        )  # fmt: skip
    return errors


def _engine_errors(where: str, engine: Dict[str, Any]) -> List[str]:
    errors = []
    model = engine.get("model")
    if model is not None and not _valid(mf._repo_id, model):
        errors.append(
            _err(where + ".model", model, "is not a Hugging Face model id (OWNER/NAME: letters, digits, '-', '_',"
                 " '.'; no '--' or '..'; at most 96 characters)",
                 "Give the id as the Hub shows it, e.g. Qwen/Qwen3-0.6B, or model_path for a directory on the node.")
        )  # fmt: skip
    revision = engine.get("revision")
    if revision is not None and model is None:
        errors.append(
            _err(where + ".revision", revision, "is given without model",
                 "Give model (the Hub id) with it, or drop revision for a model_path engine.")
        )  # fmt: skip
    elif revision is not None and not _valid(mf._revision, revision):
        errors.append(
            _err(where + ".revision", revision, "is not a branch, tag or commit name",
                 "Give a branch, a tag or a 40-character commit sha, e.g. main.")
        )  # fmt: skip
    problem = _names_problem(engine.get("served_model_name"))
    if problem:
        errors.append(
            _err(where + ".served_model_name", engine.get("served_model_name"), problem,
                 "Give the name clients send as \"model\" (or a list of names).")
        )  # fmt: skip
    extra = (engine.get("plan") or {}).get("extra_args") or []
    if engine.get("served_model_name") is not None and isinstance(extra, list) and SERVED_FLAG in extra:
        errors.append(
            _err(where + ".plan.extra_args", SERVED_FLAG, "is given as well as served_model_name",
                 "Give the names once: served_model_name.")
        )  # fmt: skip
    if COMMIT_ENV in (engine.get("env") or {}):
        errors.append(
            _err(where + ".env", COMMIT_ENV, "is set by the role (the commit of the engine's model from the Hub)",
                 "Drop it from env.")
        )  # fmt: skip
    return errors


def _token_errors(where: str, name: Any, raw_engines: Any, hostname: str) -> List[str]:
    """The HF_TOKEN secret goes into the 0600 file model_fetch reads: one token (never echoed)."""
    try:
        token = secrets(raw_engines, name, hostname).get(TOKEN_SECRET)
    except (AttributeError, TypeError):
        return []  # a secrets value that is not a mapping: the engine checks name it
    if token is None or mf.TOKEN_RE.fullmatch(token.strip()):
        return []
    return [
        "%s.secrets.%s is not one Hugging Face token (8-1024 printable ASCII characters, no spaces; the value is"
        " not shown). Fix: give the token alone, e.g. from Ansible Vault." % (where, TOKEN_SECRET)
    ]


def hub_errors(
    engines: List[Dict[str, Any]], settings: Dict[str, Any], raw_engines: Any = None, hostname: str = ""
) -> List[str]:
    """Every problem of this host's engines' Hub settings (engines from hub_engines), and of the
    role's Hub variables when an engine has ``model``; each names the variable, value and fix."""
    errors: List[str] = []
    dests: Dict[str, Dict[str, Any]] = {}
    for index, engine in enumerate(engines):
        if engine.get("state") == "absent":
            continue
        where = _where(engine, index)
        if (engine.get("hub") or {}).get("model_path_given"):
            errors.append(
                _err(where + ".model_path", engine.get("model_path"), "is given as well as model %r" % engine["model"],
                     "Give one: model (a Hub id, downloaded into vllm_service_models_dir) or model_path (a"
                     " directory already on the node).")
            )  # fmt: skip
        errors.extend(_engine_errors(where, engine))
        hub = engine.get("hub")
        if hub and hub.get("dest"):
            other = dests.setdefault(hub["dest"], dict(hub, name=engine.get("name")))
            if other["name"] != engine.get("name") and other["revision"] != hub["revision"]:
                errors.append(
                    _err(where + ".revision", hub["revision"], "differs from engine %s's %r, and both use %s"
                         % (other["name"], other["revision"], hub["dest"]),
                         "Give the engines of one model on a host the same revision.")
                )  # fmt: skip
        if hub:
            errors.extend(_token_errors(where, engine.get("name"), raw_engines, hostname))
    if any(engine.get("model") is not None for engine in engines if engine.get("state") != "absent"):
        errors.extend(_settings_errors(settings or {}))
    return errors


def fetched(engines: List[Dict[str, Any]], results: Any) -> List[Dict[str, Any]]:
    """The engines with the commit model_fetch resolved (``hub.commit`` and ``UMA_MODEL_COMMIT`` in
    env); ``results``: the registered loop of the role's model_fetch task (``item`` = the engine).
    An engine whose fetch did not run (check mode before its token file exists) keeps no commit."""
    commits = {}
    for result in results or []:
        item = result.get("item") or {}
        if isinstance(result.get("commit"), str) and result["commit"]:
            commits[item.get("name")] = result["commit"]
    out = []
    for raw in engines:
        engine = dict(raw)
        if engine.get("hub") and engine.get("name") in commits:
            engine["hub"] = dict(engine["hub"], commit=commits[engine["name"]])
            engine["env"] = dict(engine.get("env") or {}, **{COMMIT_ENV: commits[engine["name"]]})
        out.append(engine)
    return out


def commits(engines: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Engine name -> the commit of its model on this host (the fact the other ranks read)."""
    return {e["name"]: e["hub"].get("commit") for e in engines if e.get("hub")}


def rank_errors(engines: List[Dict[str, Any]], hostvars: Any, hostname: str) -> List[str]:
    """A multi-node engine starts only when every rank has the same commit of its model: a rank
    whose fetch failed (its host left the play) or that resolved another commit (the branch moved
    between the nodes' downloads) is refused, naming the hosts and commits."""
    errors = []
    for engine in engines:
        hub, cluster = engine.get("hub"), engine.get("cluster")
        if not hub or not cluster or engine.get("state") == "absent" or not hub.get("commit"):
            continue
        for node in cluster["nodes"]:
            if node == hostname:
                continue
            hv = hostvars[node] if node in hostvars else {}
            theirs = (hv.get("__vllm_service_model_commits") or {}) if hasattr(hv, "get") else {}
            if isinstance(theirs, dict) and engine["name"] in theirs and theirs[engine["name"]] is None:
                continue  # its fetch was not run in check mode (no token file yet): nothing to compare
            commit = theirs.get(engine["name"]) if isinstance(theirs, dict) else None
            if commit is None:
                errors.append(
                    "engine %s: host %s (rank %d) has no commit of %s: its download did not run or failed, so no"
                    " rank starts. Fix: see that host's model_fetch task, then run again."
                    % (engine["name"], node, cluster["nodes"].index(node), hub["repo_id"])
                )
            elif commit != hub["commit"]:
                errors.append(
                    "engine %s: %s %s resolved to commit %s on %s but %s on %s (the revision moved between the"
                    " downloads). Fix: run again, or pin revision to one commit sha."
                    % (engine["name"], hub["repo_id"], hub["revision"], hub["commit"], hostname, commit, node)
                )
    return errors
