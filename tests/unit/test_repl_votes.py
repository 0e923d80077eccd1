"""Votes (shardsim/core/repl/votes.py): the voter's rule in the server's order, one vote per term,
dry runs that record nothing, and the candidate's tally."""

from __future__ import annotations

from shardsim.core.repl import LastVote, OpTime, Rules, process_request_votes
from shardsim.core.repl.messages import RequestVotes, VoteResponse
from shardsim.core.repl.votes import VoteTally


def req(term=3, candidate=1, applied=OpTime(ts=10, t=2), dry_run=False, set_name="rs0",
        version=1):
    return RequestVotes(set_name, version, term, candidate, applied, dry_run)


def vote(r, *, my_term=2, applied=OpTime(ts=10, t=2), last_vote=LastVote(2, 0), rules=Rules()):
    return process_request_votes(r, voter_id=0, my_term=my_term, set_name="rs0",
                                 config_version=1, my_last_applied=applied,
                                 last_vote=last_vote, rules=rules)


def test_a_fresh_candidate_in_a_new_term_gets_the_vote_and_it_is_recorded():
    resp, lv = vote(req())
    assert resp.vote_granted and resp.reason == "" and resp.voter_id == 0
    assert lv == LastVote(3, 1)


def test_one_vote_per_term():
    _, lv = vote(req(candidate=1))
    resp, lv2 = vote(req(candidate=2), my_term=3, last_vote=lv)
    assert not resp.vote_granted and lv2 == lv
    assert resp.reason == "already voted for another candidate (1) this term (3)"


def test_a_dry_run_is_granted_without_recording_a_vote():
    resp, lv = vote(req(term=2, dry_run=True))
    assert resp.vote_granted and lv == LastVote(2, 0)
    # and a dry run is not refused for a vote already given in that term
    resp, _ = vote(req(term=3, dry_run=True), my_term=3, last_vote=LastVote(3, 2))
    assert resp.vote_granted


def test_the_freshness_check():
    resp, lv = vote(req(applied=OpTime(ts=9, t=2)))
    assert not resp.vote_granted and lv == LastVote(2, 0)
    assert resp.reason.startswith("candidate's data is staler than mine. candidate's last "
                                  "applied OpTime: { ts: Timestamp(0, 9), t: 2 }")
    # the term of the last entry counts first: an older term loses even with a later ts
    resp, _ = vote(req(applied=OpTime(ts=99, t=1)))
    assert not resp.vote_granted
    # equal is fresh enough
    assert vote(req(applied=OpTime(ts=10, t=2)))[0].vote_granted


def test_stale_term_set_name_and_config_version_are_refused_in_that_order():
    resp, _ = vote(req(term=1, set_name="other", applied=OpTime(ts=1, t=1)))
    assert resp.reason == "candidate's term (1) is lower than mine (2)"
    resp, _ = vote(req(version=2, set_name="other"))
    assert resp.reason == "candidate's config version (2) differs from mine (1)"
    resp, _ = vote(req(set_name="other"))
    assert resp.reason == "candidate's set name (other) differs from mine (rs0)"
    assert resp.term == 2


def test_the_mutation_switches_break_exactly_their_rule():
    _, lv = vote(req(candidate=1))
    assert vote(req(candidate=2), my_term=3, last_vote=lv, rules=Rules(vote_twice=True))[0] \
        .vote_granted
    assert vote(req(applied=OpTime(ts=1, t=1)), rules=Rules(skip_freshness=True))[0].vote_granted


def yes(voter, term=3, dry=False, granted=True, voter_term=None):
    return VoteResponse(voter, voter_term if voter_term is not None else term, granted, "",
                        dry, term)


def test_tally_counts_a_majority_of_voters_once_each():
    t = VoteTally(3, False, 3, frozenset(range(5)))
    t.yes.add(0)
    t.record(yes(1))
    t.record(yes(1))
    assert not t.won
    t.record(yes(7))                      # not a voter
    t.record(yes(2, term=2))              # an answer for another round
    t.record(yes(2, dry=True))            # an answer of the dry run
    assert not t.won
    t.record(yes(2))
    assert t.won and not t.lost


def test_tally_is_lost_when_a_majority_refused_or_a_higher_term_answered():
    t = VoteTally(3, False, 2, frozenset(range(3)))
    t.yes.add(0)
    t.record(yes(1, granted=False))
    assert not t.lost
    t.record(yes(2, granted=False))
    assert t.lost and not t.won
    t = VoteTally(3, False, 2, frozenset(range(3)))
    t.yes.add(0)
    t.record(yes(1, granted=False, voter_term=5))
    assert t.lost and t.higher_term == 5
