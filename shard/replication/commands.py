"""The replication commands of a replica-set member (``src/mongo/db/repl/repl_set_commands.cpp``,
``repl_set_request_votes.cpp``, ``repl_set_get_status_cmd.cpp``).

Between members: ``replSetHeartbeat``, ``replSetRequestVotes``, ``replSetUpdatePosition``, the
oplog fetcher's ``_shardsimFetchOplog`` and the rollback's ``_shardsimRefetch`` (internal
privilege). For operators and drivers: ``replSetGetStatus``, ``replSetGetConfig``,
``replSetStepDown``, ``replSetStepUp``, ``replSetFreeze``, ``replSetGetRBID``. They are installed
on members of more than one node (:meth:`shard.node.ShardNode.start_replication`).
"""

from __future__ import annotations

import datetime
import time
from typing import Any

from bson.int64 import Int64
from bson.timestamp import Timestamp

from shardsim.core.auth import privileges as priv
from shardsim.core.commands import CommandFamily, Request
from shardsim.core.errors import MongoError
from shardsim.core.protocol import repl as wire
from shardsim.core.repl.member_state import MemberState, ReplError
from shardsim.core.repl.optime import NULL_OPTIME, OpTime
from shardsim.core.repl.stepdown import parse_step_down
from shardsim.shard.replication.coordinator import member_error

commands = CommandFamily("replication")
STATE_CHANGE = priv.on_cluster("replSetStateChange")


def _date(op: OpTime) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(max(op.ts, 0) >> 32, datetime.timezone.utc) \
        .replace(tzinfo=None)


@commands.handler("replSetHeartbeat", secondary="always", privileges=priv.INTERNAL)
async def repl_set_heartbeat(node: Any, req: Request) -> dict[str, Any]:
    """A member's heartbeat: the core's answer (``processHeartbeatV1``)."""
    r = node.repl.receive(wire.parse_heartbeat(req.body))
    return wire.heartbeat_reply(r)


@commands.handler("replSetRequestVotes", secondary="always", privileges=priv.INTERNAL)
async def repl_set_request_votes(node: Any, req: Request) -> dict[str, Any]:
    """A candidate asks for this member's vote; the vote is persisted before the reply."""
    r = node.repl.receive(wire.parse_request_votes(req.body))
    return wire.vote_reply(r)


@commands.handler("replSetUpdatePosition", secondary="always", privileges=priv.INTERNAL)
async def repl_set_update_position(node: Any, req: Request) -> dict[str, Any]:
    """Positions of the members downstream (``processReplSetUpdatePosition``)."""
    node.repl.receive(wire.parse_update_position(req.body))
    return {}


@commands.handler(wire.FETCH_OPLOG, secondary="always", privileges=priv.INTERNAL)
async def fetch_oplog(node: Any, req: Request) -> dict[str, Any]:
    """The sync source's side of the oplog fetcher (see ``ReplicationCoordinator.serve_fetch``)."""
    return await node.repl.serve_fetch(req.body)


@commands.handler(wire.REFETCH, secondary="always", privileges=priv.INTERNAL)
async def refetch(node: Any, req: Request) -> dict[str, Any]:
    """The rollback's refetch (rs_rollback.cpp ``syncFixUp``): the current version of each asked
    document, ``{docs: [{ui, _id}...]}`` -> ``{docs: [{ui, _id, doc?}...]}``, and the oplog from
    a time on (``since``: entries with ``ts >= since``, for the common point)."""
    from shardsim.shard.replication.rollback_run import serve_refetch
    return serve_refetch(node, req.body)


@commands.handler("replSetGetRBID", secondary="always", privileges=priv.INTERNAL)
async def repl_set_get_rbid(node: Any, req: Request) -> dict[str, Any]:
    """The rollback id (``local.system.rollback.id``)."""
    return {"rbid": node.repl.core.durable.rbid}


@commands.handler("replSetStepUp", secondary="always", privileges=STATE_CHANGE)
async def repl_set_step_up(node: Any, req: Request) -> dict[str, Any]:
    """Stand for election now (``CmdReplSetStepUp``); CommandFailed 125 "Election failed."."""
    if req.body.get("fromId") is not None:  # an election handoff from the old primary
        node.repl.handoff()
        return {}
    await node.repl.step_up()
    return {}


