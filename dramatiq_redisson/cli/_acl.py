"""``acl-rule``: the least-privilege ACL rule, for the connected server or a given version."""

from __future__ import annotations

import argparse
import sys

from .. import acl_rule
from ..connection._acl_rule import rule_layout
from ..connection._server import describe as describe_server
from ..connection._server import parse_version
from ._base import EXIT_OK, Command, Context, UsageError
from ._output import Output


def acl_rule_output(out: Output, rule: str, server: str, *, namespace: str, cluster: bool, user: str = "<user>") -> int:
    """Print an ACL rule as the ACL SETUSER command to apply (``--json``: a document)."""
    command = f"ACL SETUSER {user} on ><password> {rule}"
    if out.json_mode:
        out.json({"server": server, "namespace": namespace, "cluster": cluster, "rule": rule, "command": command})
    else:
        out.note(f"Least-privilege rule for {server}{rule_layout(cluster).aside}:")
        sys.stdout.write(command + "\n")
    return EXIT_OK


def _acl_rule_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server-version",
        metavar="X.Y[.Z]",
        help="render for this server version without connecting (e.g. 7.0; Valkey numbers from 7.2)",
    )
    parser.add_argument("--wait-for-replicas", action="store_true", help="add +wait (a broker with wait_for_replicas)")
    parser.add_argument("--user", default="<user>", help="the user name to put in the ACL SETUSER command")


def cmd_acl_rule(ctx: Context) -> int:
    broker, args = ctx.broker, ctx.args
    rule = broker.acl_rule(wait_for_replicas=True if args.wait_for_replicas else None)
    name, version = min(broker.check_server().values(), key=lambda entry: entry[1])
    server = describe_server(name, version)
    return acl_rule_output(ctx.out, rule, server, namespace=broker.namespace, cluster=broker.cluster, user=args.user)


ACL_RULE = Command(
    "acl-rule",
    "print the least-privilege ACL rule for the broker's user, rendered for the connected server's version",
    cmd_acl_rule,
    _acl_rule_arguments,
)


def offline_acl_rule(args: argparse.Namespace, out: Output) -> int:
    """``acl-rule --server-version X.Y[.Z]`` without a broker: the rule for that version."""
    version = parse_version(args.server_version)
    if version < (6, 2, 0):
        raise UsageError(f"--server-version {args.server_version}: the broker needs Redis >= 6.2 or Valkey")
    namespace = args.namespace or "dramatiq"
    rule = acl_rule(namespace, cluster=args.cluster, wait_for_replicas=args.wait_for_replicas, server_version=version)
    server = f"server version {'.'.join(map(str, version))}"
    return acl_rule_output(out, rule, server, namespace=namespace, cluster=args.cluster, user=args.user)
