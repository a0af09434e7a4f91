# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The built-in Hub client's pure parts: error mapping, listing parsing, file names, retries.

The client against a real HTTP server (the stand-in Hub with its CDN redirects, lost connections,
a killed run's partial file) is tests/integration/test_model_fetch_live.py.
"""

from __future__ import annotations

import socket
import urllib.error

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.models import fetch as mf
from ansible_collections.uma.vllm.plugins.module_utils.models import hub_http as hh
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError

SHA = "a" * 40


def request(**kw):
    base = {"repo_id": "lab/tiny", "revision": "main", "dest": "/tmp/uma-hub-test/d", "endpoint": None,
            "allow_patterns": None, "verify": False, "token_file": None}  # fmt: skip
    base.update(kw)
    return mf.validate(base)


@pytest.mark.parametrize(
    "status, code, message, option",
    [
        (404, "RepoNotFound", "Repository not found", "repo_id"),
        (401, "RepoNotFound", "Repository not found", "token_file"),  # the Hub's answer without a token
        (404, "RevisionNotFound", "Invalid rev id: nope", "revision"),
        (401, "GatedRepo", "Access to model lab/tiny is restricted.", "token_file"),
        (403, "", "", "token_file"),
        (404, "EntryNotFound", "Entry not found", "endpoint"),
        (500, "", "", "endpoint"),
    ],
)
def test_http_errors_map_as_huggingface_hub_maps_them(status, code, message, option):
    headers = {"X-Error-Code": code, "X-Error-Message": message} if code else {}
    err = hh.http_error(status, headers, "https://huggingface.co/api/models/lab/tiny?sig=secret")
    view = mf.HubRequestView("lab/tiny", "nope", "https://huggingface.co", None, None)
    problem = mf._hub_problem(err, view)
    assert problem.option == option, problem.message
    assert "secret" not in str(err)  # a signed URL's query is never shown


def test_a_401_without_an_error_code_is_a_missing_repository_as_in_huggingface_hub():
    assert type(hh.http_error(401, {}, "u")).__name__ == "RepositoryNotFoundError"
    bad_token = hh.http_error(401, {"X-Error-Message": "Invalid credentials in Authorization header"}, "u")
    assert type(bad_token).__name__ == "HubHTTPError" and bad_token.response.status_code == 401


@pytest.mark.parametrize("name", ["config.json", "sub/dir/model.safetensors", "a..b.json", ".gitattributes"])
def test_names_inside_dest_are_safe(name):
    assert hh.safe_name(name)


@pytest.mark.parametrize(
    "name", ["", "/etc/passwd", "../x", "a/../../x", "a//b", "./a", "a/.", ".cache/uma-hub/x.part", "a\\b", "a\nb", 3]
)
def test_names_that_leave_dest_or_touch_the_bookkeeping_are_not(name):
    assert not hh.safe_name(name)


def test_the_listing_is_parsed_with_sizes_and_lfs_sha256():
    info = {"sha": SHA, "gated": "manual", "siblings": [
        {"rfilename": "config.json", "size": 10, "blobId": "b"},
        {"rfilename": "model.safetensors", "size": 20, "lfs": {"sha256": "c" * 64, "size": 20, "pointerSize": 130}},
    ]}  # fmt: skip
    listing = hh.parse_listing(info, "u")
    assert listing.commit == SHA and listing.gated is True
    assert listing.files == [hh.HubFile("config.json", 10, None), hh.HubFile("model.safetensors", 20, "c" * 64)]


@pytest.mark.parametrize(
    "info, words",
    [
        ([], "siblings"),
        ({"sha": SHA}, "siblings"),
        ({"sha": "main", "siblings": []}, "commit sha"),
        ({"sha": SHA, "siblings": [{"rfilename": "x.safetensors"}]}, "without sizes"),
        ({"sha": SHA, "siblings": [{"rfilename": "x", "size": True}]}, "without sizes"),
        ({"sha": SHA, "siblings": [{"rfilename": "../x", "size": 1}]}, "outside dest"),
        ({"sha": SHA, "siblings": ["x"]}, "outside dest"),
    ],
)
def test_a_listing_that_is_not_the_hub_s_is_refused_naming_the_endpoint(info, words):
    with pytest.raises(hh.BadListing) as err:
        hh.parse_listing(info, "https://mirror.example/api/models/lab/tiny?x=1")
    assert words in str(err.value)
    problem = mf._hub_problem(err.value, mf.HubRequestView("lab/tiny", "main", "https://mirror.example", None, None))
    assert problem.option == "endpoint" and "mirror" in problem.fix


def test_range_answers_are_read_from_content_range():
    assert hh._range_start("bytes 100-199/200") == 100
    assert hh._range_start("bytes 0-0/*") == 0
    assert hh._range_start(None) is None and hh._range_start("items 1-2/3") is None


def test_origins_decide_where_the_token_goes():
    assert hh.origin("https://huggingface.co/x") == hh.origin("https://HuggingFace.co:443/y")
    assert hh.origin("https://huggingface.co/x") != hh.origin("https://cdn-lfs.huggingface.co/x")
    assert hh.origin("http://127.0.0.1:8765/x") != hh.origin("http://localhost:8765/x")


def client(**kw):
    pauses = []
    made = hh.BuiltinHubClient("https://hub.example", "hf_secretToken123", problem=lambda e: e,
                               sleep=pauses.append, **kw)  # fmt: skip
    return made, pauses


def test_lost_connections_and_5xx_are_tried_again_with_doubling_pauses():
    made, pauses = client(retries=4)
    answers = [ConnectionResetError(), hh.http_error(503, {}, "u"), socket.timeout(), "done"]

    def action():
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    assert made._retrying(action) == "done" and pauses == [1.0, 2.0, 4.0]


def raising(err):
    def action():
        raise err

    return action


def test_retries_end_and_a_4xx_or_an_unknown_host_is_not_tried_again():
    made, pauses = client(retries=2)
    with pytest.raises(ConnectionResetError):
        made._retrying(raising(ConnectionResetError()))
    assert pauses == [1.0, 2.0]
    made, pauses = client()
    with pytest.raises(hh.RevisionNotFoundError):
        made._retrying(raising(hh.http_error(404, {"X-Error-Code": "RevisionNotFound"}, "u")))
    with pytest.raises(urllib.error.URLError):
        made._retrying(raising(urllib.error.URLError(socket.gaierror(-2, "Name unknown"))))
    assert pauses == []


def test_make_client_chooses_and_a_disk_error_is_not_blamed_on_the_hub(tmp_path):
    built = mf.make_client(request())
    assert isinstance(built, hh.BuiltinHubClient) and built.endpoint == mf.DEFAULT_ENDPOINT and built.token is None
    full = OSError(28, "No space left on device", str(tmp_path / "d" / "x.part"))
    assert built.problem(full) is full  # the module names the path (dest), not the endpoint
    assert built.problem(ConnectionResetError(104, "reset")).option == "endpoint"
    refusal = UmaError("dest", "/x", "p", "f")
    assert built.problem(refusal) is refusal
    with pytest.raises(UmaError) as err:
        request(client="hf")
    assert err.value.option == "client" and "builtin or huggingface_hub" in err.value.fix
