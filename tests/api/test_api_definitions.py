"""Definition files over the API: one batch in, YAML out, refusals with the file's line."""

from __future__ import annotations

from typing import Any

import pytest

from jobcontrol.definitions.parse import parse_definitions
from jobcontrol.service.audit import list_entries
from tests.api.conftest import Api

pytestmark = pytest.mark.timeout(60)

V1 = "/api/v1"

TREE = """\
jobs:
  - name: Nightly
    timer: daily 02:00
    children:
      - name: build
        command: make
      - name: test
        command: make test
"""


def load(api: Api, text: str, role: str = "admin", **extra: Any) -> Any:
    return api.client.post(
        f"{V1}/definitions",
        headers=api.headers(role),
        json={"text": text, "source": "nightly.yaml", **extra},
    )


def tree(api: Api) -> dict[str, dict[str, Any]]:
    jobs = api.client.get(f"{V1}/tree", headers=api.headers("viewer")).json()["jobs"]
    return {j["name"]: j for j in jobs}


def test_a_file_is_loaded_as_one_batch_in_the_users_name(api: Api) -> None:
    answer = load(api, TREE)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert sorted(body["created"]) == ["Nightly", "build", "test"]
    assert body["modified"] == body["deleted"] == []
    live = tree(api)
    assert live["build"]["depth"] == 1
    assert live["Nightly"]["timer"] == "daily 02:00"
    detail = api.client.get(f"{V1}/jobs/build", headers=api.headers()).json()
    assert detail["updated_by"] == "admin-user"
    entry = list_entries(api.jc.store, limit=1)[0]
    assert (entry.operation, str(entry.result)) == ("definitions.load", "ok")
    assert entry.detail.startswith("nightly.yaml")

    # Loading again changes what differs; with replace, what the file dropped goes.
    smaller = TREE.replace("make test", "make check").rsplit("      - name: test", 1)[0]
    again = load(api, smaller + "      - name: test\n        command: make check\n")
    assert again.status_code == 200, again.text
    assert again.json()["created"] == {}
    replaced = load(api, TREE.split("      - name: test")[0], replace=True)
    assert replaced.status_code == 200, replaced.text
    assert len(replaced.json()["deleted"]) == 1
    assert "test" not in tree(api)


def test_a_bad_file_is_refused_whole_with_its_line(api: Api) -> None:
    bad = TREE + "  - name: Broken\n    timer: every fortnight\n"
    answer = load(api, bad)
    assert answer.status_code == 422, answer.text
    body = answer.json()
    assert body["message"].startswith("nightly.yaml:10: "), body
    assert body["line"] == 10  # the timer's line
    assert tree(api) == {}, "nothing of a refused file is written"


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_only_an_admin_may_load(api: Api, role: str) -> None:
    answer = load(api, TREE, role=role)
    assert answer.status_code == 403, answer.text
    assert "may not" in answer.json()["message"]
    assert tree(api) == {}


def test_unknown_fields_and_missing_text_are_refused(api: Api) -> None:
    for body in ({"source": "x"}, {"text": TREE, "force": True}, {"text": 5}):
        answer = api.client.post(f"{V1}/definitions", headers=api.headers(), json=body)
        assert answer.status_code == 422, (body, answer.text)
    assert tree(api) == {}


def test_export_is_yaml_of_every_tree_or_one_sub_tree(api: Api) -> None:
    assert load(api, TREE).status_code == 200
    whole = api.client.get(f"{V1}/definitions", headers=api.headers("viewer"))
    assert whole.status_code == 200, whole.text
    assert whole.headers["content-type"].startswith("text/yaml")
    names = [d.name for d in parse_definitions(whole.text)]
    assert names == ["Nightly"]
    one = api.client.get(f"{V1}/definitions", params={"job": "build"}, headers=api.headers())
    assert [d.name for d in parse_definitions(one.text)] == ["build"]
    assert "make" in one.text
    unknown = api.client.get(f"{V1}/definitions", params={"job": "nope"}, headers=api.headers())
    assert unknown.status_code == 404
    assert "nope" in unknown.json()["message"]
    assert api.client.get(f"{V1}/definitions").status_code == 401


def test_a_replace_counts_every_job_it_deleted(api: Api) -> None:
    """A box dropped with its child said "1 deleted": the sub-trees, not the jobs."""
    extra = "      - name: Extra\n        children:\n          - name: sub\n            command: 'true'\n"
    two = TREE + extra
    assert load(api, two).status_code == 200
    replaced = load(api, TREE, replace=True)
    assert replaced.status_code == 200, replaced.text
    assert replaced.json()["deleted_jobs"] == 2
    assert len(replaced.json()["deleted"]) == 1  # one sub-tree's root
    [entry] = list_entries(api.jc.store, limit=1)
    assert entry.detail.endswith("0 created, 0 modified, 2 deleted")
