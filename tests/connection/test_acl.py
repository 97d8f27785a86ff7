"""Least privilege: the ACL rule (``dramatiq_redisson.connection._permissions``) covers every command
the broker issues, a user with exactly that rule runs the whole flow, and the permission
probe names what a user lacks."""

from __future__ import annotations

import functools
import logging
import re
import secrets
import threading
import time
import wsgiref.util
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import dramatiq
import pytest
import redis
from dramatiq import Worker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import default_middleware

import dramatiq_redisson
from dramatiq_redisson import QueueKeys, RedissonBroker, periodic
from dramatiq_redisson._ids import next_sort_key
from dramatiq_redisson.connection._acl_rule import (
    CLIENT_COMMANDS,
    CLUSTER_COMMANDS,
    COMMANDS,
    CONNECTION_COMMANDS,
    FUNCTION_COMMANDS,
    OPTIONAL_COMMANDS,
    PUBSUB_COMMANDS,
    REPLICATION_COMMANDS,
    SCRIPT_COMMANDS,
    SCRIPTING_COMMANDS,
    SHARDED_PUBSUB,
    UNGUARDED_COMMANDS,
    channel_patterns,
    key_patterns,
)
from dramatiq_redisson.connection._permissions import (
    PROBED_LANE,
    MissingPermission,
    _client_calls,
    _routed_calls,
    acl_rule,
    acl_tokens,
    check_permissions,
    is_permission_error,
    scratch_key,
)
from dramatiq_redisson.dashboard import make_app
from dramatiq_redisson.scripts._runner import load_source
from dramatiq_redisson.workflows import chain, group
from dramatiq_redisson.workflows._scripts import _SOURCES as workflow_sources
from tests.helpers import wait_for

PACKAGE = Path(dramatiq_redisson.__file__).parent
LUA = PACKAGE / "scripts" / "lua"
DOCS = Path(__file__).parents[2] / "docs" / "security.md"

# -- the rule covers every command the code issues ---------------------------------

_CALL = re.compile(r"redis\.p?call\(\s*([^,)\s]+)")
_LITERAL = re.compile(r"""^["']([A-Za-z|]+)["']$""")


def lua_commands(path: Path, text: str | None = None) -> set[str]:
    """Every command a Lua script issues: literal first arguments of redis.call and
    redis.pcall, and literal first arguments of local helpers that pass their first
    parameter on as the command (``variadic("ZREM", key, items)``). ``text``: the
    script as it runs, its includes written in (default: the file's own text).

    Raises AssertionError for a command that cannot be resolved that way."""
    source = re.sub(r"--[^\n]*", "", path.read_text() if text is None else text)
    found: set[str] = set()
    for match in _CALL.finditer(source):
        first = match.group(1)
        literal = _LITERAL.match(first)
        if literal:
            found.add(literal.group(1).lower())
            continue
        # A variable: the first parameter of the enclosing local function?
        head = source[: match.start()]
        helpers = list(re.finditer(r"local\s+function\s+(\w+)\s*\(\s*(\w+)", head))
        assert helpers and helpers[-1].group(2) == first, (
            f"{path.name}: redis.call({first}, ...) with a command this test cannot resolve; "
            "pass commands as string literals (or through a local helper's first parameter)"
        )
        name = helpers[-1].group(1)
        # Every call of the helper (not its definition) must name a literal command; a
        # helper an include defines and this script never calls issues none.
        calls = re.findall(rf"(?<!function )\b{name}\(\s*([^,)\s]+)", source)
        uses = [_LITERAL.match(first) for first in calls]
        assert all(uses), f"{path.name}: helper {name}() is called with a command this test cannot resolve: {calls}"
        found.update(u.group(1).lower() for u in uses if u)
    return found


def test_rule_has_every_command_of_every_lua_script() -> None:
    # Each script as the server runs it, its includes (include/*.lua) written in.
    scripts = sorted(p for p in LUA.glob("*.lua") if p.name != "probe.lua")
    assert len(scripts) >= 10, scripts
    used: dict[str, set[str]] = {p.name: lua_commands(p, load_source(p.stem).decode()) for p in scripts}
    # The workflow scripts, each as the server runs it (lib.lua written in front of it).
    for name, source in workflow_sources.items():
        used[f"workflows/{name}.lua"] = lua_commands(PACKAGE / "workflows" / "lua" / f"{name}.lua", source.decode())
    includes = {p.stem for p in (LUA / "include").glob("*.lua")}
    assert includes
    included = {
        name for name in includes if any(f"local function {name}(" in load_source(p.stem).decode() for p in scripts)
    }
    assert included == includes, f"included by no script: {sorted(includes - included)}"
    every = set().union(*used.values())
    missing = {name: sorted(cmds - set(SCRIPT_COMMANDS)) for name, cmds in used.items() if cmds - set(COMMANDS)}
    assert not missing, f"add these to SCRIPT_COMMANDS in connection/_acl_rule.py (and probe.lua): {missing}"
    unused = set(SCRIPT_COMMANDS) - every
    assert not unused, f"no script uses these any more; drop them from SCRIPT_COMMANDS: {sorted(unused)}"
    # A sanity check of the parser itself: the helpers' commands are found too.
    assert {"zmscore", "time", "publish", "rename"} <= every


def test_the_lua_parser_catches_a_new_command(tmp_path: Path) -> None:
    script = tmp_path / "new.lua"
    script.write_text(
        '-- redis.call("FLUSHALL") in a comment does not count\n'
        "local function each(command, key) return redis.call(command, key) end\n"
        'each("GETDEL", KEYS[1])\nredis.pcall("ZPOPMIN", KEYS[1])\n'
    )
    assert lua_commands(script) == {"getdel", "zpopmin"}
    script.write_text("local c = ARGV[1]\nredis.call(c, KEYS[1])\n")
    with pytest.raises(AssertionError, match="cannot resolve"):
        lua_commands(script)
    # A helper called with a command it cannot read is caught too; one never called issues none.
    helper = "local function each(command, key) return redis.call(command, key) end\n"
    script.write_text(helper + "each(ARGV[1], KEYS[1])\n")
    with pytest.raises(AssertionError, match="cannot resolve"):
        lua_commands(script)
    script.write_text(helper + 'redis.call("GET", KEYS[1])\n')
    assert lua_commands(script) == {"get"}


