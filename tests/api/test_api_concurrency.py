"""Twenty clients at once against one daemon: random edits, runs and kills.

Each client thread has its own TestClient (its own event loop) over the same
app, so requests really overlap in the handlers, the engine and the dispatcher.
Each makes a bounded number of requests within a bounded time; every answer
must be a 2xx or a 4xx of the API's error shape. Afterwards: the in-memory
tree equals the database, every batch modify was all-or-nothing, the tree state
is IDLE and every run row is final.

All-or-nothing is checked on what the dispatcher announced: each PATCH writes
a description no other request uses, so a ``jobs_modified`` signal carrying it
belongs to that one batch. An accepted batch must appear in exactly one signal
(one reaction), covering all its jobs, each one version up from the version
sent; a refused one must appear in none, nor in the database.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi.testclient import TestClient

from jobcontrol.model import RunState, TreeState
from tests.api.conftest import Api
from tests.integration.helpers import box, task

pytestmark = pytest.mark.timeout(120)
log = logging.getLogger(__name__)

V1 = "/api/v1"
CLIENTS = 20
OPS_PER_CLIENT = 25
TIME_BUDGET = 30.0  # seconds a client keeps starting requests
JOIN_TIMEOUT = 60.0  # a client still busy this long after the start has hung
SEED = [
    box("Top"),
    task("t1", "sleep 0.05", parent="Top", active=True),
    task("t2", "true", parent="Top", active=True),
    box("Inner", parent="Top"),
    task("t3", "sleep 0.05", parent="Inner", active=True),
    box("Other"),
    task("t4", "true", parent="Other", active=True),
    task("Solo", "sleep 0.05", active=True),
]


@dataclass
class Patch:
    """One PATCH sent: its unique description, the versions it sent, and the answer."""

    token: str
    versions: dict[int, int]  # job id -> version sent
    status: int = 0


@dataclass
class Outcomes:
    lock: threading.Lock = field(default_factory=threading.Lock)
    problems: list[str] = field(default_factory=list)
    patches: list[Patch] = field(default_factory=list)
    statuses: dict[str, list[int]] = field(default_factory=dict)
    in_flight: dict[int, str] = field(default_factory=dict)

    def answer(self, op: str, method: str, path: str, status: int, body: Any) -> None:
        with self.lock:
            self.statuses.setdefault(op, []).append(status)
            if 200 <= status < 300:
                return
            shaped = (
                isinstance(body, dict)
                and isinstance(body.get("error"), str)
                and isinstance(body.get("message"), str)
                and bool(body["message"])
            )
            if not 400 <= status < 500 or not shaped:
                self.problems.append(f"{method} {path} -> {status}: {body!r}")


class Client:
    """One of the twenty: random requests over its own TestClient."""

    def __init__(self, api: Api, index: int, out: Outcomes, start: threading.Barrier) -> None:
        self.api = api
        self.index = index
        self.out = out
        self.start = start
        self.rng = random.Random(index)  # the same choices every time the test runs
        self.headers = api.headers("admin")
        self.created: list[int] = []
        self.client: TestClient

    def request(self, op: str, method: str, path: str, json: Any = None) -> Any:
        with self.out.lock:
            self.out.in_flight[self.index] = f"{method} {path}"
        try:
            r = self.client.request(method, V1 + path, json=json, headers=self.headers)
        except Exception as exc:  # anything raised is a failed request, reported below
            with self.out.lock:
                self.out.problems.append(f"{method} {path} raised {exc!r}")
            return None, 0
        finally:
            with self.out.lock:
                self.out.in_flight.pop(self.index, None)
        try:
            body = r.json()
        except ValueError:
            body = r.text
        self.out.answer(op, method, path, r.status_code, body)
        return body, r.status_code

    def run(self) -> None:
        try:
            with TestClient(self.api.client.app, raise_server_exceptions=False) as self.client:
                self.start.wait(timeout=JOIN_TIMEOUT)
                deadline = time.monotonic() + TIME_BUDGET
                for i in range(OPS_PER_CLIENT):
                    if time.monotonic() > deadline:
                        break
                    self.one_op(i)
        except Exception as exc:  # a thread's failure must reach the test
            with self.out.lock:
                self.out.problems.append(f"client {self.index} failed: {exc!r}")

    def one_op(self, i: int) -> None:
        tree, _ = self.request("tree", "GET", "/tree")
        jobs = tree["jobs"] if isinstance(tree, dict) else []
        if not jobs:
            return
        op = self.rng.choices(
            ["create", "patch", "delete", "run", "run+kill", "kill"], [3, 4, 2, 3, 2, 1]
        )[0]
        if op == "create":
            self.create(i, jobs)
        elif op == "patch":
            self.patch(i, jobs)
        elif op == "delete":
            self.delete()
        else:
            target = self.rng.choice(jobs)["id"]
            if op != "kill":
                self.request("run", "POST", f"/jobs/{target}/run")
            if op != "run":
                self.request("kill", "POST", f"/jobs/{target}/kill")

    def create(self, i: int, jobs: list[dict[str, Any]]) -> None:
        boxes = [j["id"] for j in jobs if j["kind"] == "box"]
        body: dict[str, Any] = {"name": f"w{self.index}-{i}", "active": True}
        if self.rng.random() < 0.3:
            body["kind"] = "box"
        else:
            body |= {"kind": "task", "command": self.rng.choice(["true", "sleep 0.05"])}
        if boxes and self.rng.random() < 0.8:
            body["parent"] = self.rng.choice(boxes)
        created, status = self.request("create", "POST", "/jobs", body)
        if status == 201:
            self.created.append(created["id"])

    def patch(self, i: int, jobs: list[dict[str, Any]]) -> None:
        chosen = self.rng.sample(jobs, min(len(jobs), self.rng.randint(1, 4)))
        sent = Patch(f"patch {self.index}-{i}", {j["id"]: j["version"] for j in chosen})
        changes = [
            {
                "job": j["id"],
                "version": j["version"],
                "fields": {"description": sent.token, "priority": self.rng.randint(-5, 5)},
            }
            for j in chosen
        ]
        if self.rng.random() < 0.25:  # a version nobody has seen: the batch must be refused
            changes[-1]["version"] += 1000
        _, sent.status = self.request("patch", "PATCH", "/jobs", {"changes": changes})
        with self.out.lock:
            self.out.patches.append(sent)

    def delete(self) -> None:
        if not self.created:
            return
        victim = self.created.pop(self.rng.randrange(len(self.created)))
        self.request("delete", "POST", "/jobs/delete", {"jobs": [victim]})


def check_batches(api: Api, patches: list[Patch]) -> list[str]:
    """Each accepted batch in exactly one reaction, all its jobs a version up; refused ones nowhere."""
    announced: dict[str, list[list[Any]]] = {}
    for sig in api.jc.rec.signals("jobs_modified"):
        by_token: dict[str, list[Any]] = {}
        for rec in sig.data["jobs"]:
            by_token.setdefault(rec.description, []).append(rec)
        for token, recs in by_token.items():
            announced.setdefault(token, []).append(recs)
    stored = {j["description"] for j in api.jc.dump()["job"]}
    problems = []
    for p in patches:
        seen = announced.get(p.token, [])
        if p.status == 200:
            if len(seen) != 1:
                problems.append(f"{p.token}: accepted, announced in {len(seen)} reactions")
                continue
            got = {rec.id: rec.version for rec in seen[0]}
            want = {job_id: version + 1 for job_id, version in p.versions.items()}
            if got != want:
                problems.append(f"{p.token}: accepted, wrote {got}, expected {want}")
        elif seen or p.token in stored:
            problems.append(f"{p.token}: refused ({p.status}) yet written: {seen}")
    return problems


def test_twenty_clients_edit_run_and_kill_at_once(api: Api) -> None:
    api.jc.create(*SEED)
    out = Outcomes()
    start = threading.Barrier(CLIENTS)
    clients = [Client(api, i, out, start) for i in range(CLIENTS)]
    threads = [
        threading.Thread(target=c.run, name=f"client-{c.index}", daemon=True) for c in clients
    ]
    began = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, began + JOIN_TIMEOUT - time.monotonic()))
    hung = [t.name for t in threads if t.is_alive()]
    assert not hung, f"clients still waiting on a request: {hung}, in flight: {out.in_flight}"
    elapsed = time.monotonic() - began

    assert not out.problems, "\n".join(out.problems)
    answered = sum(len(s) for s in out.statuses.values())
    assert answered >= CLIENTS * 5, out.statuses  # the clients really got going
    # Both outcomes of a batch happened, and runs started (and some were killed).
    patch_statuses = {p.status for p in out.patches}
    assert 200 in patch_statuses, patch_statuses
    assert 409 in patch_statuses, patch_statuses
    assert 202 in out.statuses["run"], out.statuses["run"]
    assert 200 in out.statuses["kill"], out.statuses["kill"]

    api.jc.wait_quiet(fire_due_timers=True)
    api.jc.sync()
    api.jc.assert_tree_matches_db()
    assert api.jc.tree_state() is TreeState.IDLE
    runs = api.jc.dump()["run"]
    unfinished = [
        (r["id"], r["job_name"], r["state"]) for r in runs if not RunState(r["state"]).is_final
    ]
    assert not unfinished, unfinished
    assert not check_batches(api, out.patches)
    killed = [r for r in runs if r["state"] == RunState.KILLED]
    assert killed, "no kill reached a live run"
    log.info(
        "%d answers in %.1fs; %d batches %s; %d runs, %d killed",
        answered,
        elapsed,
        len(out.patches),
        sorted(patch_statuses),
        len(runs),
        len(killed),
    )
