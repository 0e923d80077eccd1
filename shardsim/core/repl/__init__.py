"""The replication core: protocol version 1 as pure state machines (sans-IO).

No sockets, no asyncio, no clock and no randomness of its own: the caller passes the time (ms)
and a seeded ``random.Random``, delivers messages and carries out effects. Nothing here imports
the roles (router, shard, configsvr) or another shardsim module; the shard node drives it
through :class:`ReplNode` (see docs/replication.md for the interface).

Modules: :mod:`.optime` (OpTime, electionId), :mod:`.config` (members, priority, votes,
timing), :mod:`.member_state` (states, errors), :mod:`.messages` (messages and effects as
data), :mod:`.votes` (last vote, the voter's rule, the tally), :mod:`.commit_point` (the
majority commit point), :mod:`.rollback` (common point and what to undo), :mod:`.sync_source`
(sync-source choice, oplog fetch), :mod:`.node` (``ReplNode``), with :mod:`.elections` and
:mod:`.stepdown`.
"""

from .commit_point import advance_commit_point, majority_point, readable_point
from .config import MemberConfig, ReplSetConfig
from .member_state import MemberState, ReplError
from .node import DurableState, ReplNode
from .optime import NULL_OPTIME, OpTime, election_id, optime_of
from .rollback import RollbackPlan, find_common_point, plan_rollback
from .stepdown import parse_step_down
from .sync_source import choose_sync_source, serve_fetch
from .votes import LastVote, Rules, process_request_votes

__all__ = ["advance_commit_point", "majority_point", "readable_point", "MemberConfig",
           "ReplSetConfig", "MemberState", "ReplError", "DurableState", "ReplNode", "NULL_OPTIME",
           "OpTime", "election_id", "optime_of", "RollbackPlan", "find_common_point",
           "plan_rollback", "parse_step_down", "choose_sync_source", "serve_fetch", "LastVote",
           "Rules", "process_request_votes"]
