"""The broker's errors survive pickling with everything they carry (a worker process, a
result backend or a multiprocessing pool passes them on), and ``NotReplicated`` says what
happened in words an operator can act on."""

from __future__ import annotations

import pickle

import dramatiq
import pytest
import redis
from dramatiq import Message

from dramatiq_redisson import (
    EnqueueError,
    EnqueueNotReplicated,
    MissingPermission,
    NotReplicated,
    ServerMemoryFull,
    UnsupportedServer,
)


def _message(n: int) -> Message[object]:
    return Message(queue_name="default", actor_name="a", args=(n,), kwargs={}, options={})


def _errors() -> list[Exception]:
    a, b, c = _message(1), _message(2), _message(3)
    return [
        EnqueueError("some were not sent", enqueued=[a], failed=[b], unknown=[c]),
        ServerMemoryFull(
            "full", enqueued=[], failed=[a, b], unknown=[], queue_names=["default"], maxmemory=10, used_memory=11
        ),
        UnsupportedServer("too old", server="127.0.0.1:1", version=(6, 0, 9)),
        NotReplicated.describe("the ack", 0, 1, 500),
        EnqueueNotReplicated(
            "sent, not replicated", enqueued=[a], failed=[], unknown=[], replicas=None, wanted=2, timeout_ms=100
        ),
        MissingPermission("no", commands=["time"], keys=["k (read)"], channels=["ch"], unchecked=["evalsha"]),
    ]


@pytest.mark.parametrize("error", _errors(), ids=lambda e: type(e).__name__)
def test_an_error_round_trips_through_pickle_with_its_attributes(error: Exception) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert copy.args == error.args
    assert str(copy) == str(error)
    assert copy.__dict__ == error.__dict__
    assert copy.__dict__  # something was carried


def test_the_error_kinds_are_what_handlers_catch() -> None:
    errors = {type(e): e for e in _errors()}
    assert isinstance(errors[EnqueueNotReplicated], NotReplicated)
    assert isinstance(errors[EnqueueNotReplicated], EnqueueError)
    assert isinstance(errors[ServerMemoryFull], EnqueueError)
    assert isinstance(errors[NotReplicated], dramatiq.errors.BrokerError)
    assert isinstance(errors[MissingPermission], redis.exceptions.NoPermissionError)


@pytest.mark.parametrize(
    ("replicas", "said"), [(0, "but 0 of the 2 replica(s)"), (None, "but an unknown number of the 2 replica(s)")]
)
def test_not_replicated_names_what_went_through_how_many_replicas_and_that_repeating_is_safe(
    replicas: int | None, said: str
) -> None:
    error = NotReplicated.describe("The send", replicas, 2, 750)
    text = str(error)
    assert text.startswith("The send went through on the primary")
    assert said in text
    assert "within 750 ms (wait_timeout)" in text
    assert "doing it again is safe" in text
    assert (error.replicas, error.wanted, error.timeout_ms) == (replicas, 2, 750)
