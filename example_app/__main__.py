"""``python -m example_app``: run the order-timeout demo.

Uses the server at ``$REDIS_URL`` if set, else an embedded Valkey started for the
run. Exits 0 if every order ended as planned, 1 otherwise.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from dramatiq.cli import LOGFORMAT

from dramatiq_redisson.embedded import redis_url


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, provide a server and run the demo."""
    parser = argparse.ArgumentParser(prog="python -m example_app", description=__doc__)
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="log INFO (-v) or DEBUG (-vv) messages to stderr"
    )
    args = parser.parse_args(argv)
    levels = {0: logging.WARNING, 1: logging.INFO}
    logging.basicConfig(level=levels.get(args.verbose, logging.DEBUG), format=LOGFORMAT, stream=sys.stderr)

    with redis_url() as url:
        # example_app.tasks builds its broker from $REDIS_URL at import time.
        os.environ["REDIS_URL"] = url
        from .demo import run

        return run()


if __name__ == "__main__":
    sys.exit(main())
