"""The hot consumer scripts as one function library (dramatiq_redisson.scripts._library):
built from the scripts' own text, called with FCALL where the server has functions (Redis
>= 7.0, Valkey), loaded again when it went missing, and EVALSHA where the server has none
(Redis 6.2); a function's own error is raised, never run a second time as EVALSHA."""

from __future__ import annotations

import dramatiq
import pytest
import redis

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson._ids import next_sort_key
from dramatiq_redisson.scripts import _runner
from dramatiq_redisson.scripts._library import FUNCTION_SCRIPTS, build_library


def _calls(client: redis.Redis, command: str) -> int:
    """Calls of ``command`` so far that ran to their reply (not an error: FCALL's
    "Function not found" before the library is loaded, a script's error reply)."""
    stats = client.info("commandstats").get(f"cmdstat_{command}", {})
    return int(stats.get("calls", 0)) - int(stats.get("failed_calls", 0))


def _attempts(client: redis.Redis, command: str) -> int:
    """Calls of ``command`` so far, failed ones too."""
    return int(client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def _libraries(client: redis.Redis) -> list[bytes]:
    return [dict(zip(entry[::2], entry[1::2], strict=True))[b"library_name"] for entry in client.function_list()]


def _life_cycle(broker: RedissonBroker, queue: str) -> None:
    """One delayed message offered, moved and handed off (transfer), then acked, and one
    immediate message fetched and acked: the three function scripts, called as the
    consumer calls them."""
    keys, scripts, worker = broker.keys(queue), broker.redisson_scripts, broker.broker_id
    message = dramatiq.Message(queue_name=queue, actor_name="a", args=(1,), kwargs={}, options={})
    assert scripts.offer_one(keys, 0, next_sort_key(), message.message_id, b'{"x":1}', "") > 0
    moved = scripts.transfer(
        keys, limit=10, trim_budget=10, compact_step=10, compact_slack=10, token="t", lease_ms=5000,
        own_slots=1, worker_id=worker, listening=True,
    )  # fmt: skip
    assert moved.moved == 1 and len(moved.fetched) == 1
    assert scripts.ack(keys, worker, moved.fetched[0][0]) == 1
    broker.enqueue(dramatiq.Message(queue_name=queue, actor_name="a", args=(2,), kwargs={}, options={}))
    fetched = scripts.fetch(keys, worker, 1)
    assert fetched is not None and len(fetched) == 1
    assert scripts.ack(keys, worker, fetched[0][0]) == 1


def test_the_library_is_made_from_the_scripts_text_and_named_after_it() -> None:
    # Given the library built twice
    first, second = build_library(), build_library()
    # Then it is the same text, one function per script, each named with the text's digest
    assert first == second
    assert first.source.startswith(f"#!lua name={first.name}\n".encode())
    digest = first.name.rsplit("_", 1)[1]
    assert first.functions == {name: f"dramatiq_redisson_{name}_{digest}" for name in FUNCTION_SCRIPTS}
    for function in first.functions.values():
        assert first.source.count(f"function_name = '{function}'".encode()) == 1
    assert first.source.count(b"flags = {'allow-oom'}") == len(FUNCTION_SCRIPTS)
    # And a change of text (a topology's) is another library, with other names
    converted = build_library(lambda text: text.replace(b'"PUBLISH"', b'"SPUBLISH"'))
    assert converted.name != first.name and b'"PUBLISH"' not in converted.source


def test_consumer_scripts_run_as_functions_where_the_server_has_them(
    broker: RedissonBroker, redis_client: redis.Redis, server_version: tuple[int, int, int]
) -> None:
    # Given a broker on the session's server
    fcalls = _calls(redis_client, "fcall")
    evalshas = _calls(redis_client, "evalsha") + _calls(redis_client, "eval")  # (EVAL after a NOSCRIPT)
    # When a delayed and an immediate message go through transfer, fetch and ack
    _life_cycle(broker, "functions")
    if server_version >= (7, 0, 0):
        # Then those four calls were FCALLs (the offer and the enqueue stay EVALSHA)
        assert broker.redisson_scripts.library is not None
        assert _calls(redis_client, "fcall") - fcalls == 4
        assert _calls(redis_client, "evalsha") + _calls(redis_client, "eval") - evalshas == 2
    else:
        # Then on Redis 6.2, without functions, every call was an EVALSHA
        assert broker.redisson_scripts.library is None
        assert _calls(redis_client, "evalsha") + _calls(redis_client, "eval") - evalshas == 6


def test_a_library_gone_from_the_server_is_loaded_again(
    broker: RedissonBroker, redis_client: redis.Redis, server_version: tuple[int, int, int]
) -> None:
    if server_version < (7, 0, 0):
        _life_cycle(broker, "flushed")  # 6.2: nothing to flush; EVALSHA all along
        assert broker.redisson_scripts.library is None
        return
    # Given the library loaded, then flushed from the server (FUNCTION FLUSH; a restart
    # without persistence is the same)
    _life_cycle(broker, "flushed")
    redis_client.function_flush()
    assert redis_client.function_list() == []
    # When the consumer calls its scripts again
    _life_cycle(broker, "flushed")
    # Then the library is back, and the calls ran as functions
    library = broker.redisson_scripts.library
    assert library is not None
    assert _libraries(redis_client) == [library.name.encode()]


def test_an_error_of_a_function_is_raised_and_not_run_again(
    broker: RedissonBroker, redis_client: redis.Redis, server_version: tuple[int, int, int]
) -> None:
    # Given a ready queue that is not a list
    keys = broker.keys("broken")
    redis_client.set(keys.ready, "not a list")
    broker.redisson_scripts.fetch(broker.keys("loaded"), broker.broker_id, 1)  # the library loaded, where any
    fetches = _attempts(redis_client, "fcall"), _attempts(redis_client, "evalsha")
    # When the consumer fetches from it
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        broker.redisson_scripts.fetch(keys, broker.broker_id, 1)
    # Then the error came from one call: FCALL where there are functions, else EVALSHA
    ran = _attempts(redis_client, "fcall") - fetches[0], _attempts(redis_client, "evalsha") - fetches[1]
    if server_version >= (7, 0, 0):
        assert ran == (1, 0)
        assert broker.redisson_scripts.library is not None
    else:
        assert ran == (0, 1)


@pytest.mark.parametrize(
    ("reply", "unavailable"),
    [
        ("unknown command `FCALL`, with args beginning with: `f`, `0`, ", True),  # Redis 6.2
        ("ERR unknown command 'FUNCTION', with args beginning with: 'LOAD' ", True),
        ("NOPERM User app has no permissions to run the 'fcall' command", True),
        ("NOPERM User app has no permissions to run the 'function|load' command", True),
        ("Function not found", False),  # not loaded: load it
        ("NOPERM User app has no permissions to run the 'mget' command script: …", False),  # inside
        ("WRONGTYPE Operation against a key holding the wrong kind of value", False),
    ],
)
def test_only_a_refusal_of_functions_themselves_means_evalsha(reply: str, unavailable: bool) -> None:
    assert _runner.unavailable(redis.ResponseError(reply)) is unavailable


def test_a_library_another_process_loaded_meanwhile_is_used(
    broker: RedissonBroker, redis_client: redis.Redis, server_version: tuple[int, int, int]
) -> None:
    if server_version < (7, 0, 0):
        return  # no functions: nothing to race for
    library = build_library()
    # Given the library flushed, and another process about to load it between this
    # process's refused FCALL and its FUNCTION LOAD
    redis_client.function_flush()
    direct = broker.redisson_scripts.direct
    assert direct is not None
    call = direct.call

    def racing(*command: object) -> object:
        if command[:2] == ("FUNCTION", "LOAD"):
            redis_client.function_load(library.source)  # the other process, first
        return call(*command)

    direct.call = racing  # type: ignore[method-assign]
    try:
        fcalls = _calls(redis_client, "fcall")
        # When this process fetches
        assert broker.redisson_scripts.fetch(broker.keys("raced"), broker.broker_id, 1) == []
    finally:
        direct.call = call  # type: ignore[method-assign]
    # Then its own load's "already exists" is no failure: the fetch ran as a function
    assert _calls(redis_client, "fcall") - fcalls == 1
    assert broker.redisson_scripts.library is not None