# Client methods that are not commands, and the ones whose command differs from the name.
_NOT_COMMANDS = {
    "close",
    "disconnect",
    "execute",
    "get_connection",
    "get_message",
    # RedisCluster's lookups in its slot map and node list (they send nothing).
    "get_default_node",
    "get_node_from_key",
    "get_nodes",
    "execute_command",  # its literal command is found by _PACKED
    "get_redis_connection",
    "pack_command",
    "pack_commands",
    "read_response",
    "release",
    "send_packed_command",
}
_METHOD_COMMANDS = {
    "scan_iter": {"scan"},
    "script_load": {"script|load"},
    # Script.__call__: EVALSHA, SCRIPT LOAD on NOSCRIPT; in a pipeline SCRIPT EXISTS first.
    "register_script": {"evalsha", "script|load", "script|exists"},
    "pubsub": {"subscribe"},
}
# Calls on a client, pipeline or pub/sub (connections and pools send what they are given:
# see _PACKED), and methods picked by a condition: (pubsub.ssubscribe if c else pubsub.subscribe)(x).
_METHOD = re.compile(r"\b(?:client|pipe|pubsub)\.(\w+)(?=\(|\s+if\b|\)\()")
# A command written out: pack_command("SCRIPT", "LOAD", ...), execute_command("TIME"), or a
# tuple of arguments such as ("EVALSHA", sha, ...): an upper-case string opening a call or
# tuple, kept when redis-py knows it as a command.
_PACKED = re.compile(r"""\(\s*["']([A-Z][A-Z_]+)["'](?:\s*,\s*["']([A-Z][A-Za-z_-]+)["'])?""")
#: Commands whose second word is a subcommand with its own ACL bit.
_CONTAINERS = {"ACL", "CLIENT", "CLUSTER", "COMMAND", "CONFIG", "FUNCTION", "MEMORY", "OBJECT", "PUBSUB", "SCRIPT"}
_PIPELINE = re.compile(r"(?<!def )\bpipeline\(([^)]*)\)")  # a call, not a declaration (``_commands``)


def python_commands(source: str) -> set[str]:
    """The commands Python source issues through a redis client, pipeline or pub/sub."""
    found: set[str] = set()
    for method in _METHOD.findall(source):
        if method in _NOT_COMMANDS or method == "pipeline":
            continue
        if method in _METHOD_COMMANDS:
            found |= _METHOD_COMMANDS[method]
            continue
        assert hasattr(redis.Redis, method) or hasattr(redis.client.PubSub, method), (
            f"unknown client method {method}(): map it to its commands in tests/connection/test_acl.py"
        )
        found.add(method.lower())
    for command, sub in _PACKED.findall(source):
        if command in _CONTAINERS and sub:
            found.add(f"{command}|{sub}".lower())
        elif hasattr(redis.Redis, command.lower()) or command in {"MULTI", "EXEC"}:
            found.add(command.lower())
    for arguments in _PIPELINE.findall(source):
        if "transaction=False" not in arguments:  # redis-py's default is a MULTI/EXEC transaction
            found |= {"multi", "exec"}
    return found


def test_rule_has_every_command_the_python_code_issues() -> None:
    sources = sorted(p for p in PACKAGE.rglob("*.py") if p.name not in {"_permissions.py", "embedded.py"})
    used = {p.name: python_commands(p.read_text()) for p in sources}
    every = set().union(*used.values())
    allowed = (
        set(CLIENT_COMMANDS)
        | set(SCRIPTING_COMMANDS)
        | set(FUNCTION_COMMANDS)
        | set(PUBSUB_COMMANDS)
        | set(OPTIONAL_COMMANDS)
        | set(REPLICATION_COMMANDS)
        | set(SHARDED_PUBSUB.values())  # a cluster consumer's (in the cluster rule only)
        | set(UNGUARDED_COMMANDS)
    )
    missing = {name: sorted(cmds - allowed) for name, cmds in used.items() if cmds - allowed}
    assert not missing, (
        f"add these to CLIENT_COMMANDS in connection/_acl_rule.py (or to OPTIONAL_COMMANDS if the "
        f"broker works on when they are refused): {missing}"
    )
    unused = set(CLIENT_COMMANDS) - every
    assert not unused, f"no Python code issues these any more; drop them from CLIENT_COMMANDS: {sorted(unused)}"
    assert {"evalsha", "script|load", "subscribe", "scan"} <= every
    assert {"ssubscribe", "sunsubscribe", "subscribe", "unsubscribe"} <= every
    assert every & set(SHARDED_PUBSUB.values()) <= set(CLUSTER_COMMANDS)
    assert not set(OPTIONAL_COMMANDS) & set(COMMANDS)
    # WAIT is sent only with wait_for_replicas: the default rule leaves it out.
    assert set(REPLICATION_COMMANDS) <= every
    assert not set(REPLICATION_COMMANDS) & set(COMMANDS)
    assert "+wait" not in acl_rule() and "+wait" in acl_rule(wait_for_replicas=True).split()
    probed = {command for command, _, _ in _client_calls(QueueKeys("dramatiq", "q"), "w", wait_for_replicas=True)}
    assert set(REPLICATION_COMMANDS) <= probed


def test_the_python_parser_catches_a_new_command() -> None:
    assert python_commands("self.broker.client.getdel(key)\nwith client.pipeline() as pipe: pipe.zpopmin(k)") == {
        "getdel",
        "zpopmin",
        "multi",
        "exec",
    }
    assert python_commands(
        'connection.pack_command("SCRIPT", "LOAD", src)\ncalls.append(("EVAL", src, 0))\nlog(("NOT A COMMAND", 1))'
    ) == {"script|load", "eval"}
    with pytest.raises(AssertionError, match="unknown client method"):
        python_commands("client.frobnicate(key)")
    assert python_commands("(self.pubsub.ssubscribe if cluster else self.pubsub.subscribe)(channel)") == {
        "ssubscribe",
        "subscribe",
    }