@commands.handler("replSetStepDown", secondary="always", privileges=STATE_CHANGE)
async def repl_set_step_down(node: Any, req: Request) -> dict[str, Any]:
    """``{replSetStepDown: secs, secondaryCatchUpPeriodSecs, force}`` (``CmdReplSetStepDown``):
    waits for an electable secondary to catch up, then steps down (writes killed with 11602,
    ``w`` waiters failed with 189, reads and cursors kept); 262 when none caught up in time."""
    try:
        secs, catch_up, force = parse_step_down(req.body)
    except ReplError as err:
        raise member_error(err) from None
    await node.repl.step_down(secs, catch_up, force)
    return {}


@commands.handler("replSetFreeze", secondary="always", privileges=STATE_CHANGE)
async def repl_set_freeze(node: Any, req: Request) -> dict[str, Any]:
    """``{replSetFreeze: secs}``: do not stand for ``secs`` seconds (0 unfreezes)."""
    secs = req.arg
    if isinstance(secs, bool) or not isinstance(secs, (int, float)):
        raise MongoError(14, "BSON field 'replSetFreeze.replSetFreeze' is the wrong type, "
                             "expected type 'int'")
    reply = node.repl.freeze(int(secs))
    reply.pop("ok", None)
    return reply


@commands.handler("replSetGetConfig", secondary="always",
                  privileges=priv.on_cluster("replSetGetConfig"))
async def repl_set_get_config(node: Any, req: Request) -> dict[str, Any]:
    """``{config: {_id, version, term, protocolVersion, members, settings}}``
    (``ReplSetConfig::toBSON``)."""
    return {"config": config_doc(node)}


