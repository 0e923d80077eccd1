"""Which commands a replica-set member runs in its current state, and the links a fault cut.

A command hook (:class:`shardsim.core.node.CommandHook`) on every member of more than one node,
doing what the server's service entry point does before a command
(``service_entry_point_shard_role.cpp`` ``ExecCommandDatabase::_initiateCommand`` with
``Command::secondaryAllowed``; ``ReplicationCoordinator::checkCanServeReadsFor``):

* a command declared ``secondary="never"`` (writes, DDL, internal writes: the default of
  :class:`shardsim.core.commands.CommandSpec`) on a member that is not the writable primary:
  NotWritablePrimary 10107 ``not primary``;
* ``"optIn"`` (reads) without ``secondaryOk`` (a ``$readPreference`` other than ``primary``):
  NotPrimaryNoSecondaryOk 13435 ``not primary and secondaryOk=false``; with it, on a member that
  is neither primary nor secondary (ROLLBACK, RECOVERING, STARTUP2): NotPrimaryOrSecondary 13436
  ``node is not in primary or recovering state``;
* ``"always"``: runs in any state.

Errors of that kind carry the member's ``topologyVersion`` (``appendErrorLabelsAndTopologyVersion``
in ``service_entry_point_common.cpp``) so that drivers can order them against ``hello``
answers. A retryable write gets the ``RetryableWriteError`` label (error_labels.cpp).

The state check runs after the ``failCommand`` fail point (:mod:`shardsim.core.failpoints`), as
in mongod, where ``ExecCommandDatabase::_initiateCommand`` evaluates the fail point
(``CommandHelpers::evaluateFailCommandFailPoint``) before it checks that the member may run the
command: a command held by ``blockConnection`` while its member steps down is refused with
NotWritablePrimary instead of writing on a secondary. The links are checked first
(:class:`LinkHook`) and again after the fail point.

While the test kit isolates the member (:meth:`ReplicationCoordinator.isolate`) every command,
from clients and members alike, loses its connection unanswered (ConnectionError), as a cut
network link would; a partition drops the member commands of the cut members only.
"""

from __future__ import annotations

from typing import Any

from shardsim.core.commands import Request
from shardsim.core.errors import MongoError
from shardsim.core.protocol.repl import MEMBER_COMMANDS
from shardsim.core.repl.member_state import MemberState

# NotWritablePrimary, NotPrimaryNoSecondaryOk, NotPrimaryOrSecondary, InterruptedDueToReplStateChange,
# PrimarySteppedDown: the "not primary" errors that carry topologyVersion
NOT_PRIMARY_CODES = frozenset({10107, 13435, 13436, 11602, 189})
RETRYABLE_WRITE_CODES = frozenset({10107, 13435, 13436, 11602, 189, 91, 7, 6, 89, 9001, 262})


def secondary_ok(req: Request) -> bool:
    """The request allows a secondary: ``$readPreference.mode`` other than ``primary``."""
    pref = req.body.get("$readPreference")
    return isinstance(pref, dict) and pref.get("mode", "primary") != "primary"


class LinkHook:
    """The first hook of a member: a command over a link the test kit cut loses its connection
    unanswered (ConnectionError), before any fail point sees it."""

    def __init__(self, node: Any) -> None:
        self.node = node

    async def before_command(self, req: Request) -> dict[str, Any] | None:
        repl = self.node.repl
        if repl.isolated:
            raise ConnectionError("the member is isolated")
        if req.name in MEMBER_COMMANDS:
            sender = req.body.get("fromId")
            if isinstance(sender, int) and repl.link_down(sender):
                raise ConnectionError("the link to that member is cut")
        return None

    def after_command(self, req: Request, reply: dict[str, Any]) -> None:
        pass


class ReplicationHook(LinkHook):
    """The state check of one member, after the fail points (see the module docstring)."""

    async def before_command(self, req: Request) -> dict[str, Any] | None:
        await LinkHook.before_command(self, req)
        repl = self.node.repl
        name = req.name
        if name in MEMBER_COMMANDS:
            return None
        if repl.writable or not self.node.commands.has(name):
            return None  # an unknown command fails as CommandNotFound in any state
        spec = self.node.commands.spec(name)
        policy = spec.secondary
        if policy == "always":
            return None
        state = repl.state
        if policy == "optIn" and secondary_ok(req):
            if state in (MemberState.PRIMARY, MemberState.SECONDARY):
                return None
            exc = MongoError(13436, "node is not in primary or recovering state")
        elif policy == "optIn":
            exc = MongoError(13435, "not primary and secondaryOk=false")
        else:
            exc = MongoError(10107, "not primary")
        return self.error_reply(req, exc)

    def error_reply(self, req: Request, exc: MongoError) -> dict[str, Any]:
        """The reply of a "not primary" error: labels, ``topologyVersion``, cluster time."""
        if req.body.get("txnNumber") is not None and req.body.get("autocommit") is None and \
                self.node.commands.spec(req.name).retryable_write \
                and exc.code in RETRYABLE_WRITE_CODES:
            exc.labels = ["RetryableWriteError"]
        elif req.body.get("autocommit") is False and exc.code in NOT_PRIMARY_CODES:
            exc.labels = ["TransientTransactionError"]
        reply = exc.to_reply()
        if exc.code in NOT_PRIMARY_CODES:
            reply["topologyVersion"] = self.node.topology_version.doc()
        self.node.cluster_time_fields(req, reply)
        return reply

    def after_command(self, req: Request, reply: dict[str, Any]) -> None:
        if type(reply) is dict and not reply.get("ok", 1) and \
                reply.get("code") in NOT_PRIMARY_CODES and "topologyVersion" not in reply:
            reply["topologyVersion"] = self.node.topology_version.doc()
