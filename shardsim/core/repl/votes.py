"""Votes: the persisted last vote, the voter's decision, and the candidate's tally.

After src/mongo/db/repl/topology_coordinator.cpp ``TopologyCoordinator::processReplSetRequestVotes``
(the voter), vote_requester.cpp ``VoteRequester::Algorithm`` (the candidate's tally) and
last_vote.h (``LastVote``: the ``{term, candidateIndex}`` document in
``local.replset.election``). Pure functions over values: the caller persists the returned
:class:`LastVote` before sending the answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .messages import RequestVotes, VoteResponse
from .optime import OpTime, format_optime


@dataclass(frozen=True)
class LastVote:
    """The one vote a member gave: in ``term``, for ``candidate_id`` (-1: none yet). Persisted
    (``local.replset.election``), so a restarted member never votes twice in a term."""

    term: int = -1
    candidate_id: int = -1


@dataclass(frozen=True)
class Rules:
    """Switches that break one protocol rule each, for the simulation's mutation checks only
    (all False in production): ``vote_twice`` ignores the last vote, ``skip_freshness`` grants
    votes to staler candidates, ``commit_earlier_term`` lets a primary commit entries of earlier
    terms before one of its own term commits."""

    vote_twice: bool = False
    skip_freshness: bool = False
    commit_earlier_term: bool = False


NO_RULE_BROKEN = Rules()


def process_request_votes(req: RequestVotes, *, voter_id: int, my_term: int, set_name: str,
                          config_version: int, my_last_applied: OpTime, last_vote: LastVote,
                          rules: Rules = NO_RULE_BROKEN) -> tuple[VoteResponse, LastVote]:
    """The voter's decision (``TopologyCoordinator::processReplSetRequestVotes``), in the
    server's order: a lower term, another config version, another set name, a candidate whose
    last applied optime is older than the voter's (the freshness check), and (real elections
    only) a vote already given in this term or later are refused with the server's reasons.
    A dry run never records a vote. The caller has already adopted ``req.term`` if it was newer
    (``my_term`` is the term after that).

    Returns ``(response, last_vote)``; ``last_vote`` is new when a real vote was granted."""

    def no(reason: str) -> tuple[VoteResponse, LastVote]:
        return VoteResponse(voter_id, my_term, False, reason, req.dry_run, req.term), last_vote

    if req.term < my_term:
        return no(f"candidate's term ({req.term}) is lower than mine ({my_term})")
    if req.config_version != config_version:
        return no(f"candidate's config version ({req.config_version}) differs from mine "
                  f"({config_version})")
    if req.set_name != set_name:
        return no(f"candidate's set name ({req.set_name}) differs from mine ({set_name})")
    if req.last_applied < my_last_applied and not rules.skip_freshness:
        return no("candidate's data is staler than mine. candidate's last applied OpTime: "
                  f"{format_optime(req.last_applied)}, my last applied OpTime: "
                  f"{format_optime(my_last_applied)}")
    if not req.dry_run and last_vote.term >= req.term and not rules.vote_twice:
        return no(f"already voted for another candidate ({last_vote.candidate_id}) this term "
                  f"({last_vote.term})")
    if not req.dry_run:
        last_vote = LastVote(req.term, req.candidate_id)
    return VoteResponse(voter_id, my_term, True, "", req.dry_run, req.term), last_vote


@dataclass
class VoteTally:
    """The candidate's count for one round (``VoteRequester::Algorithm``): its own vote counts;
    ``won`` once ``majority`` voters said yes, ``lost`` once that can no longer happen or a
    voter answered with a higher term (``higher_term``)."""

    term: int
    dry_run: bool
    majority: int
    voters: frozenset
    yes: set = field(default_factory=set)
    no: set = field(default_factory=set)
    higher_term: int = -1

    def record(self, resp: VoteResponse) -> None:
        """Count one answer (answers for another round or from a non-voter are ignored)."""
        if resp.request_term != self.term or resp.dry_run != self.dry_run:
            return
        if resp.voter_id not in self.voters or resp.voter_id in self.yes | self.no:
            return
        if resp.term > self.term:
            self.higher_term = max(self.higher_term, resp.term)
        (self.yes if resp.vote_granted else self.no).add(resp.voter_id)

    @property
    def won(self) -> bool:
        """A majority of the voters granted the vote (and no higher term was seen)."""
        return self.higher_term < 0 and len(self.yes) >= self.majority

    @property
    def lost(self) -> bool:
        """A higher term was seen, or too many voters refused for a majority to remain."""
        return self.higher_term >= 0 or len(self.voters) - len(self.no) < self.majority