def config_doc(node: Any) -> dict[str, Any]:
    """The set's configuration document as mongod stores it in ``local.system.replset``; a
    config server's has ``configsvr: true`` (``ReplSetConfig::getConfigServer``, required of
    a ``--configsvr`` member's set by ``replset_config.idl`` / ``validateConfigForInitiate``)."""
    repl = node.repl
    cfg = repl.config
    return {"_id": cfg.set_name, "version": cfg.version, "term": repl.core.term,
            "members": [{"_id": m.id, "host": m.host, "arbiterOnly": False,
                         "buildIndexes": True, "hidden": False, "priority": m.priority,
                         "tags": {}, "secondaryDelaySecs": Int64(0), "votes": m.votes}
                        for m in cfg.members],
            "protocolVersion": Int64(1), "writeConcernMajorityJournalDefault": True,
            "settings": {"chainingAllowed": cfg.chaining_allowed,
                         "heartbeatIntervalMillis": cfg.heartbeat_interval_ms,
                         "heartbeatTimeoutSecs": max(1, cfg.heartbeat_timeout_ms // 1000),
                         "electionTimeoutMillis": cfg.election_timeout_ms,
                         "catchUpTimeoutMillis": cfg.catch_up_timeout_ms,
                         "catchUpTakeoverDelayMillis": 30000,
                         "getLastErrorModes": {}, "getLastErrorDefaults": {"w": 1, "wtimeout": 0},
                         "replicaSetId": repl.replica_set_id},
            **({"configsvr": True} if node.role == "configsvr" else {})}


@commands.handler("replSetGetStatus", secondary="always",
                  privileges=priv.on_cluster("replSetGetStatus"))
async def repl_set_get_status(node: Any, req: Request) -> dict[str, Any]:
    """The member's view of the set (``TopologyCoordinator::prepareStatusResponse``): its state,
    term, optimes and commit point, and every member's state, health, optimes and heartbeat
    times."""
    return status_doc(node)


def status_doc(node: Any) -> dict[str, Any]:
    """The ``replSetGetStatus`` reply fields (see :func:`repl_set_get_status`)."""
    repl = node.repl
    core = repl.core
    cfg = repl.config
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    src = core.sync_source
    src_host = cfg.member(src).host if src is not None else ""
    members = []
    for m in cfg.members:
        if m.id == core.id:
            doc: dict[str, Any] = {
                "_id": m.id, "name": m.host, "health": 1.0, "state": int(core.state),
                "stateStr": core.state.state_str,
                "uptime": int(time.monotonic() - node.started_mono),
                "optime": wire.optime_doc(core.applied), "optimeDate": _date(core.applied),
                "lastAppliedWallTime": _date(core.applied),
                "lastDurableWallTime": _date(core.durable_optime),
                "syncSourceHost": src_host, "syncSourceId": -1 if src is None else src,
                "infoMessage": "", "configVersion": cfg.version, "configTerm": core.term,
                "self": True, "lastHeartbeatMessage": ""}
            if core.role == "leader":
                doc["electionTime"] = Timestamp(max(core.first_op_of_term.ts, 0) >> 32, 1) \
                    if core.writable else Timestamp(0, 0)
                doc["electionDate"] = _date(core.first_op_of_term) if core.writable else now
            members.append(doc)
            continue
        v = core.views[m.id]
        members.append({
            "_id": m.id, "name": m.host, "health": 1.0 if v.up else 0.0, "state": int(v.state),
            "stateStr": v.state.state_str, "uptime": 0,
            "optime": wire.optime_doc(v.applied), "optimeDurable": wire.optime_doc(v.durable),
            "optimeDate": _date(v.applied), "optimeDurableDate": _date(v.durable),
            "lastAppliedWallTime": _date(v.applied), "lastDurableWallTime": _date(v.durable),
            "lastHeartbeatMessage": "",
            "syncSourceHost": cfg.member(v.sync_source_id).host
            if v.sync_source_id is not None else "",
            "syncSourceId": -1 if v.sync_source_id is None else v.sync_source_id,
            "infoMessage": "", "configVersion": cfg.version, "configTerm": core.term})
    commit = core.commit_point
    return {
        "set": cfg.set_name, "date": now, "myState": int(core.state), "term": Int64(core.term),
        "syncSourceHost": src_host, "syncSourceId": -1 if src is None else src,
        "heartbeatIntervalMillis": Int64(cfg.heartbeat_interval_ms),
        "majorityVoteCount": cfg.majority_vote_count, "writeMajorityCount": cfg.write_majority,
        "votingMembersCount": len(cfg.voter_ids), "writableVotingMembersCount": len(cfg.voter_ids),
        "optimes": {"lastCommittedOpTime": wire.optime_doc(commit),
                    "lastCommittedWallTime": _date(commit),
                    "readConcernMajorityOpTime": wire.optime_doc(core.readable_point),
                    "appliedOpTime": wire.optime_doc(core.applied),
                    "durableOpTime": wire.optime_doc(core.durable_optime),
                    "lastAppliedWallTime": _date(core.applied),
                    "lastDurableWallTime": _date(core.durable_optime)},
        "lastStableRecoveryTimestamp": wire.optime_doc(commit)["ts"]
        if commit != NULL_OPTIME else Timestamp(0, 0),
        "members": members}


def hello_fields(node: Any) -> dict[str, Any]:
    """The replication part of ``hello`` in mongod's order (``appendReplicationInfo``,
    ``HelloResponse::addToBSON``): ``hosts``, ``setName``, ``setVersion``, ``isWritablePrimary``,
    ``secondary``, ``primary``, ``me``, ``electionId``, ``lastWrite``."""
    core = node.repl.core
    base = core.hello_fields()
    doc: dict[str, Any] = {"hosts": base["hosts"]}
    if "passives" in base:
        doc["passives"] = base["passives"]
    doc.update({"setName": base["setName"], "setVersion": base["setVersion"],
                "isWritablePrimary": base["isWritablePrimary"], "secondary": base["secondary"]})
    if "primary" in base:
        doc["primary"] = base["primary"]
    doc["me"] = base["me"]
    if "electionId" in base:
        doc["electionId"] = base["electionId"]
    if core.state in (MemberState.PRIMARY, MemberState.SECONDARY):
        applied, majority = core.applied, core.readable_point
        doc["lastWrite"] = {"opTime": wire.optime_doc(applied), "lastWriteDate": _date(applied),
                            "majorityOpTime": wire.optime_doc(majority),
                            "majorityWriteDate": _date(majority)}
    return doc