def test_probe_tries_every_command_of_the_rule() -> None:
    in_script = {c.lower() for c in re.findall(r"check\(\"([A-Z]+)\"", (LUA / "probe.lua").read_text())}
    assert set(SCRIPT_COMMANDS) <= in_script, sorted(set(SCRIPT_COMMANDS) - in_script)
    from_python = {command for command, _, _ in _client_calls(QueueKeys("dramatiq", "q"), "w")}
    tried = in_script | from_python | {"subscribe", "unsubscribe"}
    # SELECT and CLIENT SETINFO are redis-py's connection setup: it runs them (or fails
    # on SELECT) before any probe could. FCALL and FUNCTION LOAD are granted but not asked
    # for: without them the scripts run with EVALSHA (see FUNCTION_COMMANDS).
    untried = set(CONNECTION_COMMANDS) | set(FUNCTION_COMMANDS)
    assert set(COMMANDS) - untried <= tried, sorted(set(COMMANDS) - untried - tried)
    assert tried <= set(COMMANDS), sorted(tried - set(COMMANDS))


@pytest.mark.parametrize("cluster", [False, True], ids=["single", "cluster"])
def test_probe_covers_every_key_of_a_queue(cluster: bool) -> None:
    """Every key name QueueKeys knows is in the probe's arguments: a new key in
    _keys.py must be added to _permissions._typed_keys (and to the key patterns). On a
    cluster the registry (another slot) is checked through the cluster client instead."""
    keys = QueueKeys("ns", "q", cluster)
    argv = next(call for command, _, call in _client_calls(keys, "w") if command == "evalsha")
    names: set[str] = set()
    for attribute in dir(QueueKeys):
        if attribute.startswith("_") or attribute in {
            "namespace",
            "queue_name",
            "name",
            "cluster",
            "reaches_namespace",
            "every_name",
            "lane_prefix",  # not keys: the lanes' and rings' names start with them
            "ring_prefix",
            "flow_affixes",
            "wake_prefix",  # a channel prefix (the wake channel itself is checked)
            "rate_prefix",
            "lane",  # one lane, ring and rate log stand for all (checked below)
            "ring",
            "rate_log",
        }:
            continue
        value = getattr(keys, attribute)
        value = value("w") if callable(value) else value
        names.update([value] if isinstance(value, str) else value)
    checked = set(argv) | {target for _, target, _ in (_routed_calls(keys) if cluster else [])}
    assert names <= checked, sorted(names - checked)
    assert {keys.lane(PROBED_LANE), keys.ring(1), keys.rate_log()} <= checked
    if cluster:
        assert keys.registry not in argv  # in another slot: not inside the probe


# -- the rule's text ------------------------------------------------------------------


def test_rule_text() -> None:
    rule = acl_rule()
    assert rule == " ".join(acl_tokens())
    assert rule.startswith("resetkeys resetchannels -@all +")
    assert "+time" in rule and "+evalsha" in rule and "+script|load" in rule and "+subscribe" in rule
    assert "@" not in rule.replace("-@all", "")  # explicit commands only
    assert "+info" not in rule and "+keys" not in rule and "+flushdb" not in rule
    assert rule.endswith("~dramatiq:* ~redisson_delay_queue*:{dramatiq:*} &redisson_delay_queue_channel:{dramatiq:*}")
    assert key_patterns("shop") == ("shop:*", "redisson_delay_queue*:{shop:*}")
    assert channel_patterns("shop") == ("redisson_delay_queue_channel:{shop:*}",)
    assert key_patterns("a*b?[c]") == (r"a\*b\?\[c\]:*", r"redisson_delay_queue*:{a\*b\?\[c\]:*}")
    with pytest.raises(ValueError, match="whitespace"):
        acl_rule("my app")
    # Each key of a queue matches a pattern, each channel a channel pattern (Redis glob
    # semantics = fnmatch's for these patterns, which hold no [ or \).
    from fnmatch import fnmatchcase

    keys = QueueKeys("shop", "mail")
    names = [*keys.every_name("w1", "w1.1"), scratch_key(keys)]
    for name in names:
        assert any(fnmatchcase(name, p) for p in key_patterns("shop")), name
        assert not any(fnmatchcase(name, p) for p in key_patterns("other")), name
    # The wake channels fit the channel pattern rules had before they existed.
    for channel in (keys.channel, keys.wake_channel("0f5c-uuid.12")):
        assert fnmatchcase(channel, channel_patterns("shop")[0]), channel
        assert not fnmatchcase(channel, channel_patterns("other")[0]), channel


def test_docs_carry_the_generated_rule() -> None:
    text = DOCS.read_text()
    assert acl_rule() in text, "docs/security.md: paste acl_rule()'s output again"
    assert acl_rule("myapp") in text, "docs/security.md: paste acl_rule('myapp')'s output again"
    readme = (DOCS.parent / "security.md").read_text()  # the README's rule moved to the docs site's page
    assert acl_rule() in readme, "docs/security.md: paste acl_rule()'s output again"


# -- a restricted user on the session's server -----------------------------------------


@pytest.fixture
def rule_tokens(server_version: tuple[int, int, int]) -> Callable[..., list[str]]:
    """``acl_tokens`` rendered for the session's server (the rule follows its version)."""
    return functools.partial(acl_tokens, server_version=server_version)


@pytest.fixture
def rule_text(server_version: tuple[int, int, int]) -> Callable[..., str]:
    """``acl_rule`` rendered for the session's server."""
    return functools.partial(acl_rule, server_version=server_version)


