"""The replica-set configuration the core needs: members with priority and votes, and the
timing settings (src/mongo/db/repl/repl_set_config.{h,cpp}, member_config.h).

Defaults are the server's (``ReplSetConfig::kDefault*``): electionTimeoutMillis 10000,
heartbeatIntervalMillis 2000, heartbeatTimeoutSecs 10, catchUpTimeoutMillis -1 (no limit),
chainingAllowed true. Times are milliseconds of the caller's clock.
``priority_takeover_freshness_ts`` is ``priorityTakeoverFreshnessWindowSeconds`` (2) in the
units of :func:`shardsim.core.repl.optime.ts_int` (``secs << 32``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .member_state import ReplError


@dataclass(frozen=True)
class MemberConfig:
    """One ``members[]`` entry: ``_id`` (``id``), ``host``, ``priority`` (0: never stands for
    election), ``votes`` (0 or 1)."""

    id: int
    host: str
    priority: float = 1.0
    votes: int = 1

    @property
    def electable(self) -> bool:
        """Priority above 0 (``MemberConfig::isElectable``; no arbiters here)."""
        return self.priority > 0

    @property
    def voter(self) -> bool:
        """Counts in elections and in the write majority (``MemberConfig::isVoter``)."""
        return self.votes > 0


@dataclass(frozen=True)
class ReplSetConfig:
    """``set_name`` (``_id``), ``members``, ``version``; the settings in milliseconds.

    Raises :class:`ReplError` InvalidReplicaSetConfig 93 for what ``ReplSetConfig::validate``
    refuses here: no members, duplicate ``_id`` or host, votes not 0/1, a non-voter with a
    priority, or no voter."""

    set_name: str
    members: tuple[MemberConfig, ...]
    version: int = 1
    election_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 2_000
    heartbeat_timeout_ms: int = 10_000
    catch_up_timeout_ms: int = -1
    chaining_allowed: bool = True
    priority_takeover_freshness_ts: int = 2 << 32
    _by_id: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        def invalid(msg: str) -> ReplError:
            return ReplError(93, "InvalidReplicaSetConfig", msg)
        if not self.members:
            raise invalid("Replica set configuration must contain at least one member")
        ids = [m.id for m in self.members]
        if len(set(ids)) != len(ids) or len({m.host for m in self.members}) != len(ids):
            raise invalid("Found two member configurations with same _id or host field")
        for m in self.members:
            if m.votes not in (0, 1):
                raise invalid(f"votes field value is {m.votes} but must be 0 or 1")
            if m.votes == 0 and m.priority != 0:
                raise invalid("priority must be 0 when non-voting (votes:0)")
        if not any(m.voter for m in self.members):
            raise invalid("Replica set configuration must contain at least one voting member")
        self._by_id.update({m.id: m for m in self.members})

    def member(self, member_id: int) -> MemberConfig:
        """The member with ``_id`` ``member_id`` (KeyError if none)."""
        return self._by_id[member_id]

    @property
    def ids(self) -> list[int]:
        """Every member ``_id``, in config order."""
        return [m.id for m in self.members]

    @property
    def voter_ids(self) -> list[int]:
        """The voting members' ``_id`` s."""
        return [m.id for m in self.members if m.voter]

    @property
    def majority_vote_count(self) -> int:
        """Votes needed to win an election: a strict majority of the voters
        (``ReplSetConfig::_calculateMajorities``)."""
        return len(self.voter_ids) // 2 + 1

    @property
    def write_majority(self) -> int:
        """Members whose position a majority write needs: min(majority, data-bearing voters);
        with no arbiters it equals :attr:`majority_vote_count`."""
        return self.majority_vote_count

    def priority_rank(self, member_id: int) -> int:
        """How many members have a higher priority (``ReplSetConfig::calculatePriorityRank``):
        0 for the highest; the priority-takeover delay is ``(rank + 1) * electionTimeout``."""
        mine = self.member(member_id).priority
        return sum(1 for m in self.members if m.priority > mine)
