"""Each script's KEYS list has one source: the ``-- KEYS[<n>]  <name>`` lines of its header
(``scripts/lua/<script>.lua``), each name a :class:`QueueKeys` attribute. The broker's lists
are made from it (``_keys.script_keys``); the one-script tests' lists are checked against it
on every call (``tests/scripts/lua/state.check_key_order``, run by their ``lua`` fixture);
here, every header is read, every list the script wrappers send is checked against it on
both layouts, and the check is shown to fail on a wrong order."""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Sequence
from importlib import resources
from typing import Any

import pytest
import redis

from dramatiq_redisson import _keys
from dramatiq_redisson._ids import next_sort_key
from dramatiq_redisson._keys import QueueKeys, key_slots, parse_key_slots, script_keys
from dramatiq_redisson.scripts._calls import _NAMES, IdleScore, Scripts, TransferResult
from dramatiq_redisson.scripts._contract import contract
from tests.scripts.lua.state import check_key_order, follows_header, key_name, key_names

SCRIPTS = sorted(
    p.name.removesuffix(".lua")
    for p in resources.files("dramatiq_redisson.scripts").joinpath("lua").iterdir()
    if p.name.endswith(".lua")
)

#: A queue of each layout, with a namespace and a name that a parser could mistake.
QUEUES = [QueueKeys("dramatiq", "default"), QueueKeys("ns:a", "q.DQ", cluster=True), QueueKeys("ns", "q-1.XQ")]


def groups_of(script: str) -> list[str]:
    return sorted({slot.group for slot in key_slots(script) if slot.group})


def given_choices(script: str) -> list[tuple[str, ...]]:
    alternatives = sorted({name for slot in key_slots(script) for name in slot.names[1:] if not slot.per_worker})
    groups = groups_of(script) + alternatives
    return [given for n in range(len(groups) + 1) for given in itertools.combinations(groups, n)]


def test_every_script_is_covered() -> None:
    assert len(SCRIPTS) >= 29
    assert set(_NAMES) <= set(SCRIPTS)
    for script in SCRIPTS:
        key_slots(script)  # raises on a header that does not declare its KEYS by the grammar
    assert key_slots("probe") == ()  # "-- KEYS none": its key names travel in ARGV


@pytest.mark.parametrize("queue", QUEUES, ids=repr)
def test_every_header_name_is_one_key_of_the_queue(queue: QueueKeys) -> None:
    names = key_names(queue)
    assert len(set(names.values())) == len(names)  # one attribute per key string: no two alike
    for script in SCRIPTS:
        for slot in key_slots(script):
            for name in slot.names:
                key = getattr(queue, name)("w.1") if name in ("acks", "legacy_dq_acks") else getattr(queue, name)
                assert isinstance(key, str), (script, name)
                assert key_name(queue, key) == name, (script, name, key)


@pytest.mark.parametrize("queue", QUEUES, ids=repr)
def test_the_lists_made_from_each_header_follow_it(queue: QueueKeys) -> None:
    for script in SCRIPTS:
        for given in given_choices(script):
            for workers in ((), ("w1",), ("w1", "w.2")):
                made = script_keys(script, queue, "w9", given, workers)
                check_key_order(script, made, queue)
                if script in ("maintenance", "reap") or not workers:
                    continue
                assert made == script_keys(script, queue, "w9", given)  # a tail only where declared


def test_a_swapped_order_fails_the_check() -> None:
    keys = QueueKeys("dramatiq", "default")
    transfer = list(_keys.transfer_keys(keys, "w1"))
    check_key_order("transfer", transfer, keys)
    swapped = [transfer[1], transfer[0], *transfer[2:]]
    with pytest.raises(AssertionError, match="transfer.lua's KEYS are not in its header's order"):
        check_key_order("transfer", swapped, keys)
    # A key left out, one too many, a key of another queue, an optional group half given.
    for wrong in (transfer[:5] + transfer[6:], [*transfer, keys.ready], transfer[:-1]):
        with pytest.raises(AssertionError):
            check_key_order("transfer", wrong, keys)
    other = QueueKeys("dramatiq", "other")
    with pytest.raises(AssertionError):
        check_key_order("count", [keys.timeout_zset, other.payloads], keys)
    assert not follows_header("ack", ["ready_msgs", "acks", "heartbeats", "fetched", "minutes", "hours"])
    assert follows_header("ack", ["acks", "ready_msgs", "heartbeats", "fetched", "minutes", "hours", "idle", "ready"])


HEADER = """-- demo: a made-up script.
--
-- KEYS[1]  timeout_zset  ZSET  the due times
-- KEYS[2]  payloads      HASH  their data
-- KEYS[3]  lane_of +lane HASH  optional
"""


def test_the_python_lists_are_made_from_the_header(monkeypatch: pytest.MonkeyPatch) -> None:
    keys = QueueKeys("dramatiq", "default")
    monkeypatch.setattr(_keys, "key_slots", lambda script: parse_key_slots(HEADER, script))
    assert script_keys("demo", keys) == (keys.timeout_zset, keys.payloads)
    assert script_keys("demo", keys, given=("lane",)) == (keys.timeout_zset, keys.payloads, keys.lane_of)
    swapped = HEADER.replace("timeout_zset  ZSET", "@").replace("payloads      HASH", "timeout_zset HASH")
    monkeypatch.setattr(_keys, "key_slots", lambda script: parse_key_slots(swapped.replace("@", "payloads ZSET")))
    assert script_keys("demo", keys) == (keys.payloads, keys.timeout_zset)