@pytest.fixture
def make_user(redis_url: str, redis_client: redis.Redis) -> Iterator[Callable[[list[str]], str]]:
    """Create ACL users (``on``, a random password, the given tokens); returns their
    URL. Every user is deleted at teardown."""
    made: list[str] = []

    def make(tokens: list[str]) -> str:
        name = f"dramatiq-redisson-test-{secrets.token_hex(4)}"
        password = secrets.token_urlsafe(16)
        redis_client.execute_command("ACL SETUSER", name, "reset", "on", f">{password}", *tokens)
        made.append(name)
        parts = urlsplit(redis_url)
        host = parts.netloc.rpartition("@")[2]
        return urlunsplit((parts.scheme, f"{quote(name)}:{quote(password)}@{host}", parts.path, parts.query, ""))

    yield make
    for name in made:
        redis_client.execute_command("ACL DELUSER", name)


def _acl_log(admin: redis.Redis, user: str) -> list[dict[str, Any]]:
    return [dict(e) for e in admin.acl_log(count=1000) if e["username"] == user]


def _user_of(url: str) -> str:
    from urllib.parse import unquote

    return unquote(urlsplit(url).username or "")


def test_whole_flow_as_a_user_with_exactly_the_rule(
    redis_url: str,
    redis_client: redis.Redis,
    make_user: Callable[[list[str]], str],
    rule_tokens: Callable[..., list[str]],
) -> None:
    url = make_user(rule_tokens())
    user = _user_of(url)
    redis_client.acl_log_reset()
    # The user can do nothing outside its namespace.
    outsider = redis.Redis.from_url(url)
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            outsider.get("elsewhere")
        with pytest.raises(redis.exceptions.NoPermissionError):
            outsider.flushdb()
    finally:
        outsider.close()
    redis_client.acl_log_reset()

    broker = RedissonBroker(url=url, middleware=[m() for m in default_middleware])
    broker.safety_interval = 1000
    broker.maintenance_interval = 200  # run maintenance (dead workers: SCAN, ZREM) within the test
    dramatiq.set_broker(broker)
    queue = "acl"
    keys = broker.keys(queue)
    ran: list[str] = []
    attempts: dict[str, int] = {}
    lock = threading.Lock()

    @dramatiq.actor(queue_name=queue, max_retries=0)
    def job(name: str) -> None:
        with lock:
            ran.append(name)

    @dramatiq.actor(queue_name=queue, max_retries=3, min_backoff=100, max_backoff=100)
    def flaky(name: str) -> None:
        with lock:
            attempts[name] = attempts.get(name, 0) + 1
            if attempts[name] == 1:
                raise RuntimeError("first attempt fails")
            ran.append(name)

    @dramatiq.actor(queue_name=queue, max_retries=0)
    def doomed() -> None:
        raise RuntimeError("dead letter")

    @periodic(every="300ms", name="acl-tick")
    @dramatiq.actor(queue_name=queue, max_retries=0)
    def ticking() -> None:
        with lock:
            ran.append("tick")

    # A dead worker with stranded work, and a legacy .DQ message of the built-in broker:
    # the consumer's maintenance and migration run as the restricted user too.
    redis_client.zadd(keys.heartbeats, {"dead-worker": 0})
    redis_client.sadd(keys.acks("dead-worker"), "stranded-id")
    builtin = RedisBroker(url=redis_url)
    try:
        builtin.enqueue(job.message("legacy"), delay=50)
    finally:
        builtin.client.close()

    check_permissions(broker.client, keys, worker_id=broker.broker_id)  # nothing missing
    # The broker renders the same rule for the server it is connected to.
    assert broker.acl_rule() == " ".join(rule_tokens())

    job.send("now")
    job.send_with_options(args=("later",), delay=200)
    flaky.send("retried")
    doomed.send()
    cancelled = job.send_with_options(args=("cancelled",), delay=60_000)
    delayed = broker.delayed_queue(queue)
    assert delayed.contains(cancelled.message_id)
    assert delayed.size() >= 2
    assert delayed.next_due() is not None
    assert any(m.message_id == cancelled.message_id for _, m in delayed.read_all())
    assert delayed.remove(cancelled.message_id)
    assert not delayed.contains(cancelled.message_id)
    broker.enqueue_many([job.message(f"bulk-now-{i}") for i in range(3)])
    broker.enqueue_many([job.message(f"bulk-later-{i}") for i in range(3)], delay=100)
    broker.declare_queue("acl-cleared")
    to_clear = broker.delayed_queue("acl-cleared")
    broker.enqueue(job.message("never").copy(queue_name="acl-cleared"), delay=60_000)
    assert to_clear.clear() == 1

    worker = Worker(broker, worker_timeout=100, worker_threads=2)
    worker.start()
    try:
        expected = {"now", "later", "retried", "legacy", *(f"bulk-{w}-{i}" for w in ("now", "later") for i in range(3))}
        assert wait_for(lambda: expected <= set(ran), timeout=15), sorted(ran)
        # The periodic actor ticks, and is operated, as the same user (join does not wait
        # for its next tick: it is always scheduled)
        assert wait_for(lambda: ran.count("tick") >= 2, timeout=5)
        assert broker.schedules.get("acl-tick").last_run_ms is not None
        assert broker.schedules.pause("acl-tick") and broker.schedules.resume("acl-tick")
        broker.schedules.run_now("acl-tick")
        broker.join(queue, timeout=10_000)
        # Maintenance found the dead worker, requeued nothing it could decode... and forgot it.
        assert wait_for(lambda: redis_client.zscore(keys.heartbeats, "dead-worker") is None, timeout=10)
        worker.join()
        # Live-fleet operations as the same user: pause (fetches find it), running, history.
        assert broker.pause(queue)
        job.send("while paused")
        time.sleep(1.0)
        assert "while paused" not in ran and broker.stats(queue)["queues"][queue]["paused"]
        assert broker.running(queue) == []
        assert broker.resume(queue)
        assert wait_for(lambda: "while paused" in ran, timeout=5)
        counts = broker.history(queue, minutes=5, hours=2)["queues"][queue]["minutes"]
        assert sum(b["processed"] for b in counts) >= 3 and sum(b["failed"] for b in counts) >= 1
        assert sum(b["retried"] for b in counts) == len(attempts) >= 1
        # A workflow runs, is read, listed and cancelled as the same user.
        member = [job.message_with_options(args=(f"wf-{n}",), pipe_ignore=True) for n in "bc"]
        done = chain(job.message("wf-a"), group(member)).run()
        assert done.wait(timeout=10).state == "done"
        assert {"wf-a", "wf-b", "wf-c"} <= set(ran)
        later = job.message_with_options(args=("wf-later",), delay=60_000)
        stopped = chain(later, job.message_with_options(args=("wf-never",), pipe_ignore=True)).run()
        assert stopped.cancel() and broker.workflows.get(stopped.id).state == "cancelled"  # type: ignore[union-attr]
        assert [w.id for w in broker.workflows.list(limit=2)] == [stopped.id, done.id]
    finally:
        worker.stop()

    assert "cancelled" not in ran and "never" not in ran
    assert attempts["retried"] == 2
    assert redis_client.zcard(keys.xq) >= 1  # doomed, dead-lettered by the nack script
    assert redis_client.llen(keys.legacy_dq) == 0
    # The dashboard reads (and acts) with the same rule: every page renders
    client = make_app(broker)
    (dead_id,) = [m.decode() for m in redis_client.zrange(keys.xq, 0, 0)]
    for path in (
        "/",
        f"/queues/{queue}",
        f"/queues/{queue}?q=x",
        f"/queues/{queue}/dead",
        f"/queues/{queue}/dead/{dead_id}",
        f"/queues/{queue}?hours=720",
        "/running",
        f"/running?queue={queue}",
        "/limits",
        f"/limits?queue={queue}",
    ):
        statuses: list[str] = []
        environ: dict[str, Any] = {}
        wsgiref.util.setup_testing_defaults(environ)
        path, _, query = path.partition("?")
        environ.update(PATH_INFO=path, QUERY_STRING=query)
        client(environ, lambda status, headers, statuses=statuses: statuses.append(status))
        assert statuses == ["200 OK"], path

    broker.flush_all()
    assert redis_client.keys("redisson_delay_queue*") == []
    assert not redis_client.exists(keys.ready, keys.ready_msgs, keys.xq, keys.xq_msgs)
    broker.close()

    # Not one refusal on the server, not even an ignored one (CLIENT SETINFO).
    assert _acl_log(redis_client, user) == []


