"""The messages between members of a replica set, on the wire.

The replication core (:mod:`shardsim.core.repl`) speaks in frozen dataclasses
(:mod:`shardsim.core.repl.messages`); a member process sends them to another member as commands
and turns the replies back into those dataclasses here, so the core stays sans-IO and every wire
shape is declared in one place. The command names are the server's where it has one
(``replSetHeartbeat``, ``replSetRequestVotes``, ``replSetUpdatePosition``, ``replSetStepUp``:
``src/mongo/db/repl/repl_set_commands.cpp``, ``repl_set_request_votes.cpp``); the field names
follow the server's argument classes (``repl_set_heartbeat_args_v1.cpp``,
``repl_set_request_votes_args.cpp``, ``update_position_args.cpp``). The oplog fetcher's query is
shardsim's own request, ``_shardsimFetchOplog`` (the server's fetcher runs ``find`` +
``getMore`` on ``local.oplog.rs`` with ``$oplogQueryData``/``$replData`` metadata,
``oplog_fetcher.cpp``; one request per batch carries the same information).

OpTimes travel as ``{ts: Timestamp, t: long}`` (``OpTime::toBSON``).
"""

from __future__ import annotations

from typing import Any, Mapping

from bson.int64 import Int64
from bson.timestamp import Timestamp

from shardsim.core.repl.member_state import MemberState, ReplError
from shardsim.core.repl.messages import (FetchReply, FetchRequest, Heartbeat, HeartbeatResponse,
                                         MemberPosition, OplogQueryMetadata, RequestVotes,
                                         StepUpRequest, UpdatePosition, VoteResponse)
from shardsim.core.repl.optime import OpTime, ts_int

FETCH_OPLOG = "_shardsimFetchOplog"
# Every command a member sends to another member (the replication hook lets them through in any
# member state, and they need the internal privilege).
MEMBER_COMMANDS = ("replSetHeartbeat", "replSetRequestVotes", "replSetUpdatePosition",
                   "replSetStepUp", FETCH_OPLOG)


def optime_doc(op: OpTime) -> dict[str, Any]:
    """``{ts: Timestamp, t: long}``."""
    return {"ts": Timestamp(op.ts >> 32, op.ts & 0xFFFFFFFF) if op.ts >= 0 else Timestamp(0, 0),
            "t": Int64(op.t)}


def parse_optime(doc: Any) -> OpTime:
    """The OpTime of ``{ts, t}``; the null optime ``{ts: Timestamp(0, 0), t: -1}`` included."""
    if not isinstance(doc, Mapping):
        return OpTime(t=-1, ts=0)
    return OpTime(t=int(doc.get("t", -1)), ts=ts_int(doc.get("ts", 0)))


def _opt_id(value: Any) -> int | None:
    return None if value is None or int(value) < 0 else int(value)


# -- replSetHeartbeat ------------------------------------------------------------------------------

def heartbeat_command(msg: Heartbeat) -> dict[str, Any]:
    """``{replSetHeartbeat: setName, configVersion, from, fromId, term, ...}``."""
    return {"replSetHeartbeat": msg.set_name, "configVersion": msg.config_version,
            "fromId": msg.sender_id, "term": Int64(msg.term), "seq": msg.seq}


def parse_heartbeat(body: Mapping[str, Any]) -> Heartbeat:
    """The :class:`Heartbeat` of a ``replSetHeartbeat`` command."""
    return Heartbeat(set_name=str(body["replSetHeartbeat"]), sender_id=int(body["fromId"]),
                     term=int(body["term"]), config_version=int(body.get("configVersion", 1)),
                     seq=int(body.get("seq", 0)))


def heartbeat_reply(r: HeartbeatResponse) -> dict[str, Any]:
    """The reply fields (``ReplSetHeartbeatResponse::toBSON``: ``term``, ``state``,
    ``opTime``/``durableOpTime``, ``primaryId``, ``syncingTo``, ``configVersion``; the commit
    point as ``$replData.lastOpCommitted``)."""
    return {"term": Int64(r.term), "state": int(r.state), "opTime": optime_doc(r.applied),
            "durableOpTime": optime_doc(r.durable),
            "primaryId": -1 if r.primary_id is None else r.primary_id,
            "syncSourceId": -1 if r.sync_source_id is None else r.sync_source_id,
            "configVersion": r.config_version, "seq": r.seq, "fromId": r.sender_id,
            "$replData": {"term": Int64(r.term), "lastOpCommitted": optime_doc(r.commit_point)}}


