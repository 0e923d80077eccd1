"""MongoDB 8.0's ``bulkWrite`` admin command through the router (client bulk write: one
command, many namespaces; mongos' ``src/mongo/s/commands/cluster_bulk_write_cmd.cpp`` and
``src/mongo/s/write_ops/bulk_write_exec.cpp``, request/reply shapes from
``src/mongo/db/commands/bulk_write.idl``).

Request (on ``admin`` only)::

    {bulkWrite: 1,
     ops: [{insert: <nsInfo index>, document},
           {update: <i>, filter, updateMods, multi?, upsert?, arrayFilters?, hint?,
            collation?, sort?, constants?},
           {delete: <i>, filter, multi?, hint?, collation?}],
     nsInfo: [{ns: "db.coll"}], ordered?: true, errorsOnly?: false,
     bypassDocumentValidation?, let?, comment?, writeConcern?, cursor?: {batchSize}}

Reply: ``{cursor: {id, firstBatch: [reply items], ns: "admin.$cmd.bulkWrite"}, nErrors,
nInserted, nUpserted, nMatched, nModified, nDeleted[, writeConcernError]}``; one reply item per
executed op ``{ok: 1, idx, n[, nModified][, upserted: {_id}]}`` or, for a failed op,
``{ok: 0, idx, code, codeName, errmsg[, keyPattern, keyValue], n: 0[, nModified: 0]}``. With
``errorsOnly: true`` the cursor holds only the failed ops. An ordered bulk write stops at the
first failed op; an unordered one runs every op.

Execution is built on the router's write targeting (:class:`router.writes.WriteExecutor`):
consecutive inserts into one namespace form one ``insert`` child command, every update and
delete its own ``update``/``delete``, each targeted by shard key like a plain write (sharded
and unsharded namespaces alike) behind the namespace's write gates. A retryable bulk write
(``lsid`` + ``txnNumber`` outside a transaction) sends each op with its index in ``ops`` as its
stmtId, so the shards' session records answer an op a retry repeats from its first execution:
nothing is applied twice, and the router keeps no retry state (as mongos).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bson import ObjectId

from shardsim.router import writes
from shardsim.core.commands import CommandFamily, Request, bson_type_name
from shardsim.core.errors import MongoError, code_name
from shardsim.core.protocol.versions import NETWORK_ERRORS
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.router.node import RouterNode

commands = CommandFamily("bulk_write")

_TOP_FIELDS = frozenset({"bulkWrite", "ops", "nsInfo", "ordered", "errorsOnly",
                         "bypassDocumentValidation", "let", "comment", "writeConcern", "cursor",
                         "maxTimeMS", "lsid", "txnNumber", "autocommit", "startTransaction",
                         "readConcern", "stmtIds", "stmtId", "$db", "$clusterTime",
                         "$readPreference", "apiVersion", "apiStrict", "apiDeprecationErrors",
                         "$audit", "$client", "rawData"})
_UPDATE_FIELDS = {"filter": "q", "updateMods": "u", "multi": "multi", "upsert": "upsert",
                  "arrayFilters": "arrayFilters", "hint": "hint", "collation": "collation",
                  "sort": "sort", "constants": "c"}
_DELETE_FIELDS = {"filter": "q", "hint": "hint", "collation": "collation"}
# Options of the bulkWrite passed on with every child command (writes._BATCH_OPTS picks).
_CHILD_OPTS = ("bypassDocumentValidation", "writeConcern", "comment", "maxTimeMS", "lsid",
               "txnNumber", "autocommit", "readConcern")
MAX_OPS = 100_000


@dataclass
class Group:
    """Consecutive ops run as one child command: ``kind`` (insert/update/delete), namespace
    ``ns`` and the bulk indexes ``idx`` of its ``stmts`` (child-command statements)."""

    kind: str
    ns: str
    idx: list[int] = field(default_factory=list)
    stmts: list[Any] = field(default_factory=list)


def _bad(msg: str, code: int = 2) -> MongoError:
    return MongoError(code, msg)


def _check_type(name: str, value: Any, types: tuple[type, ...], tname: str) -> None:
    if isinstance(value, bool) and bool not in types:
        ok = False
    else:
        ok = isinstance(value, types)
    if not ok:
        raise MongoError(14, f"BSON field 'bulkWrite.{name}' is the wrong type "
                             f"'{bson_type_name(value)}', expected type '{tname}'")


def parse_op(i: int, op: Any, namespaces: list[str]) -> tuple[str, str, Any]:
    """One ``ops`` entry as ``(kind, ns, child statement)``: an insert's document (``_id``
    added when missing, as mongos does before targeting), an update's ``{q, u, multi, upsert,
    ...}`` or a delete's ``{q, limit}``. FailedToParse (9) for an op naming no or several
    kinds, TypeMismatch (14) for a wrong type, IDLFailedToParse (40414) for a missing field,
    BadValue (2) for an ``nsInfo`` index out of range (``bulk_write_common.cpp``)."""
    if not isinstance(op, dict):
        raise MongoError(14, "BSON field 'bulkWrite.ops' is the wrong type, expected type 'object'")
    kinds = [k for k in ("insert", "update", "delete") if k in op]
    if len(kinds) != 1:
        raise MongoError(9, f"BulkWrite ops entry {i} must have exactly one of insert, update "
                            f"or delete")
    kind = kinds[0]
    ns_idx = op[kind]
    if isinstance(ns_idx, bool) or not isinstance(ns_idx, int):
        raise MongoError(14, f"BSON field 'bulkWrite.ops.{kind}' is the wrong type, expected "
                             f"type 'int'")
    if not 0 <= ns_idx < len(namespaces):
        raise _bad(f"BulkWrite ops entry {i} has an invalid nsInfo index.")
    ns = namespaces[ns_idx]
    if kind == "insert":
        doc = op.get("document")
        if doc is None:
            raise MongoError(40414, "BSON field 'bulkWrite.ops.document' is missing but a "
                                    "required field")
        _check_type("ops.document", doc, (dict,), "object")
        if "_id" not in doc:
            doc = {"_id": ObjectId(), **doc}
        return kind, ns, doc
    if "filter" not in op:
        raise MongoError(40414, "BSON field 'bulkWrite.ops.filter' is missing but a required "
                                "field")
    if kind == "update":
        if "updateMods" not in op:
            raise MongoError(40414, "BSON field 'bulkWrite.ops.updateMods' is missing but a "
                                    "required field")
        stmt = {dst: op[src] for src, dst in _UPDATE_FIELDS.items() if src in op}
        stmt.setdefault("multi", False)
        stmt.setdefault("upsert", False)
        return kind, ns, stmt
    stmt = {dst: op[src] for src, dst in _DELETE_FIELDS.items() if src in op}
    multi = op.get("multi", False)
    _check_type("ops.multi", multi, (bool,), "bool")
    stmt["limit"] = 0 if multi else 1
    return kind, ns, stmt


def parse_request(req: Request) -> tuple[list[tuple[str, str, Any]], bool, bool]:
    """``(ops as (kind, ns, statement), ordered, errorsOnly)`` of a bulkWrite request.
    Unauthorized (13) off ``admin``; InvalidLength (16) for no ops or more than 100,000;
    BadValue (2) for an empty ``nsInfo`` or an index outside it; InvalidNamespace (73) for a
    bad namespace; 14/40414/40415 for wrong types, missing and unknown fields."""
    if req.db != "admin":
        raise MongoError(13, "bulkWrite may only be run against the admin database.")
    for k in req.body:
        if k not in _TOP_FIELDS and not k.startswith("$"):
            raise MongoError(40415, f"BSON field 'bulkWrite.{k}' is an unknown field.")
    ops = req.get("ops")
    info = req.get("nsInfo")
    if ops is None or info is None:
        missing = "ops" if ops is None else "nsInfo"
        raise MongoError(40414, f"BSON field 'bulkWrite.{missing}' is missing but a required field")
    _check_type("ops", ops, (list,), "array")
    _check_type("nsInfo", info, (list,), "array")
    ordered = req.get("ordered", True)
    _check_type("ordered", ordered, (bool,), "bool")
    errors_only = req.get("errorsOnly", False)
    _check_type("errorsOnly", errors_only, (bool,), "bool")
    if not ops or len(ops) > MAX_OPS:
        raise MongoError(16, f"Write batch sizes must be between 1 and {MAX_OPS}. Got "
                             f"{len(ops)} operations.")
    if not info:
        raise _bad("Must specify at least one nsInfo entry")
    namespaces: list[str] = []
    for entry in info:
        _check_type("nsInfo", entry, (dict,), "object")
        ns = entry.get("ns")
        if not isinstance(ns, str) or "." not in ns or ns.startswith(".") or ns.endswith("."):
            raise MongoError(73, f"Invalid namespace specified '{ns}'")
        namespaces.append(ns)
    return [parse_op(i, op, namespaces) for i, op in enumerate(ops)], ordered, errors_only


def group_ops(parsed: list[tuple[str, str, Any]], skip: set[int]) -> list[Group]:
    """Child commands for the ops not in ``skip``: consecutive inserts into one namespace
    share one; every update and delete is its own (its reply item needs its own counts)."""
    groups: list[Group] = []
    for i, (kind, ns, stmt) in enumerate(parsed):
        if i in skip:
            continue
        last = groups[-1] if groups else None
        if kind == "insert" and last is not None and last.kind == "insert" and last.ns == ns \
                and last.idx[-1] == i - 1:
            last.idx.append(i)
            last.stmts.append(stmt)
        else:
            groups.append(Group(kind, ns, [i], [stmt]))
    return groups


def _error_item(i: int, kind: str, err: dict[str, Any]) -> dict[str, Any]:
    item: dict[str, Any] = {"ok": 0.0, "idx": i, "code": err["code"],
                            "codeName": err.get("codeName") or code_name(err["code"]),
                            "errmsg": err.get("errmsg", "")}
    for k in ("keyPattern", "keyValue", "errInfo"):
        if k in err:
            item[k] = err[k]
    item["n"] = 0
    if kind == "update":
        item["nModified"] = 0
    return item


async def _run_group(router: "RouterNode", req: Request, group: Group, ordered: bool,
                     first: bool) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Run one child command through :class:`router.writes.WriteExecutor`; returns its reply
    items (one per executed op, in order) and its writeConcernError (or None)."""
    db, _, coll = group.ns.partition(".")
    field_name = {"insert": "documents", "update": "updates", "delete": "deletes"}[group.kind]
    body: dict[str, Any] = {group.kind: coll, field_name: group.stmts, "ordered": ordered,
                            "$db": db}
    for k in _CHILD_OPTS:
        if k in req.body:
            body[k] = req.body[k]
    if group.kind != "insert" and "let" in req.body:
        body["let"] = req.body["let"]
    if first and "startTransaction" in req.body:
        body["startTransaction"] = req.body["startTransaction"]
    if "txnNumber" in req.body and req.get("autocommit") is None:
        # A retryable bulkWrite: each op's stmtId is its index in ``ops``
        # (bulk_write_common.cpp getStatementId), so the shards' session records answer a
        # retried op from its first execution instead of applying it again.
        body["stmtIds"] = list(group.idx)
    child = Request(group.kind, db, body, req.conn)
    # The ops' sizes for the child batches' size limit (writes.WriteExecutor._split): the raw
    # op of the document sequence (a little more than its document or update entry); an op
    # list sent in the body (at most 16 MiB) is not measured unless the body is large.
    raw_ops = req.sequences.get("ops")
    if raw_ops is not None and len(raw_ops) == len(req.body.get("ops") or []):
        sizes: list[int] | None = [len(raw_ops[i]) for i in group.idx]
    elif len(req.raw) <= writes.UNMEASURED_REQUEST_BYTES:
        sizes = [0] * len(group.idx)
    else:
        sizes = None  # measured by the executor
    db_gate, gate = writes.gate_for(router, db), writes.gate_for(router, group.ns)
    await db_gate.enter()
    try:
        await gate.enter()
        try:
            reply = await writes.WriteExecutor(router, child, group.kind, sizes).execute()
        except MongoError as exc:
            if exc.code in NETWORK_ERRORS or exc.code in (251, 263) or req.get("autocommit") is False:
                raise
            reply = {"n": 0, "writeErrors": [{"index": 0, "code": exc.code,
                                              "errmsg": exc.errmsg, **exc.extra}]}
        finally:
            await gate.exit()
    finally:
        await db_gate.exit()
    errors = {int(e["index"]): e for e in reply.get("writeErrors", [])}
    items: list[dict[str, Any]] = []
    if group.kind == "insert":
        for pos, i in enumerate(group.idx):
            if pos in errors:
                items.append(_error_item(i, "insert", errors[pos]))
                if ordered:
                    break
            else:
                items.append({"ok": 1.0, "idx": i, "n": 1})
    else:
        i = group.idx[0]
        if 0 in errors:
            items.append(_error_item(i, group.kind, errors[0]))
        else:
            item: dict[str, Any] = {"ok": 1.0, "idx": i, "n": int(reply.get("n", 0))}
            if group.kind == "update":
                item["nModified"] = int(reply.get("nModified", 0))
                ups = reply.get("upserted") or []
                if ups:
                    item["upserted"] = {"_id": ups[0]["_id"]}
            items.append(item)
    return items, reply.get("writeConcernError")