def test_a_send_refused_by_acl_raises_one_error_naming_everything_missing(
    redis_url: str,
    redis_client: redis.Redis,
    make_user: Callable[[list[str]], str],
    rule_tokens: Callable[..., list[str]],
    rule_text: Callable[..., str],
) -> None:
    """The failure the probe exists for: without TIME, the scripts that read the
    server's clock fail (every delayed send among them) with an error that is only a
    plain ResponseError (recognised by is_permission_error); the send raises the
    probe's MissingPermission instead, with that refusal as its cause."""
    url = make_user([t for t in rule_tokens() if t != "+time"])
    broker = RedissonBroker(url=url)
    try:

        @dramatiq.actor(queue_name="acl-notime", broker=broker)
        def job() -> None:  # pragma: no cover - never runs
            pass

        with pytest.raises(MissingPermission) as info:
            job.send_with_options(delay=1000)
        # The send names everything missing at once (the probe), with the refusal as cause
        assert info.value.commands == ("time",)
        assert is_permission_error(info.value.__cause__), info.value.__cause__  # type: ignore[arg-type]
        assert broker.client.zcard(broker.keys("acl-notime").timeout_zset) == 0
        assert not is_permission_error(redis.ResponseError("WRONGTYPE Operation against a key"))

        with pytest.raises(MissingPermission) as missing:
            check_permissions(broker.client, broker.keys("acl-notime"))
        error = missing.value
        assert error.commands == ("time",)
        assert error.keys == () and error.channels == () and error.unchecked == ()
        assert "time" in str(error) and rule_text() in str(error)
        assert isinstance(error, redis.exceptions.NoPermissionError)
        assert is_permission_error(error)
    finally:
        broker.flush_all()
        broker.close()


def _probe(url: str, namespace: str = "dramatiq", queue: str = "default", **kwargs: Any) -> MissingPermission:
    client = redis.Redis.from_url(url)
    try:
        with pytest.raises(MissingPermission) as info:
            check_permissions(client, QueueKeys(namespace, queue), **kwargs)
        return info.value
    finally:
        client.close()