def parse_heartbeat_reply(doc: Mapping[str, Any]) -> HeartbeatResponse:
    """The :class:`HeartbeatResponse` of a ``replSetHeartbeat`` reply."""
    return HeartbeatResponse(
        sender_id=int(doc["fromId"]), term=int(doc["term"]), state=MemberState(int(doc["state"])),
        applied=parse_optime(doc.get("opTime")), durable=parse_optime(doc.get("durableOpTime")),
        commit_point=parse_optime((doc.get("$replData") or {}).get("lastOpCommitted")),
        primary_id=_opt_id(doc.get("primaryId")), sync_source_id=_opt_id(doc.get("syncSourceId")),
        config_version=int(doc.get("configVersion", 1)), seq=int(doc.get("seq", 0)))


# -- replSetRequestVotes ---------------------------------------------------------------------------

def request_votes_command(msg: RequestVotes) -> dict[str, Any]:
    """``{replSetRequestVotes: 1, setName, dryRun, term, candidateIndex, configVersion,
    lastAppliedOpTime}`` (``ReplSetRequestVotesArgs::addToBSON``; the candidate's ``_id`` stands
    for its index)."""
    return {"replSetRequestVotes": 1, "setName": msg.set_name, "dryRun": msg.dry_run,
            "term": Int64(msg.term), "candidateIndex": msg.candidate_id,
            "configVersion": msg.config_version,
            "lastAppliedOpTime": optime_doc(msg.last_applied)}


def parse_request_votes(body: Mapping[str, Any]) -> RequestVotes:
    """The :class:`RequestVotes` of a ``replSetRequestVotes`` command."""
    return RequestVotes(set_name=str(body["setName"]), config_version=int(body["configVersion"]),
                        term=int(body["term"]), candidate_id=int(body["candidateIndex"]),
                        last_applied=parse_optime(body.get("lastAppliedOpTime")),
                        dry_run=bool(body.get("dryRun")))


def vote_reply(r: VoteResponse) -> dict[str, Any]:
    """``{term, voteGranted, reason}`` (``ReplSetRequestVotesResponse::addToBSON``)."""
    return {"term": Int64(r.term), "voteGranted": r.vote_granted, "reason": r.reason,
            "voterId": r.voter_id, "dryRun": r.dry_run, "requestTerm": Int64(r.request_term)}


def parse_vote_reply(doc: Mapping[str, Any]) -> VoteResponse:
    """The :class:`VoteResponse` of a ``replSetRequestVotes`` reply."""
    return VoteResponse(voter_id=int(doc["voterId"]), term=int(doc["term"]),
                        vote_granted=bool(doc["voteGranted"]), reason=str(doc.get("reason", "")),
                        dry_run=bool(doc.get("dryRun")), request_term=int(doc["requestTerm"]))


# -- replSetUpdatePosition -------------------------------------------------------------------------

def update_position_command(msg: UpdatePosition) -> dict[str, Any]:
    """``{replSetUpdatePosition: 1, optimes: [{memberId, appliedOpTime, durableOpTime, cfgver}]}``
    (``UpdatePositionArgs``), with the sender's term in ``$replData``."""
    return {"replSetUpdatePosition": 1, "fromId": msg.sender_id,
            "optimes": [{"memberId": p.member_id, "appliedOpTime": optime_doc(p.applied),
                         "durableOpTime": optime_doc(p.durable)} for p in msg.positions],
            "$replData": {"term": Int64(msg.term)}}


def parse_update_position(body: Mapping[str, Any]) -> UpdatePosition:
    """The :class:`UpdatePosition` of a ``replSetUpdatePosition`` command."""
    positions = tuple(MemberPosition(int(p["memberId"]), parse_optime(p.get("appliedOpTime")),
                                     parse_optime(p.get("durableOpTime")))
                      for p in body.get("optimes") or ())
    return UpdatePosition(sender_id=int(body["fromId"]),
                          term=int((body.get("$replData") or {}).get("term", -1)),
                          positions=positions)


# -- replSetStepUp ---------------------------------------------------------------------------------

def step_up_command(msg: StepUpRequest) -> dict[str, Any]:
    """``{replSetStepUp: 1, skipDryRun}`` (an election handoff sends ``skipDryRun: true``)."""
    return {"replSetStepUp": 1, "skipDryRun": msg.skip_dry_run, "fromId": msg.sender_id}


# -- the oplog fetcher -----------------------------------------------------------------------------

def fetch_command(msg: FetchRequest) -> dict[str, Any]:
    """``{_shardsimFetchOplog: 1, fromId, term, after: optime, limit}``."""
    return {FETCH_OPLOG: 1, "fromId": msg.requester_id, "term": Int64(msg.term),
            "after": optime_doc(msg.after), "limit": msg.limit}


