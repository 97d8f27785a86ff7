"""One-script Lua tests: each ``test_<script>.py`` here runs ``dramatiq_redisson/scripts/lua/<script>.lua``
alone on the session's real server, with the KEYS and ARGV its header documents, and checks its
reply and what it wrote. No broker, no consumer: a script's contract, one script at a time.

``lua("offer")`` is the script (its includes written in, as the broker loads it), called as
``lua("offer")(keys=[...], args=[...])``: a call fails unless its KEYS are in an order the
script's header allows (:func:`.state.check_key_order`); ``keys`` names every key of a queue
(:class:`dramatiq_redisson.QueueKeys`, the names the broker uses on one server);
``server_ms`` is the server's clock in epoch ms; ``announced()`` lists what was published
on the queue's channel since the test began (or last asked), ``listen(channel)`` the same for
any channel, and :func:`.pubsub.listening` for several channels at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from typing import Any

import pytest
import redis

from dramatiq_redisson._keys import QueueKeys
from dramatiq_redisson.scripts._runner import load_source
from tests.helpers import server_ms as _server_ms

from .pubsub import listening
from .state import Lua, Script, check_key_order


@pytest.fixture
def lua(redis_client: redis.Redis, keys: QueueKeys) -> Lua:
    queue = keys

    def script(name: str) -> Script:
        loaded = redis_client.register_script(load_source(name))

        def call(keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> Any:
            check_key_order(name, keys, queue)  # the order its header gives (its one source)
            return loaded(keys=list(keys), args=list(args))

        return call

    return script


@pytest.fixture
def keys() -> QueueKeys:
    return QueueKeys("dramatiq", "default")


@pytest.fixture
def server_ms(redis_client: redis.Redis) -> Callable[[], int]:
    return lambda: _server_ms(redis_client)


@pytest.fixture
def listen(redis_client: redis.Redis) -> Iterator[Callable[[str], Callable[[], list[bytes]]]]:
    """``listen(channel)`` subscribes; the callable it returns lists the data published on
    ``channel`` since."""
    with ExitStack() as stack:

        def subscribe(channel: str) -> Callable[[], list[bytes]]:
            received = stack.enter_context(listening(redis_client, channel))
            return lambda: [data for _, data in received()]

        yield subscribe


@pytest.fixture
def announced(listen: Callable[[str], Callable[[], list[bytes]]], keys: QueueKeys) -> Callable[[], list[bytes]]:
    """What was published on the queue's channel (new earliest due times) since the test began."""
    return listen(keys.channel)