def test_probe_names_every_missing_command_key_and_channel_in_one_error(
    make_user: Callable[[list[str]], str],
    rule_tokens: Callable[..., list[str]],
) -> None:
    tokens = [t for t in rule_tokens() if t not in ("+time", "+zadd", "+subscribe", "+scan")]
    tokens = [t for t in tokens if not t.startswith("&") and not t.startswith("~redisson")]
    error = _probe(make_user(tokens))
    # SUBSCRIBE is refused before the channel is looked at; the channel is named through
    # PUBLISH inside the probe.
    assert error.commands == ("scan", "subscribe", "time", "zadd")
    assert error.channels == ("redisson_delay_queue_channel:{dramatiq:default}",)
    named = {k.split(" ")[0] for k in error.keys}
    assert named == {
        "redisson_delay_queue_timeout:{dramatiq:default}",
        "redisson_delay_queue:{dramatiq:default}",
        "redisson_delay_queue_msgs:{dramatiq:default}",
        "redisson_delay_queue_compact:{dramatiq:default}",
        "redisson_delay_queue_cursor:{dramatiq:default}",
        "redisson_delay_queue_sent:{dramatiq:default}",
        "redisson_delay_queue_dedupe:{dramatiq:default}",
        "redisson_delay_queue_keyed:{dramatiq:default}",
        "redisson_delay_queue_holds:{dramatiq:default}",
        "redisson_delay_queue_held:{dramatiq:default}",
        "redisson_delay_queue_schedules:{dramatiq:default}",
        "redisson_delay_queue_chains:{dramatiq:default}",
        "redisson_delay_queue_schedule_state:{dramatiq:default}",
        "redisson_delay_queue_paused:{dramatiq:default}",
        "redisson_delay_queue_fetched:{dramatiq:default}",
        "redisson_delay_queue_counts:{dramatiq:default}",
        "redisson_delay_queue_progress:{dramatiq:default}",
        "redisson_delay_queue_checkpoints:{dramatiq:default}",
        "redisson_delay_queue_done:{dramatiq:default}",
        "redisson_delay_queue_minutes:{dramatiq:default}",
        "redisson_delay_queue_hours:{dramatiq:default}",
        "redisson_delay_queue_lease:{dramatiq:default}",
        "redisson_delay_queue_consumers:{dramatiq:default}",
        "redisson_delay_queue_idle:{dramatiq:default}",
        "redisson_delay_queue_alive:{dramatiq:default}",
        "redisson_delay_queue_subscribers:{dramatiq:default}",
        "redisson_delay_queue_flow:{dramatiq:default}",
        "redisson_delay_queue_lane:{dramatiq:default}:{on}",
        "redisson_delay_queue_levels:{dramatiq:default}",
        "redisson_delay_queue_lane_of:{dramatiq:default}",
        "redisson_delay_queue_lane:{dramatiq:default}:{1:70726f6265}",
        "redisson_delay_queue_ring:{dramatiq:default}:{1}",
        "redisson_delay_queue_rate:{dramatiq:default}:{q}",
        "redisson_delay_queue_rate:{dramatiq:default}:{deferred}",
        "redisson_delay_queue_shards:{dramatiq:default}",
        "redisson_delay_queue_channel:{dramatiq:default}",
        "redisson_delay_queue_channel:{dramatiq:default}:wake:{__dramatiq_redisson_permission_probe__}",
    }
    message = str(error)
    for name in ("scan", "subscribe", "time", "zadd", *named):
        assert name in message


def test_probe_checks_the_subscription_channel(
    make_user: Callable[[list[str]], str], rule_tokens: Callable[..., list[str]]
) -> None:
    # PUBLISH allowed on the channel, SUBSCRIBE not: only the subscription can tell.
    tokens = [t for t in rule_tokens() if not t.startswith("&")] + ["&nothing-useful"]
    url = make_user(tokens)
    error = _probe(url)
    assert error.channels == ("redisson_delay_queue_channel:{dramatiq:default}",)
    # Producers need no subscription.
    client = redis.Redis.from_url(url)
    try:
        with pytest.raises(MissingPermission):  # PUBLISH in the probe still needs the channel
            check_permissions(client, QueueKeys("dramatiq", "default"), subscribe=False)
    finally:
        client.close()


@pytest.mark.server(min=(7, 0, 0))  # %R~ (read-only key patterns) is 7.0's
def test_probe_with_read_only_keys_and_no_way_to_delete(
    redis_client: redis.Redis,
    make_user: Callable[[list[str]], str],
    rule_tokens: Callable[..., list[str]],
) -> None:
    tokens = [("%R" + t) if t.startswith("~") else t for t in rule_tokens()]
    tokens = [t for t in tokens if t not in ("+del", "+unlink", "+ltrim", "+srem")]
    error = _probe(make_user(tokens))
    assert set(error.commands) == {"del", "ltrim", "srem", "unlink"}
    assert "redisson_delay_queue_timeout:{dramatiq:default} (write)" in error.keys
    assert "dramatiq:default (write)" in error.keys
    # (HDEL is refused too: the scratch key is read-only, so HSETNX cannot be undone)
    assert set(error.unchecked) == {"hincrby", "hsetnx", "lpush", "rpush", "sadd"}
    assert "Not checked until those are granted: hincrby, hsetnx, lpush, rpush, sadd" in str(error)
    assert redis_client.keys("*") == []  # nothing left behind


def test_probe_when_scripts_cannot_run(
    make_user: Callable[[list[str]], str], rule_tokens: Callable[..., list[str]]
) -> None:
    error = _probe(make_user([t for t in rule_tokens() if t != "+evalsha"]))
    assert error.commands == ("evalsha",)
    assert set(error.unchecked) == set(SCRIPT_COMMANDS)
    assert "could not be checked" in str(error)


def test_refusals_worded_by_older_servers() -> None:
    """Redis 6.2 words refusals differently (and without names inside scripts)."""
    from dramatiq_redisson.connection._permissions import _raise

    keys = QueueKeys("dramatiq", "q")
    with pytest.raises(MissingPermission) as info:
        _raise(
            keys,
            [
                ("time", "", "The user executing the script can't run this command or subcommand"),
                ("zadd", keys.timeout_zset, "The user executing the script can't access at least one of the keys"),
                ("publish", keys.channel, "The user executing the script can't access at least one of the keys"),
                ("scan", "", "this user has no permissions to run the 'scan' command or its subcommand"),
                ("hlen", keys.ready_msgs, "this user has no permissions to access one of the keys used as arguments"),
                (
                    "subscribe",
                    keys.channel,
                    "this user has no permissions to access one of the channels used as arguments",
                ),
            ],
            [],
        )
    error = info.value
    assert error.commands == ("scan", "time")
    assert error.keys == (f"{keys.ready_msgs} (read)", f"{keys.timeout_zset} (write)")
    assert error.channels == (keys.channel,)
    assert is_permission_error(redis.ResponseError("The user executing the script can't run this command"))


def test_probe_when_the_connection_setup_is_refused(
    redis_url: str, make_user: Callable[[list[str]], str], rule_tokens: Callable[..., list[str]]
) -> None:
    url = make_user([t for t in rule_tokens() if t != "+select"])
    parts = urlsplit(url)
    error = _probe(urlunsplit(parts._replace(path="/1")))
    assert error.commands == ("select",)
    assert "Nothing else could be checked" in str(error)
    on_db_0 = redis.Redis.from_url(urlunsplit(parts._replace(path="/0")))
    try:
        check_permissions(on_db_0, QueueKeys("dramatiq", "q"))  # database 0 needs no SELECT
    finally:
        on_db_0.close()