def parse_fetch(body: Mapping[str, Any]) -> FetchRequest:
    """The :class:`FetchRequest` of a ``_shardsimFetchOplog`` command."""
    return FetchRequest(requester_id=int(body["fromId"]), term=int(body["term"]),
                        after=parse_optime(body.get("after")), limit=int(body.get("limit", 100)))


def metadata_doc(md: OplogQueryMetadata) -> dict[str, Any]:
    """``$oplogQueryData`` (``OplogQueryMetadata::writeToMetadata``) with the source's term."""
    return {"lastOpCommitted": optime_doc(md.commit_point),
            "lastOpApplied": optime_doc(md.last_applied),
            "primaryIndex": -1 if md.primary_id is None else md.primary_id,
            "syncSourceIndex": -1 if md.sync_source_id is None else md.sync_source_id,
            "rbid": md.rbid, "term": Int64(md.term)}


def fetch_reply(source_id: int, md: OplogQueryMetadata, entries: list[Any],
                error: ReplError | None, source_first: OpTime) -> dict[str, Any]:
    """The source's answer: the entries (oldest first, the ``after`` entry first) or the error
    (OplogStartMissing 120), its first optime, and the metadata."""
    doc: dict[str, Any] = {"fromId": source_id, "entries": entries,
                           "sourceFirst": optime_doc(source_first),
                           "$oplogQueryData": metadata_doc(md)}
    if error is not None:
        doc["fetchError"] = {"code": error.code, "codeName": error.code_name,
                             "errmsg": error.errmsg}
    return doc


def parse_fetch_reply(after: OpTime, doc: Mapping[str, Any]) -> FetchReply:
    """The :class:`FetchReply` of a ``_shardsimFetchOplog`` reply."""
    md = doc["$oplogQueryData"]
    err = doc.get("fetchError")
    return FetchReply(
        source_id=int(doc["fromId"]), after=after,
        metadata=OplogQueryMetadata(term=int(md["term"]),
                                    commit_point=parse_optime(md.get("lastOpCommitted")),
                                    last_applied=parse_optime(md.get("lastOpApplied")),
                                    primary_id=_opt_id(md.get("primaryIndex")),
                                    sync_source_id=_opt_id(md.get("syncSourceIndex")),
                                    rbid=int(md.get("rbid", 1))),
        entries=tuple(doc.get("entries") or ()),
        error=None if err is None else ReplError(int(err["code"]), str(err["codeName"]),
                                                 str(err["errmsg"])),
        source_first=parse_optime(doc.get("sourceFirst")))


# -- rollback ----------------------------------------------------------------------------------------

REFETCH = "_shardsimRefetch"
MEMBER_COMMANDS = MEMBER_COMMANDS + (REFETCH, "replSetGetRBID")


def refetch_command(sender_id: int, since: Timestamp | None, keys: list[tuple[bytes, bytes]],
                    *, oplog: bool = False) -> dict[str, Any]:
    """``{_shardsimRefetch: 1, fromId, oplog?, since?, keys: [[k0, k1], ...]}``: with ``oplog``
    the sync source's oplog from ``since`` on (the common point's search, the catch-up), and
    its current version of each key (rs_rollback.cpp ``syncFixUp`` refetches what the
    rolled-back entries touched; the keys are ``shard.replication.rollback``'s, two byte
    strings each)."""
    from bson.binary import Binary
    cmd: dict[str, Any] = {REFETCH: 1, "fromId": sender_id,
                           "keys": [[Binary(k0), Binary(k1)] for k0, k1 in keys]}
    if oplog:
        cmd["oplog"] = True
    if since is not None:
        cmd["since"] = since
    return cmd


def parse_refetch_keys(body: Mapping[str, Any]) -> list[tuple[bytes, bytes]]:
    """The keys of a ``_shardsimRefetch`` command."""
    return [(bytes(k[0]), bytes(k[1])) for k in body.get("keys") or ()]


def refetch_answers(answers: Mapping[tuple[bytes, bytes], Any]) -> list[Any]:
    """The answers as the reply carries them: ``[[k0, k1, doc or null], ...]``."""
    from bson.binary import Binary
    return [[Binary(k0), Binary(k1), doc] for (k0, k1), doc in answers.items()]


def parse_refetch_answers(reply: Mapping[str, Any]) -> dict[tuple[bytes, bytes], Any]:
    """Key -> document (or None) of a ``_shardsimRefetch`` reply."""
    return {(bytes(a[0]), bytes(a[1])): a[2] for a in reply.get("answers") or ()}
