"""What an unauthenticated or hostile caller gets, and what a viewer may not read (issue 9, item 4).

* the token is checked before the body is read: no token, no word about the body;
* a refusal never echoes a huge value back whole;
* env values (secrets, often) are masked for users who may not change them;
* '/' is refused in a job name on every path that names a job.
"""

from __future__ import annotations

from typing import Any

import pytest

from jobcontrol.errors import ECHO_MAX
from jobcontrol.views import ENV_MASK
from tests.api.conftest import Api
from tests.integration.helpers import box, task

pytestmark = pytest.mark.timeout(60)

V1 = "/api/v1"
JSON = {"Content-Type": "application/json"}
NO_TOKEN: list[dict[str, str]] = [JSON, {**JSON, "Authorization": "Bearer jc_nope"}]


# ---------------------------------------------------------------- the token first


@pytest.mark.parametrize("headers", NO_TOKEN, ids=["no-token", "bad-token"])
@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/jobs", b'{"name": '),  # malformed JSON
        ("PATCH", "/jobs", b"\xff\xfe not json"),
        ("POST", "/definitions", b'{"text": 1}'),  # well-formed, wrong shape
        ("POST", "/jobs/delete", b'{"jobs": ["' + b"x" * (11 * 1024 * 1024) + b'"]}'),  # > 10 MiB
        ("POST", "/nowhere", b"{}"),  # no route: still nothing said without a token
    ],
    ids=["malformed", "not-utf8", "wrong-shape", "oversize", "no-route"],
)
def test_an_unauthenticated_request_is_401_whatever_its_body(
    api: Api, headers: dict[str, str], method: str, path: str, body: bytes
) -> None:
    api.jc.create(box("Top"))
    before = api.jc.dump()
    r = api.client.request(method, V1 + path, content=body, headers=headers)
    assert r.status_code == 401, r.text
    assert r.json()["error"] == "Unauthorized"
    assert r.headers["www-authenticate"] == "Bearer"
    assert api.jc.dump() == before


def test_with_a_token_a_malformed_body_is_still_422_and_healthz_needs_none(api: Api) -> None:
    r = api.client.post(f"{V1}/jobs", content=b'{"name": ', headers={**JSON, **api.headers()})
    assert r.status_code == 422
    assert r.json()["message"].startswith("body: not valid JSON at character 9: "), r.json()
    # NaN and Infinity are Python's, not JSON's.
    body = b'{"name": "nan1", "kind": "task", "command": "true", "priority": NaN}'
    r = api.client.post(f"{V1}/jobs", content=body, headers={**JSON, **api.headers()})
    assert r.status_code == 422, r.text
    assert "NaN is not JSON" in r.json()["message"], r.json()
    assert "nan1" not in [
        j["name"] for j in api.client.get(f"{V1}/tree", headers=api.headers()).json()["jobs"]
    ]
    assert api.client.get("/healthz").status_code == 200


def test_a_key_given_twice_is_refused_not_the_last_one_kept(api: Api) -> None:
    before = api.jc.dump()
    body = b'{"name": "dk1", "kind": "task", "command": "true", "name": "dk2"}'
    r = api.client.post(f"{V1}/jobs", content=body, headers={**JSON, **api.headers()})
    assert r.status_code == 422, r.text
    assert "key 'name' is given twice in one object" in r.json()["message"], r.json()
    # Nested objects too: a change's fields.
    api.jc.create(task("t1", "true"))
    mid = api.jc.dump()
    change = b'{"changes": [{"job": "t1", "fields": {"command": "a", "command": "b"}}]}'
    r = api.client.patch(f"{V1}/jobs", content=change, headers={**JSON, **api.headers()})
    assert r.status_code == 422, r.text
    assert "key 'command' is given twice" in r.json()["message"]
    assert api.jc.dump() == mid != before


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", None],
    ids=["text", "form", "none"],
)
def test_a_body_that_is_not_sent_as_json_is_415(api: Api, content_type: str | None) -> None:
    before = api.jc.dump()
    headers = api.headers() | ({"Content-Type": content_type} if content_type else {})
    body = b'{"name": "t9", "kind": "task", "command": "true"}'
    r = api.client.post(f"{V1}/jobs", content=body, headers=headers)
    assert r.status_code == 415, r.text
    said = f"is sent as {content_type!r}" if content_type else "has no Content-Type"
    assert r.json()["message"] == f"the request body {said}: send it as JSON (application/json)"
    assert api.jc.dump() == before
    # JSON by another name is JSON.
    headers["Content-Type"] = "application/json; charset=utf-8"
    assert api.client.post(f"{V1}/jobs", content=body, headers=headers).status_code == 201


# ---------------------------------------------------------------- nothing huge echoed


def _echoed_strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [k, *_echoed_strings(v)]]
    if isinstance(value, list):
        return [s for v in value for s in _echoed_strings(v)]
    return []


