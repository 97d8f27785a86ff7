"""The dashboard's workflow pages (issue 57) through the WSGI test client, on the real
server with an in-process worker: the list (newest first, by state), a workflow's page
with its tree of chains, groups and steps, a failed one's failed and skipped steps,
cancelling a running one (confirmed, CSRF-checked, refused read-only), and an unknown id."""

from __future__ import annotations

import html
import re
import threading
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any

import dramatiq
import pytest

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson.dashboard import make_app
from dramatiq_redisson.workflows import chain, group
from tests.helpers import wait_for
from tests.wsgi_client import Client, Response

pytestmark = pytest.mark.usefixtures("worker")

HOUR = 3_600_000


@pytest.fixture
def client(broker: RedissonBroker) -> Client:
    return Client(make_app(broker))


@pytest.fixture
def steps(broker: RedissonBroker) -> dict[str, Any]:
    @dramatiq.actor(max_retries=0)
    def add(*args: Any) -> int:
        return sum(a if isinstance(a, int) else sum(x or 0 for x in a) for a in args)

    @dramatiq.actor(max_retries=0, queue_name="reports")
    def report(*args: Any) -> list[Any]:
        return list(args)

    @dramatiq.actor(max_retries=0)
    def boom(*args: Any) -> None:
        raise RuntimeError("boom")

    return {"add": add, "report": report, "boom": boom}


@dataclass
class Node:
    """A node of the page's tree: its kind, path and state, its fields' text, its members."""

    kind: str
    path: str
    state: str
    fields: dict[str, str] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    children: list[Node] = field(default_factory=list)