def summarize(items: list[dict[str, Any]], parsed: list[tuple[str, str, Any]]
              ) -> dict[str, int]:
    """The reply's counters over all reply items: ``nErrors``, ``nInserted``, ``nUpserted``,
    ``nMatched``, ``nModified``, ``nDeleted``."""
    out = {"nErrors": 0, "nInserted": 0, "nUpserted": 0, "nMatched": 0, "nModified": 0,
           "nDeleted": 0}
    for item in items:
        if not item["ok"]:
            out["nErrors"] += 1
            continue
        kind = parsed[item["idx"]][0]
        if kind == "insert":
            out["nInserted"] += item["n"]
        elif kind == "delete":
            out["nDeleted"] += item["n"]
        elif "upserted" in item:
            out["nUpserted"] += 1
        else:
            out["nMatched"] += item["n"]
            out["nModified"] += item.get("nModified", 0)
    return out


@commands.handler("bulkWrite", privileges=priv.bulk_write_privileges)
async def bulk_write(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{bulkWrite: 1, ops, nsInfo, ...}`` on ``admin`` -> ``{cursor, nErrors, nInserted,
    nUpserted, nMatched, nModified, nDeleted[, writeConcernError]}`` (see the module text).
    Command errors as :func:`parse_request`; network errors (6, 7, 89, 9001) and a
    transaction's errors are raised as such, every other failure becomes the op's reply item."""
    parsed, ordered, errors_only = parse_request(req)
    done: dict[int, dict[str, Any]] = {}
    items: list[dict[str, Any]] = []
    wce = None
    stop = False
    for n, group in enumerate(group_ops(parsed, set(done))):
        new, group_wce = await _run_group(node, req, group, ordered, n == 0)
        wce = group_wce or wce
        for item in new:
            items.append(item)
            if item["ok"]:
                done[item["idx"]] = item
            elif ordered:
                stop = True
        if stop:
            break
    items.sort(key=lambda it: it["idx"])
    counts = summarize(items, parsed)
    batch = [it for it in items if not it["ok"]] if errors_only else items
    cursor_opt = req.get("cursor") or {}
    batch_size = cursor_opt.get("batchSize") if isinstance(cursor_opt, dict) else None
    reply = await node.cursor_reply("admin.$cmd.bulkWrite", batch, req, batch_size)
    reply.update(counts)
    if wce is not None:
        reply["writeConcernError"] = wce
    return reply
