"""A fleet of the previous release and of this tree on the same keys (issue 58): the
names the test and its app (``upgrade_app``) share."""

#: The queue of the app's actor.
QUEUE = "upgrade"
#: The records, lists of JSON on the server (see ``upgrade_app``).
PROCS, SENT, RUNS = "upgrade:procs", "upgrade:sent", "upgrade:runs"
#: The producers stop once this key exists.
STOP_PRODUCING = "upgrade:stop-producing"


def burst_key(release: str) -> str:
    """The list a producer of ``release`` takes its bursts from."""
    return f"upgrade:burst:{release}"