class _TreeParser(HTMLParser):
    """The ``data-kind`` boxes of a page, nested as the HTML nests them, with the text of
    each ``data-field`` that belongs to the box itself (not to a member's box)."""

    VOID = {"br", "input", "img", "meta", "link", "hr"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.roots: list[Node] = []
        # Open elements: (tag, the node it opens or None, the field it opens or None)
        self.stack: list[tuple[str, Node | None, str | None]] = []

    def _node(self) -> Node | None:
        return next((node for _, node, _ in reversed(self.stack) if node is not None), None)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {name: value or "" for name, value in attrs}
        parent = self._node()
        node = None
        if "data-kind" in attributes:
            node = Node(attributes["data-kind"], attributes["data-path"], attributes["data-state"])
            (parent.children if parent is not None else self.roots).append(node)
        name = attributes.get("data-field")
        owner = node or parent
        if name and owner is not None and node is None:
            owner.fields.setdefault(name, "")
        if tag == "a" and owner is not None:
            open_field = self._field()
            if open_field:
                owner.links[open_field] = attributes.get("href", "")
        if tag not in self.VOID:
            self.stack.append((tag, node, name if node is None else None))

    def _field(self) -> str | None:
        for _, node, name in reversed(self.stack):
            if node is not None:
                return None
            if name is not None:
                return name
        return None

    def handle_endtag(self, tag: str) -> None:
        while self.stack:
            open_tag, _, _ = self.stack.pop()
            if open_tag == tag:
                break

    def handle_data(self, data: str) -> None:
        name, owner = self._field(), self._node()
        if name and owner is not None:
            owner.fields[name] += data


def tree_of(page: Response) -> Node:
    found = re.search(r'<div class="wf-tree" id="tree">(.*?)</div>\s*<footer', page.text, re.S)
    assert found, page.text
    parser = _TreeParser()
    parser.feed(found.group(1))
    assert len(parser.roots) == 1
    return parser.roots[0]


def text(node: Node, name: str) -> str:
    return " ".join(node.fields[name].split())


def list_rows(page: Response) -> list[tuple[str, str, str]]:
    """(id, state, steps) of the list's rows, in order."""
    rows = re.findall(r'<tr data-id="([^"]+)">(.*?)</tr>', page.text, re.S)
    out = []
    for workflow_id, row in rows:
        cells = dict(re.findall(r'data-field="(\w+)">(.*?)</td>', row, re.S))
        out.append((workflow_id, re.sub(r"<[^>]+>", "", cells["state"]).strip(), cells["steps"].strip()))
    return out


def confirmed_form(page: Response) -> dict[str, list[str]]:
    """The hidden fields of a confirmation page's form, to post it as its button would."""
    form: dict[str, list[str]] = {}
    for name, value in re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', page.text):
        form.setdefault(name, []).append(html.unescape(value))
    return form


# -- the list ------------------------------------------------------------------------------


def test_the_list_shows_the_newest_workflows_first_and_filters_by_state(
    broker: RedissonBroker, client: Client, steps: dict[str, Any]
) -> None:
    add, boom = steps["add"], steps["boom"]
    # Given no workflow, the list says so, and the navigation links to it
    empty = client.get("/workflows")
    assert empty.status == 200 and 'id="empty"' in empty.text
    assert '<a href="/workflows">Workflows</a>' in client.get("/").text

    # Given a done, a failed and a running workflow, in that order
    done = chain(add.message(1), add.message(2)).run()
    assert done.wait(timeout=20).state == "done"
    failed = chain(boom.message(), add.message(3)).run()
    assert failed.wait(timeout=20).state == "failed"
    running = group([add.message_with_options(args=(4,), delay=HOUR), add.message(5)]).run()

    # When the list is opened, then it shows them newest first, with state and steps
    page = client.get("/workflows")
    assert page.status == 200
    assert list_rows(page) == [(running.id, "running", "2"), (failed.id, "failed", "2"), (done.id, "done", "2")]
    assert f'href="/workflows/{done.id}"' in page.text
    assert 'class="badge state-failed"' in page.text

    # And filtered by state, only those in it; an unknown state or size is a 400
    assert list_rows(client.get("/workflows?state=failed")) == [(failed.id, "failed", "2")]
    assert [row[0] for row in list_rows(client.get("/workflows?state=running&n=200"))] == [running.id]
    assert 'id="empty"' in client.get("/workflows?state=cancelled").text
    assert client.get("/workflows?state=exploded").status == 400
    assert client.get("/workflows?n=7").status == 400
    broker.workflows.cancel(running.id)


# -- one workflow ----------------------------------------------------------------------------


def test_a_done_workflows_page_draws_its_tree_with_a_group_inside_the_chain(
    broker: RedissonBroker, client: Client, steps: dict[str, Any]
) -> None:
    add, report = steps["add"], steps["report"]
    # Given a done chain: a step, a group of two (on_failure=continue), a step on another queue
    run = chain(add.message(1), group([add.message(10), add.message(20)], on_failure="continue"), report.message())
    workflow = run.run()
    state = workflow.wait(timeout=20)
    assert state.state == "done"

    # When its page is opened
    page = client.get(f"/workflows/{workflow.id}")

    # Then it shows its state, created and finished times, and result
    assert page.status == 200
    assert re.search(r'id="workflow-state"><span class="badge state-done">done</span>', page.text)
    assert re.search(r'data-field="finished"><time datetime="[^"]+Z"', page.text)
    result = re.search(r'<pre id="result">(.*?)</pre>', page.text, re.S)
    assert result and [int(n) for n in re.findall(r"\d+", result.group(1))] == [11, 21]
    assert 'id="cancel"' not in page.text  # a finished workflow has no Cancel

    # And its tree: the chain, its members in order, the group nested in it with its policy
    root = tree_of(page)
    assert (root.kind, root.path, root.state) == ("chain", "", "done")
    assert [(c.kind, c.path) for c in root.children] == [("step", "0"), ("group", "1"), ("step", "2")]
    inner = root.children[1]
    assert inner.state == "done" and text(inner, "on-failure") == "on_failure=continue"
    assert [(c.kind, c.path, c.state) for c in inner.children] == [("step", "1.0", "done"), ("step", "1.1", "done")]

    # And each step its actor, queue, state, message id and times
    shown = {node.path: node for node in (root.children[0], *inner.children, root.children[2])}
    for step in state.steps:
        node = shown[step.path]
        assert node.state == "done"
        assert text(node, "actor") == step.actor
        assert text(node, "queue") == step.queue
        assert text(node, "message-id") == step.message_id
        for name in ("sent", "started", "finished"):
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \+\S+", text(node, name)), (name, node.fields)
    assert text(shown["2"], "queue") == "reports"


def test_a_failed_workflows_page_shows_the_failed_and_the_skipped_steps(
    broker: RedissonBroker, client: Client, steps: dict[str, Any]
) -> None:
    add, boom = steps["add"], steps["boom"]
    # Given a chain whose second step fails for good
    workflow = chain(add.message(1), boom.message(), add.message(2)).run()
    state = workflow.wait(timeout=20)
    assert state.state == "failed"

    # When its page is opened
    page = client.get(f"/workflows/{workflow.id}")

    # Then the workflow is failed, with no result; the first step done, the second failed,
    # the third skipped and never sent
    assert re.search(r'id="workflow-state"><span class="badge state-failed">failed</span>', page.text)
    assert 'id="result"' not in page.text
    root = tree_of(page)
    assert root.state == "failed"
    assert [(c.path, c.state) for c in root.children] == [("0", "done"), ("1", "failed"), ("2", "skipped")]
    assert 'class="badge state-skipped">skipped<' in page.text
    skipped = root.children[2]
    assert [text(skipped, name) for name in ("sent", "started", "finished")] == ["—", "—", "—"]
    assert text(skipped, "actor") == "add"

    # And the failed step's message id opens its dead letter, which shows the error
    failed = root.children[1]
    assert text(failed, "message-id") == state.steps[1].message_id
    link = failed.links["message-id"]
    assert link == f"/queues/default/dead/{state.steps[1].message_id}"
    assert wait_for(lambda: broker.dead_letters("default").size() == 1)
    letter = client.get(link)
    assert letter.status == 200 and "RuntimeError: boom" in letter.text


def test_cancel_a_running_workflow_through_the_confirmation(
    broker: RedissonBroker, client: Client, steps: dict[str, Any]
) -> None:
    add = steps["add"]
    # Given a running workflow whose first step is scheduled an hour out
    workflow = chain(add.message_with_options(args=(1,), delay=HOUR), add.message(2)).run()
    page = client.get(f"/workflows/{workflow.id}")
    root = tree_of(page)
    assert root.state == "running"
    assert [(c.path, c.state) for c in root.children] == [("0", "sent"), ("1", "waiting")]
    first = root.children[0]
    assert text(first, "delay") == "delay 1h"
    # its message id opens the scheduled message's page
    assert client.get(first.links["message-id"]).status == 200
    assert 'id="cancel"' in page.text

    # When "Cancel workflow…" is posted, a confirmation page asks first, and nothing changes
    token = client.token(f"/workflows/{workflow.id}")
    here = f"/workflows/{workflow.id}?refresh=5"
    ask = client.post(f"/workflows/{workflow.id}/cancel", {"csrf": token, "next": here})
    assert ask.status == 200
    question = re.search(r'<p id="question">(.*?)</p>', ask.text, re.S)
    assert question, ask.text
    assert html.unescape(question.group(1)) == (
        f"Cancel workflow {workflow.id}? Its 2 steps not started never run (scheduled ones leave their delayed "
        "queue, queued ones are skipped when a worker takes them)."
    )
    assert ">Yes, cancel</button>" in ask.text and 'class="primary danger"' in ask.text
    assert broker.workflows.get(workflow.id).state == "running"  # type: ignore[union-attr]

    # And without a valid token, or from a read-only dashboard, it is refused
    assert client.post(f"/workflows/{workflow.id}/cancel", {"confirmed": "yes"}).status == 403
    read_only = Client(make_app(broker, read_only=True))
    assert 'id="cancel"' not in read_only.get(f"/workflows/{workflow.id}").text
    refused = read_only.post(f"/workflows/{workflow.id}/cancel", {"csrf": "x", "confirmed": "yes"})
    assert refused.status == 403 and "read-only" in refused.text
    assert broker.workflows.get(workflow.id).state == "running"  # type: ignore[union-attr]

    # When confirmed, then it is cancelled, back on the page it came from
    done = client.post(f"/workflows/{workflow.id}/cancel", confirmed_form(ask))
    assert done.status == 303
    path, query = done.location()
    assert (path, query["refresh"], query["flash"]) == (
        f"/workflows/{workflow.id}",
        "5",
        f"Workflow {workflow.id} cancelled.",
    )
    assert broker.workflows.get(workflow.id).state == "cancelled"  # type: ignore[union-attr]
    assert broker.delayed_queue("default").count() == 0

    # And the page shows it cancelled, its steps cancelled, without the button
    page = client.get(f"/workflows/{workflow.id}")
    assert re.search(r'id="workflow-state"><span class="badge state-cancelled">cancelled</span>', page.text)
    assert [c.state for c in tree_of(page).children] == ["cancelled", "cancelled"]
    assert 'id="cancel"' not in page.text

    # Cancelling it again does nothing, and says so
    again = client.post(f"/workflows/{workflow.id}/cancel", {"csrf": token})
    assert again.location()[1]["flash"] == f"Workflow {workflow.id} is cancelled already: nothing done."
    again = client.post(f"/workflows/{workflow.id}/cancel", {"csrf": token, "confirmed": "yes"})
    assert again.location()[1]["flash"] == f"Workflow {workflow.id} had finished: nothing done."


def test_a_running_step_shows_when_it_started_and_links_to_the_running_page(
    broker: RedissonBroker, client: Client, steps: dict[str, Any]
) -> None:
    release = threading.Event()

    @dramatiq.actor(max_retries=0)
    def hold(*args: Any) -> None:
        release.wait(20)

    # Given a workflow whose first step a worker runs now
    workflow = chain(hold.message(), steps["add"].message_with_options(args=(1,), pipe_ignore=True)).run()
    try:
        assert wait_for(lambda: len(broker.running("default")) == 1)
        page = client.get(f"/workflows/{workflow.id}")

        # Then the step is running, with when it started and not finished; its id links to Running
        first, second = tree_of(page).children
        assert (first.state, second.state) == ("running", "waiting")
        assert re.fullmatch(r"\S+Z \+\S+", text(first, "started")) and text(first, "finished") == "—"
        assert first.links["message-id"] == "/running?queue=default"
        assert f'data-id="{first.fields["message-id"].strip()}"' in client.get(first.links["message-id"]).text

        # And cancelling it says the running step finishes
        token = client.token(f"/workflows/{workflow.id}")
        ask = client.post(f"/workflows/{workflow.id}/cancel", {"csrf": token})
        assert "Its 1 step not started never run" in ask.text
        assert "The steps running now (1) finish; nothing after them is sent." in ask.text
    finally:
        release.set()
    assert workflow.wait(timeout=20).state == "done"


def test_an_unknown_workflow_is_a_404(broker: RedissonBroker, client: Client, steps: dict[str, Any]) -> None:
    page = client.get("/workflows/no-such-workflow")
    assert page.status == 404
    assert "No workflow &#39;no-such-workflow&#39; in namespace" in page.text and 'id="error"' in page.text
    # (a running workflow's page has a form, hence the CSRF token)
    running = chain(steps["add"].message_with_options(args=(1,), delay=HOUR)).run()
    token = client.token(f"/workflows/{running.id}")
    assert client.post("/workflows/no-such-workflow/cancel", {"csrf": token}).status == 404
    assert client.post("/workflows/no-such-workflow/cancel", {"csrf": token, "confirmed": "yes"}).status == 404
    refused = client.get("/workflows/no-such-workflow/cancel")
    assert refused.status == 405 and refused.headers["Allow"] == "POST"
    assert broker.workflows.cancel(running.id)