def _content(client: redis.Redis, key: bytes) -> Any:
    """A key's type and whole value, in a canonical order."""
    kind = client.type(key).decode()
    value: Any = {
        "string": lambda: client.get(key),
        "list": lambda: client.lrange(key, 0, -1),
        "hash": lambda: sorted(client.hgetall(key).items()),
        "set": lambda: sorted(client.smembers(key)),
        "zset": lambda: client.zrange(key, 0, -1, withscores=True),
    }[kind]()
    return kind, value


def test_probe_changes_nothing(
    redis_url: str,
    redis_client: redis.Redis,
    make_user: Callable[[list[str]], str],
    rule_tokens: Callable[..., list[str]],
) -> None:
    """Real data in every structure of a queue: the probe leaves each key byte-identical
    (and its TTL), as the rule's user and as the admin."""
    broker = RedissonBroker(url=redis_url)
    try:
        keys = broker.keys("busy")

        @dramatiq.actor(queue_name="busy", broker=broker)
        def job(i: int) -> None:  # pragma: no cover - never runs
            pass

        for i in range(5):
            job.send(i)
            job.send_with_options(args=(i,), delay=60_000 + i)
        redis_client.sadd(keys.acks("w1"), "in-flight")
        redis_client.set(keys.compact_cursor, "3", px=600_000)
        redis_client.rpush(keys.compact_list, "a", "b")
        redis_client.zadd(keys.xq, {"dead": 1})
        redis_client.hset(keys.xq_msgs, "dead", "x")
        redis_client.rpush(keys.legacy_dq, "l1")
        redis_client.hset(keys.legacy_dq_msgs, "l1", "x")
        redis_client.sadd(keys.legacy_dq_acks("w1"), "l0")

        def state() -> dict[bytes, tuple[Any, bool]]:
            # Contents, not DUMP bytes: reading a hash table mid-rehash moves its entries
            # (Redis up to 7.4 and Valkey 7.2), which changes DUMP's order but not the data.
            return {k: (_content(redis_client, k), redis_client.pttl(k) > 0) for k in sorted(redis_client.keys("*"))}

        before = state()
        assert len(before) >= 12
        check_permissions(broker.client, keys, worker_id="w1")
        restricted = redis.Redis.from_url(make_user(rule_tokens()))
        try:
            check_permissions(restricted, keys, worker_id="w1")
        finally:
            restricted.close()
        assert state() == before
    finally:
        broker.flush("busy")
        broker.close()


def test_custom_namespace(
    redis_url: str, make_user: Callable[[list[str]], str], rule_tokens: Callable[..., list[str]]
) -> None:
    url = make_user(rule_tokens("myapp"))
    client = redis.Redis.from_url(url)
    try:
        check_permissions(client, QueueKeys("myapp", "default"))
        broker = RedissonBroker(client=client, namespace="myapp")

        @dramatiq.actor(queue_name="ns", broker=broker)
        def job() -> None:  # pragma: no cover - never runs
            pass

        message = job.send_with_options(delay=60_000)
        assert broker.delayed_queue("ns").remove(message.message_id)
        broker.flush_all()
    finally:
        client.close()
    # The default namespace's queues are out of this user's reach.
    error = _probe(url)
    assert "dramatiq:default (read/write)" in error.keys
    assert error.channels == ("redisson_delay_queue_channel:{dramatiq:default}",)


def test_probe_is_quick(
    redis_url: str, make_user: Callable[[list[str]], str], rule_tokens: Callable[..., list[str]]
) -> None:
    client = redis.Redis.from_url(make_user(rule_tokens()))
    try:
        started = time.monotonic()
        check_permissions(client, QueueKeys("dramatiq", "default"))
        assert time.monotonic() - started < 1
    finally:
        client.close()


def test_a_consumer_missing_a_permission_says_so_once_and_keeps_running(
    make_user: Callable[[list[str]], str],
    caplog: pytest.LogCaptureFixture,
    rule_tokens: Callable[..., list[str]],
    rule_text: Callable[..., str],
) -> None:
    # Given a user without TIME, which every consumer-side script needs
    url = make_user([t for t in rule_tokens() if t != "+time"])
    broker = RedissonBroker(url=url)

    @dramatiq.actor(queue_name="acl-consumer", broker=broker)
    def job() -> None:  # pragma: no cover - never runs
        pass

    # When a worker runs on its queue for a while
    caplog.set_level(logging.INFO)
    worker = Worker(broker, worker_timeout=100, worker_threads=1)
    worker.start()
    try:
        # The consumer thread builds its consumer after start() returns.
        assert wait_for(lambda: worker.consumers["acl-consumer"].consumer is not None, timeout=10)
        consumer = worker.consumers["acl-consumer"].consumer
        time.sleep(2.0)
        # Then one error names the missing command and the rule, at first use
        probe_errors = [r for r in caplog.records if r.levelno == logging.ERROR and rule_text() in r.getMessage()]
        assert len(probe_errors) == 1
        assert "missing commands: time." in probe_errors[0].getMessage()
        # And the consumer backs off and logs each kind of refusal once, instead of
        # crash-looping (Dramatiq restarts a consumer that raises, every 3 s, loudly)
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) <= 4, [r.getMessage() for r in errors]
        assert not [r for r in caplog.records if "Consumer encountered" in r.getMessage()]
        assert worker.consumers["acl-consumer"].consumer is consumer
    finally:
        worker.stop()
        broker.close()


#: Commands later releases added to the rule, each behind a fallback in the scripts: the
#: activity history's BITFIELD (skipped), the single-call MGET, HSETNX and ZPOPMAX (the
#: earlier commands one by one).
_NEWER_COMMANDS = ("+bitfield", "+hsetnx", "+mget", "+zpopmax")


