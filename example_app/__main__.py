"""``python -m example_app``: run the order-timeout demo.

Uses the server at ``$REDIS_URL`` if set, else an embedded Valkey started for the
run. Exits 0 if every order ended as planned, 1 otherwise, and 2 (one line on stderr)
if no server answers at ``$REDIS_URL``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import urllib.parse

import redis
from dramatiq.cli import LOGFORMAT

from dramatiq_redisson.embedded import redis_url

PROG = "python -m example_app"

#: Exit status when no server answers at ``$REDIS_URL``.
EXIT_UNREACHABLE = 2


def shown_url(url: str) -> str:
    """``url`` as it may be printed: its password, if any, replaced by ``***``."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    user = f"{parts.username}:" if parts.username else ":"
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}***@{host}"))


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, provide a server and run the demo."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__)
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="log INFO (-v) or DEBUG (-vv) messages to stderr"
    )
    args = parser.parse_args(argv)
    levels = {0: logging.WARNING, 1: logging.INFO}
    logging.basicConfig(level=levels.get(args.verbose, logging.DEBUG), format=LOGFORMAT, stream=sys.stderr)

    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(redis_url())
        except (redis.ConnectionError, redis.TimeoutError) as e:
            # An embedded server that started but does not answer is a failure of its own,
            # with its traceback; a closed $REDIS_URL is the operator's to fix.
            if not os.environ.get("REDIS_URL"):
                raise
            given = shown_url(os.environ["REDIS_URL"])
            sys.stderr.write(
                f"{PROG}: error: cannot reach REDIS_URL={given}: {str(e).strip().rstrip('.')}; start a server "
                "with `dramatiq-redisson server` and set REDIS_URL to the URL it prints, or unset REDIS_URL "
                "to run an embedded one\n"
            )
            return EXIT_UNREACHABLE
        # example_app.tasks builds its broker from $REDIS_URL at import time.
        os.environ["REDIS_URL"] = url
        from .demo import run

        status = run()
    return status


if __name__ == "__main__":
    sys.exit(main())