def test_a_422_echoes_at_most_200_characters_of_a_value(api: Api) -> None:
    before = api.jc.dump()
    name = "N" * 9_000_000  # a 9 MB name
    r = api.client.post(f"{V1}/jobs", json={"name": name, "kind": "task"}, headers=api.headers())
    assert r.status_code == 422
    assert len(r.content) < 4 * ECHO_MAX, len(r.content)
    body = r.json()
    assert "name" in body["message"]
    echoed = [s for s in _echoed_strings(body["detail"]) if s.startswith("NNN")]
    assert echoed, body  # the value is still shown, cut, and says how much was left out
    assert all(len(s) < ECHO_MAX + 40 for s in echoed)
    assert echoed[0].endswith(f"({len(name) - ECHO_MAX} more characters)")
    assert api.jc.dump() == before


def test_a_refused_definition_file_does_not_echo_a_huge_name(api: Api) -> None:
    before = api.jc.dump()
    text = "jobs:\n  - name: " + "N" * 2_000_000 + "\n    command: 'true'\n"
    r = api.client.post(f"{V1}/definitions", json={"text": text}, headers=api.headers())
    assert r.status_code == 422
    assert len(r.content) < 5 * ECHO_MAX, len(r.content)
    assert "more characters" in r.json()["message"]
    assert api.jc.dump() == before


def test_many_bad_items_give_a_bounded_answer(api: Api) -> None:
    jobs = [{"bad": i} for i in range(5000)]  # 5,000 problems: the answer lists 50
    r = api.client.post(f"{V1}/jobs/delete", json={"jobs": jobs}, headers=api.headers())
    assert r.status_code == 422
    body = r.json()
    assert len(body["detail"]) == 50
    assert "more problems" in body["message"]


# ---------------------------------------------------------------- env values masked


SECRET = "hunter2"


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_env_values_are_masked_for_users_who_may_not_change_them(api: Api, role: str) -> None:
    api.jc.create(
        box("Top"), task("db", "echo $PASSWORD", "Top", active=True, env={"PASSWORD": SECRET})
    )
    run_id = api.jc.run_now("db")
    api.jc.wait_quiet()
    headers = api.headers(role)

    job = api.client.get(f"{V1}/jobs/db", headers=headers).json()
    assert job["env"] == {"PASSWORD": ENV_MASK}
    runs = api.client.get(f"{V1}/jobs/db/runs", headers=headers).json()["runs"]
    assert runs[0]["env"] == {"PASSWORD": ENV_MASK}
    assert api.client.get(f"{V1}/runs/{run_id}", headers=headers).json()["run"]["env"] == {
        "PASSWORD": ENV_MASK
    }
    top_run = api.jc.run_now("Top")
    api.jc.wait_quiet()
    tree_run = api.client.get(f"{V1}/runs/{top_run}", headers=headers).json()
    assert [c["env"] for c in tree_run["children"]] == [{"PASSWORD": ENV_MASK}]
    export = api.client.get(f"{V1}/definitions", headers=headers)
    assert export.status_code == 200
    assert SECRET not in export.text
    assert ENV_MASK in export.text
    assert export.text.startswith("# env values are masked")
    for path in ("/tree", "/status", "/jobs/Top", "/jobs/db", "/jobs/db/runs"):
        assert SECRET not in api.client.get(V1 + path, headers=headers).text, path

    # An admin, who may change them, reads them.
    admin = api.headers("admin")
    assert api.client.get(f"{V1}/jobs/db", headers=admin).json()["env"] == {"PASSWORD": SECRET}
    assert api.client.get(f"{V1}/jobs/db/runs", headers=admin).json()["runs"][0]["env"] == {
        "PASSWORD": SECRET
    }
    full = api.client.get(f"{V1}/definitions", headers=admin).text
    assert SECRET in full
    assert not full.startswith("#")


# ---------------------------------------------------------------- no '/' in a name


def test_a_slash_in_a_new_name_is_refused_on_every_api_path(api: Api) -> None:
    api.jc.create(box("Top"), task("hist", "true", "Top"))
    before = api.jc.dump()
    admin = api.headers()

    created = api.client.post(
        f"{V1}/jobs", json={"name": "hist/runs", "kind": "task", "command": "true"}, headers=admin
    )
    renamed = api.client.patch(
        f"{V1}/jobs", json={"changes": [{"job": "hist", "fields": {"name": "a/b"}}]}, headers=admin
    )
    loaded = api.client.post(
        f"{V1}/definitions",
        json={"text": "jobs:\n  - name: nightly/db\n    command: 'true'\n"},
        headers=admin,
    )
    for answer in (created, renamed, loaded):
        assert answer.status_code == 422, answer.text
        assert "must not contain '/'" in answer.json()["message"], answer.text
    assert renamed.json()["job"] == "hist"
    assert "nightly/db" in loaded.json()["message"]
    assert api.jc.dump() == before


def test_the_engine_refuses_a_slash_in_a_new_name(api: Api) -> None:
    from jobcontrol.errors import JobError

    api.jc.create(box("Top"))
    before = api.jc.dump()
    with pytest.raises(JobError, match="must not contain '/'"):
        api.jc.create(task("a/b", "true", "Top"))
    with pytest.raises(JobError, match="must not contain '/'"):
        api.jc.modify("Top", name="Top/x")
    assert api.jc.dump() == before