@pytest.mark.parametrize("without", [_NEWER_COMMANDS, ("+hsetnx", "+mget", "+zpopmax"), ()])
def test_an_earlier_releases_rule_still_sends_moves_acks_and_nacks(
    make_user: Callable[[list[str]], str],
    rule_tokens: Callable[..., list[str]],
    redis_client: redis.Redis,
    without: tuple[str, ...],
) -> None:
    """A user still on a rule before BITFIELD (history), HSETNX, MGET and ZPOPMAX (fewer
    commands per send, move and wake-up) must lose nothing: delayed and immediate sends, a
    resend and a reschedule, wake-ups, moves, acks and nacks go through (the history count
    is skipped), stats and the history read work, and the probe names what is missing."""
    old_rule = [t for t in rule_tokens() if t not in without]
    assert len(old_rule) == len(rule_tokens()) - len(without)
    url = make_user(old_rule)
    broker = RedissonBroker(url=url)
    try:
        keys = broker.keys("old-rule")
        broker.declare_queue("old-rule")
        if without:
            with pytest.raises(MissingPermission, match="hsetnx") as missing:
                check_permissions(broker.client, keys, server_version=broker.server_version)
            assert set(missing.value.commands) == {t[1:] for t in without}
        else:  # the rule of this release: the same steps, on the scripts' first paths
            check_permissions(broker.client, keys, server_version=broker.server_version)
        scripts = broker.redisson_scripts
        messages = [
            dramatiq.Message(queue_name="old-rule", actor_name="a", args=(i,), kwargs={}, options={}) for i in range(2)
        ]
        delayed = [broker.enqueue(message, delay=1) for message in messages]
        # The same member offered again (a resend) stays scheduled once; a later offer of
        # the same message id moves it (a reschedule, through offer.lua)
        member = delayed[0].options["redis_message_id"]
        sort_key = member[: -len(delayed[0].message_id)]
        data = redis_client.hget(keys.payloads, delayed[0].message_id)
        assert data is not None
        assert scripts.offer_one(keys, 1, sort_key, delayed[0].message_id, data[len(sort_key) :], "both") > 0
        assert redis_client.zcard(keys.timeout_zset) == 2 and redis_client.llen(keys.backup_list) == 2
        assert scripts.offer_one(keys, 1, next_sort_key(), delayed[0].message_id, b"x", "both") == -4
        assert wait_for(lambda: _move_all(broker, "old-rule") == 0 and redis_client.zcard(keys.timeout_zset) == 0)
        assert redis_client.llen(keys.ready) == 2
        fetched = scripts.fetch(keys, broker.broker_id, 2)
        assert fetched is not None and len(fetched) == 2
        assert broker.do_ack("old-rule", fetched[0][0]) == 1
        assert broker.do_nack("old-rule", fetched[1][0]) == 1
        # An immediate send, sent again (once on the queue), wakes the idle consumer
        # registered for it (ZPOPMAX, or ZRANGE and ZREM: it leaves the registry either way)
        redis_client.zadd(keys.idle, {"a-consumer-token": 3})
        immediate = dramatiq.Message(queue_name="old-rule", actor_name="a", args=(9,), kwargs={}, options={})
        with redis_client.pubsub() as wake_channel:
            wake_channel.subscribe(keys.wake_channel("a-consumer-token"))
            assert wake_channel.get_message(timeout=1)["type"] == "subscribe"
            sent = broker.enqueue(immediate)
            broker.enqueue(immediate)
            woken = wake_channel.get_message(timeout=1)
        assert woken is not None and woken["data"] == b"0"
        assert redis_client.zcard(keys.idle) == 0
        assert redis_client.lrange(keys.ready, 0, -1) == [sent.options["redis_message_id"].encode()]
        fetched = scripts.fetch(keys, broker.broker_id, 2)
        assert fetched is not None and len(fetched) == 1
        assert broker.do_ack("old-rule", fetched[0][0]) == 1
        stats = broker.stats("old-rule")["queues"]["old-rule"]
        assert stats["in_flight"] == 0 and stats["dead"] == 1
        if "+bitfield" in without:
            assert stats["last_hour"] == {"processed": 0, "failed": 0, "retried": 0}
            assert redis_client.exists(keys.minutes) == 0
        else:
            assert stats["last_hour"] == {"processed": 2, "failed": 1, "retried": 0}
    finally:
        broker.flush_all()
        broker.close()


def _move_all(broker: RedissonBroker, queue_name: str) -> int:
    """One transfer (as an operator's, no lease); returns how many stay scheduled."""
    broker.redisson_scripts.transfer(
        broker.keys(queue_name), limit=100, trim_budget=100, compact_step=100, compact_slack=100
    )
    return int(broker.client.zcard(broker.keys(queue_name).timeout_zset))


def test_a_user_without_functions_runs_every_script_with_evalsha(
    redis_client: redis.Redis,
    make_user: Callable[[list[str]], str],
    rule_tokens: Callable[..., list[str]],
) -> None:
    """A rule from before FCALL and FUNCTION LOAD were in it (scripts._library): the consumer's
    scripts run with EVALSHA after one refused FCALL; the probe does not ask for them."""
    # Given a user on the rule without +fcall and +function|load
    url = make_user([t for t in rule_tokens() if t not in ("+fcall", "+function|load")])
    user = _user_of(url)
    redis_client.acl_log_reset()
    broker = RedissonBroker(url=url)
    try:
        keys, scripts = broker.keys("no-functions"), broker.redisson_scripts
        check_permissions(broker.client, keys, server_version=broker.server_version)
        # When a message is offered, moved and handed off, and acked
        message = dramatiq.Message(queue_name="no-functions", actor_name="a", args=(1,), kwargs={}, options={})
        broker.enqueue(message, delay=1)
        assert wait_for(lambda: _move_all(broker, "no-functions") == 0)
        fetched = scripts.fetch(keys, broker.broker_id, 1)
        assert fetched is not None and len(fetched) == 1
        assert broker.do_ack("no-functions", fetched[0][0]) == 1
        # Then everything went through, the scripts with EVALSHA from the first refusal on
        assert scripts.library is None
        refused = {e["object"] for e in _acl_log(redis_client, user)}
        assert refused <= {"fcall"}, refused
    finally:
        broker.flush_all()
        broker.close()
