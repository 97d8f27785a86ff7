"""``dramatiq-redisson workflows``: list, show and cancel, run as a subprocess against the
real server, in table and ``--json`` form, with workflows run by a worker of this process."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
from dramatiq import Worker

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson.workflows import Workflow, WorkflowState, chain, group
from tests.cli.test_cli import Run, assert_one_line_error, cli_runner, iso_ms, ok_json

#: How long ago, as the tables say it ("850ms ago", "3m 20s ago").
AGO = r"(?:\S+ )?\S+ ago"

#: The ISO 8601 twins ``--json`` adds to the times of ``WorkflowState.as_dict()``.
ISO_TWINS = ("created", "finished", "sent", "started")


@pytest.fixture
def cli(redis_url: str) -> Run:
    return cli_runner(redis_url)


@pytest.fixture
def actors(broker: RedissonBroker, worker: Worker) -> Iterator[dict[str, Any]]:
    """``add`` sums its arguments, ``boom`` fails for good; a worker of this process runs them."""

    @dramatiq.actor(max_retries=0)
    def add(*args: Any) -> int:
        return sum(arg for arg in args if isinstance(arg, int))

    @dramatiq.actor(max_retries=0)
    def boom(*args: Any) -> None:
        raise RuntimeError("boom")

    yield {"add": add, "boom": boom}


def finished(run: Workflow, state: str) -> WorkflowState:
    result = run.wait(timeout=20)
    assert result.state == state, result
    return result


def later(actor: Any, *args: Any) -> Any:
    """A step scheduled an hour after it is sent: its workflow stays running."""
    return actor.message_with_options(args=args, delay=3_600_000)


def without_iso_twins(document: Any) -> Any:
    """``document`` without the ISO strings ``--json`` adds beside each ``*_ms`` time."""
    if isinstance(document, list):
        return [without_iso_twins(item) for item in document]
    if not isinstance(document, dict):
        return document
    return {
        key: value if key == "result" else without_iso_twins(value)
        for key, value in document.items()
        if not (key in ISO_TWINS and f"{key}_ms" in document)
    }


def iso_twins_match(document: Any) -> bool:
    """Each ISO string ``--json`` adds is its ``*_ms`` time, at every depth."""
    if isinstance(document, list):
        return all(iso_twins_match(item) for item in document)
    if not isinstance(document, dict):
        return True
    for key in ISO_TWINS:
        if f"{key}_ms" in document:
            ms = document[f"{key}_ms"]
            if document.get(key, "missing") != (None if ms is None else iso_ms(ms)):
                return False
    return all(iso_twins_match(value) for key, value in document.items() if key != "result")


def rows(stdout: str) -> dict[str, str]:
    """The rows of a table, by the text of their first column (the id or the path)."""
    return {line.split()[0]: line for line in stdout.splitlines() if line.strip() and not line.startswith(" ")}


def node_cell(stdout: str, path: str) -> str:
    """The ``node`` cell of a tree row, its indentation kept (from where the header's
    ``node`` starts to the next double space after the text)."""
    lines = stdout.splitlines()
    start = next(line for line in lines if line.startswith("path")).index("node")
    line = rows(stdout)[path]
    cell = line[start:]
    text = cell.lstrip(" ")
    return cell[: len(cell) - len(text)] + re.split(r"\s{2,}", text)[0]


# -- list --------------------------------------------------------------------------------


def test_workflows_list_newest_first_in_json_and_tables(
    cli: Run, actors: dict[str, Any], broker: RedissonBroker
) -> None:
    add, boom = actors["add"], actors["boom"]
    # Given two workflows done, one failed and one running (its step waits an hour)
    done_one = finished(chain(add.message(1), add.message(2)).run(), "done")
    done_two = finished(chain(group([add.message(1), add.message(2), add.message(3)])).run(), "done")
    failed = finished(chain(add.message(1), boom.message()).run(), "failed")
    running = group([later(add, 1)]).run()
    newest_first = [running.id, failed.id, done_two.id, done_one.id]

    # When they are listed as JSON: one dict each, newest first, with each time as ISO too
    listed = ok_json(cli("workflows", "list", "--json"))
    assert [doc["id"] for doc in listed] == newest_first
    assert [(doc["state"], doc["steps"]) for doc in listed] == [("running", 1), ("failed", 2), ("done", 3), ("done", 2)]
    assert all(
        set(doc) == {"id", "state", "steps", "created_ms", "created", "finished_ms", "finished"} for doc in listed
    )
    assert iso_twins_match(listed)
    kept = {summary.id: summary for summary in broker.workflows.list()}
    assert [(doc["created_ms"], doc["finished_ms"]) for doc in listed] == [
        (kept[i].created_ms, kept[i].finished_ms) for i in newest_first
    ]
    assert listed[0]["finished_ms"] is None and listed[1]["finished_ms"] is not None
    # and `workflows` alone is `workflows list`; --state and --limit filter
    assert [doc["id"] for doc in ok_json(cli("workflows", "--json"))] == newest_first
    assert [doc["id"] for doc in ok_json(cli("workflows", "list", "--state", "failed", "--json"))] == [failed.id]
    assert [doc["id"] for doc in ok_json(cli("workflows", "list", "--state", "done", "--json"))] == newest_first[2:]
    assert [doc["id"] for doc in ok_json(cli("workflows", "list", "--limit", "2", "--json"))] == newest_first[:2]
    assert [doc["id"] for doc in ok_json(cli("workflows", "list", "--limit", "0", "--json"))] == newest_first
    assert ok_json(cli("workflows", "list", "--state", "cancelled", "--json")) == []

    # Then the tables (rich, and --plain) have one row per workflow, newest first
    for plain in ((), ("--plain",)):
        result = cli("workflows", "list", *plain)
        assert result.returncode == 0 and result.stderr == "", result.stderr
        lines = result.stdout.splitlines()
        assert lines[0].startswith("Workflows: 4, newest first · server time ")
        table = rows(result.stdout)
        assert [key for key in table if key in newest_first] == newest_first
        assert re.search(rf"^\S+\s+running\s+1\s+\S+Z\s+{AGO}\s+-\s+-$", table[running.id])
        assert re.search(rf"^\S+\s+failed\s+2\s+\S+Z\s+{AGO}\s+\S+Z\s+\d+(ms|s)$", table[failed.id])
        created = iso_ms(kept[done_two.id].created_ms)[:19] + "Z"
        assert re.search(rf"^\S+\s+done\s+3\s+{re.escape(created)}\s", table[done_two.id])
    limited = cli("workflows", "list", "--limit", "1")
    assert list(rows(limited.stdout))[-2:] == [running.id, "Showing"]
    assert "--limit 0 lists all" in limited.stdout
    empty = cli("workflows", "list", "--state", "cancelled")
    assert empty.returncode == 0 and "No cancelled workflows." in empty.stdout
    assert_one_line_error(cli("workflows", "list", "--state", "lost"), 2, "--state", "invalid choice")


# -- show --------------------------------------------------------------------------------


def test_workflows_show_json_is_the_state_with_iso_times(
    cli: Run, actors: dict[str, Any], broker: RedissonBroker
) -> None:
    add = actors["add"]
    run = chain(
        add.message(1), group([add.message(2), add.message_with_options(args=(3,), delay=200)], on_failure="continue")
    ).run()
    state = finished(run, "done")
    document = ok_json(cli("workflows", "show", run.id, "--json"))
    # WorkflowState.as_dict(), and each time also as ISO 8601
    assert without_iso_twins(document) == state.as_dict()
    assert iso_twins_match(document)
    assert document["created"] == iso_ms(state.created_ms) and document["result"] == [3, 4]
    assert [step["sent"] is not None for step in document["steps"]] == [True, True, True]
    # (--json is taken before the command too)
    assert ok_json(cli("--json", "workflows", "show", run.id)) == document


def test_workflows_show_draws_the_tree_indented_by_depth(cli: Run, actors: dict[str, Any]) -> None:
    add = actors["add"]
    # Given a chain of a step and a group (continue) of a step and a chain of two
    run = chain(
        add.message(1),
        group(
            [add.message(2), chain(add.message(3), add.message_with_options(args=(4,), delay=200))],
            on_failure="continue",
        ),
    ).run()
    state = finished(run, "done")
    ids = {step.path: step.message_id for step in state.steps}
    for plain in ((), ("--plain",)):
        result = cli("workflows", "show", run.id, *plain)
        assert result.returncode == 0 and result.stderr == "", result.stderr
        text = result.stdout
        # Then the header has the workflow's fields
        assert text.splitlines()[0].startswith(f"Workflow {run.id}: done · server time ")
        assert re.search(rf"^  created\s+{re.escape(iso_ms(state.created_ms)[:19])}Z \({AGO}\)$", text, re.M)
        assert re.search(rf"^  finished\s+\S+Z \({AGO}, after \d+(ms|s)\)$", text, re.M)
        assert re.search(r"^  steps\s+4: 4 done$", text, re.M)
        assert re.search(r"^  result\s+\[3, 8\]$", text, re.M), text
        # and the tree, one row per node, each indented by its depth
        table = rows(text)
        assert [node_cell(text, path) for path in ("-", "0", "1", "1.0", "1.1", "1.1.0", "1.1.1")] == [
            "chain",
            "  add",
            "  group (on_failure=continue)",
            "    add",
            "    chain",
            "      add",
            "      add",
        ]
        for path, message_id in ids.items():
            assert re.search(
                rf"add\s+done\s+default\s+{message_id}\s+{AGO}(?: \(delay 200ms\))?"
                rf"\s+{AGO}\s+{AGO} \(took \d+(ms|s)\)$",
                table[path],
            ), table[path]
        assert re.search(rf"{AGO} \(delay 200ms\)\s+{AGO}", table["1.1.1"])
        assert re.search(rf"group \(on_failure=continue\)\s+done\s+{AGO}$", table["1"])


def test_workflows_show_a_failed_workflow_with_its_failed_and_skipped_steps(cli: Run, actors: dict[str, Any]) -> None:
    add, boom = actors["add"], actors["boom"]
    # Given a group whose second member fails, before a step that is then never sent
    run = chain(group([add.message(1), boom.message()]), add.message(2)).run()
    state = finished(run, "failed")
    by_path = {step.path: step for step in state.steps}

    document = ok_json(cli("workflows", "show", run.id, "--json"))
    assert document["state"] == "failed" and document["result"] is None
    assert [(s["path"], s["state"]) for s in document["steps"]] == [
        ("0.0", "done"),
        ("0.1", "failed"),
        ("1", "skipped"),
    ]
    assert document["steps"][2]["sent_ms"] is None and document["steps"][2]["sent"] is None

    result = cli("workflows", "show", run.id, "--plain")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert text.splitlines()[0].startswith(f"Workflow {run.id}: failed")
    assert re.search(r"^  steps\s+3: 1 done, 1 failed, 1 skipped$", text, re.M)
    assert re.search(r"^  result\s+-$", text, re.M)
    table = rows(text)
    assert re.search(rf"chain\s+failed\s+{AGO}$", table["-"])
    assert re.search(rf"group \(on_failure=fail\)\s+failed\s+{AGO}$", table["0"])
    assert re.search(
        rf"boom\s+failed\s+default\s+{by_path['0.1'].message_id}\s+{AGO}\s+{AGO}\s+{AGO}",
        table["0.1"],
    )
    assert re.search(rf"add\s+skipped\s+default\s+{by_path['1'].message_id}\s+-\s+-\s+-$", table["1"])
    # and it says where the failed step's traceback is; that command finds it
    hint = f"dramatiq-redisson dead show default {by_path['0.1'].message_id}"
    assert text.rstrip().endswith(hint)
    dead = ok_json(cli("dead", "show", "default", by_path["0.1"].message_id, "--json"))
    assert dead["found"] is True and dead["message"]["actor_name"] == "boom"


# -- cancel ------------------------------------------------------------------------------


def test_workflows_cancel_says_whether_it_cancelled_or_had_finished(
    cli: Run, actors: dict[str, Any], broker: RedissonBroker
) -> None:
    add = actors["add"]
    # Given two running workflows whose steps wait an hour
    first = group([later(add, 1), later(add, 2)]).run()
    second = chain(later(add, 3), add.message(4)).run()
    assert broker.delayed_queue("default").count() == 3

    # When the first is cancelled: its scheduled steps leave their queue
    result = cli("workflows", "cancel", first.id)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout.startswith(f"cancelled workflow {first.id}: ")
    state = first.get()
    assert state is not None and state.state == "cancelled"
    assert [step.state for step in state.steps] == ["cancelled", "cancelled"]
    assert broker.delayed_queue("default").count() == 1
    # and again: it had finished, nothing changes (exit 0)
    again = cli("workflows", "cancel", first.id)
    assert again.returncode == 0
    assert again.stdout == f"workflow {first.id} had already finished (cancelled): nothing changed\n"
    assert ok_json(cli("workflows", "cancel", first.id, "--json")) == {
        "id": first.id,
        "found": True,
        "cancelled": False,
        "state": "cancelled",
    }

    # Then --json says so for the second too
    assert ok_json(cli("workflows", "cancel", second.id, "--json")) == {
        "id": second.id,
        "found": True,
        "cancelled": True,
        "state": "cancelled",
    }
    assert broker.delayed_queue("default").count() == 0
    assert ok_json(cli("workflows", "list", "--state", "cancelled", "--json"))[0]["id"] == second.id


def test_workflows_cancel_of_a_done_workflow_changes_nothing(cli: Run, actors: dict[str, Any]) -> None:
    run = chain(actors["add"].message(1)).run()
    finished(run, "done")
    assert ok_json(cli("workflows", "cancel", run.id, "--json"))["cancelled"] is False
    assert "had already finished (done)" in cli("workflows", "cancel", run.id).stdout
    state = run.get()
    assert state is not None and state.state == "done"


def test_workflows_show_and_cancel_of_an_unknown_id_exit_1(cli: Run, broker: RedissonBroker) -> None:
    for action in ("show", "cancel"):
        result = cli("workflows", action, "no-such-workflow")
        assert result.stdout == ""
        assert_one_line_error(result, 1, "no workflow no-such-workflow", "workflows list")
    shown = cli("workflows", "show", "no-such-workflow", "--json")
    assert shown.returncode == 1
    assert json_on_stdout(shown) == {"id": "no-such-workflow", "found": False}
    cancelled = cli("workflows", "cancel", "no-such-workflow", "--json")
    assert cancelled.returncode == 1
    assert json_on_stdout(cancelled) == {"id": "no-such-workflow", "found": False, "cancelled": False}
    assert_one_line_error(cli("workflows", "show"), 2, "the following arguments are required: ID")


def json_on_stdout(result: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(result.stdout)