@pytest.mark.parametrize(
    "header",
    [
        HEADER.replace("KEYS[2]", "KEYS[3]"),  # numbered out of order
        HEADER.replace("KEYS[2]  payloads", "KEYS[2]  HASH"),  # no name
        HEADER + "-- KEYS[4..] acks\n-- KEYS[5]  ready\n",  # a key after the tail
        "-- demo: no keys declared.\n--\n-- ARGV[1]  something\n",
        HEADER + "-- KEYS none\n",
    ],
)
def test_a_header_off_the_grammar_is_refused(header: str) -> None:
    with pytest.raises(ValueError, match=r"demo\.lua"):
        parse_key_slots(header, "demo")


class Recording(Scripts):
    """Scripts whose runs are recorded: (script, its KEYS) of every call."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self.calls: list[tuple[str, tuple[str, ...]]] = []

    def _run(self, name: str, keys: Sequence[str], args: Sequence[Any], client: Any = None) -> Any:
        self.calls.append((name, tuple(keys)))
        return super()._run(name, keys, args, client)

    def _run_idempotent(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        self.calls.append((name, tuple(keys)))
        return super()._run_idempotent(name, keys, args)

    def _run_resending(self, name: str, keys: Sequence[str], args: Sequence[Any], client: Any = None) -> Any:
        self.calls.append((name, tuple(keys)))
        return super()._run_resending(name, keys, args, client)

    def stream(self, name: str, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]) -> list[Any]:
        self.calls.extend((name, tuple(keys)) for keys, _ in calls)
        return super().stream(name, calls)


def run_every_wrapper(scripts: Scripts, keys: QueueKeys) -> None:
    """Every script wrapper once, each of its key-list variants (groups given or not)."""
    entry = (1000, next_sort_key(), "m1", b"{}", "")
    scripts.offer(keys, [entry])
    scripts.offer(keys, [(1000, next_sort_key(), "m2", b"{}", "")], lanes=["1:"])
    scripts.offer_one(keys, 1000, next_sort_key(), "m3", b"{}", "sent")
    scripts.offer_calls([(keys, ["rel", 1000, next_sort_key(), "m4", b"{}", "", "", "", 0], False)])
    scripts.offer_calls([(keys, ["bulk", 1000, "m5", next_sort_key() + "{}"], False)])
    scripts.enqueue(keys, [("r1", b"{}")], 0)
    scripts.enqueue_bulk([(keys, [("r2", b"{}", "0:")])], 0)
    scripts.transfer(keys, limit=10, trim_budget=10, compact_step=10, compact_slack=10, worker_id="w1")
    scripts.fetch(keys, "w1", 2, "tok")
    scripts.ack(keys, "w1", "r1")
    scripts.ack(keys, "w1", "r1", uses_slots=True)
    scripts.ack(keys, "w1", "r1", idle=IdleScore("tok", 1, keys.wake_channel("tok")))
    scripts.ack(keys, "w1", "r1", uses_slots=True, idle=IdleScore("tok", 1, keys.wake_channel("tok")))
    scripts.ack(keys, "w1", "r1", done_retention=1000)
    scripts.ack(keys, "w1", "r1", uses_slots=True, idle=IdleScore("tok", 1, keys.wake_channel("tok")), done_retention=1)
    scripts.nack(keys, "w1", "r2")
    scripts.nack(keys, "w1", "r2", uses_slots=True)
    scripts.requeue(keys, "w1", ["r2"])
    scripts.maintenance(keys, ["w7", "w.8"], dead_message_ttl_ms=1000, expire_limit=10)
    scripts.bury_legacy(keys, [])
    scripts.peek(keys, "m1")
    scripts.reschedule(keys, "m1", "in", 10)
    scripts.count(keys, "all")
    scripts.bulk(keys, "promote", 10)
    scripts.scan(keys, 10, None)
    scripts.dead(keys, "remove", 10)
    scripts.stats(keys, 1000, 1000)
    scripts.limits(keys, "get")
    scripts.shards(keys, "read", 1000)
    scripts.pause(keys, "pause")
    scripts.pause(keys, "resume")
    scripts.history(keys, 1, 1)
    scripts.pending(keys)
    scripts.message_state(keys, "m1", 10)
    scripts.heartbeat(keys, "w1")
    scripts.beat(keys, "w1")
    scripts.reap(keys, ["w7"], ["w.8"], timeout_ms=1000, forget_ms=1000)
    scripts.schedule(keys, "check", "nightly")
    scripts.release(keys, "tok")
    scripts.cancel(keys, ["m1"])
    scripts.clear(keys)


@pytest.mark.parametrize("queue", QUEUES[:2], ids=repr)
def test_every_list_the_broker_sends_follows_its_header(redis_client: redis.Redis, queue: QueueKeys) -> None:
    scripts = Recording(redis_client)
    try:
        run_every_wrapper(scripts, queue)
    finally:
        scripts.close()
    for script, call_keys in scripts.calls:
        check_key_order(script, call_keys, queue)
    assert {script for script, _ in scripts.calls} == set(_NAMES)  # every script the broker runs


def test_the_transfer_reply_slots_are_named_once() -> None:
    """transfer.lua's 10-slot reply: its header's ``-- returns:`` line names the slots (read
    by the scripts' contract, which the wrapper reads the reply by), and
    :class:`TransferResult` takes them in that order."""
    slots = list(contract("transfer").returns)
    assert len(slots) == 10
    assert list(inspect.signature(TransferResult).parameters) == slots
