"""Stage 3: oplog entry -> change event (``$_internalChangeStreamTransform``).

Follows ``ChangeStreamDefaultEventTransformation::applyTransformation``
(``src/mongo/db/pipeline/change_stream_event_transform.cpp``) for the event's fields and their
order: ``[txnNumber, lsid, to]`` (added before the token on the server), ``_id`` (the resume
token, also the ``$sortKey``), ``operationType``, ``clusterTime``, ``[collectionUUID]`` (expanded
events), ``wallTime``, ``[fullDocument]``, ``ns``, ``[documentKey]``, ``[operationDescription]``
(expanded), ``[updateDescription]``, ``[stateBeforeChange]``, ``[nsType]``.

``updateDescription`` comes from the ``$v: 2`` diff as ``change_stream_document_diff_parser.cpp``
reads it: ``updatedFields``, ``removedFields``, ``truncatedArrays`` and, with
``showExpandedEvents``, ``disambiguatedPaths`` (paths with a numeric or dotted field name, array
indexes as ints).

The resume token is built once per event (:func:`shardsim.core.resume_token.event_token_data`) in the
client token's version until the stream passes the resume point, then version 2
(``ChangeStreamEventTransformation::makeResumeToken``).
"""

from __future__ import annotations

from typing import Any

from bson.timestamp import Timestamp

from shardsim.core import resume_token as rt
from shardsim.core.clock import ts_key
from shardsim.core.change_stream_spec import StreamSpec
from shardsim.core.server_version import ServerProfile, new_shard_op_name
from shardsim.shard.change_stream.control_events import control_event

CLASSIC_OPS = frozenset({"insert", "update", "replace", "delete", "drop", "rename", "dropDatabase",
                         "invalidate"})
PRE_IMAGE_OPS = frozenset({"update", "replace", "delete"})
_NOOP_EVENTS = ("shardCollection", "migrateLastChunkFromShard", "refineCollectionShardKey",
                "reshardCollection", "reshardBegin", "reshardBlockingWrites", "reshardDoneCatchUp",
                "endOfTransaction")
_RESHARD_UUID_OPS = ("reshardBegin", "reshardBlockingWrites", "reshardDoneCatchUp")
_FLAGGED_BEFORE_70 = ("refineCollectionShardKey", "reshardCollection")


class Event:
    """A change event on its way through the stages.

    ``doc`` the event document (dict, field order as the server's); ``token`` its ``_id``;
    ``key`` (ts_key, txnOpIndex) for version selection; ``invalidating`` True for drop/rename/
    dropDatabase (check_invalidate decides); ``pre_image_id`` ``(uuid bytes, ts, applyOpsIndex)``;
    ``raw_update`` the ``$v: 2`` update spec (post-image computation); ``topology`` True for
    kNewShardDetected (:mod:`.check_topology_change` passes it past the later stages);
    ``swallow`` set by the resumability checks.
    """

    __slots__ = ("doc", "token", "ts", "txn_op_index", "invalidating", "pre_image_id",
                 "raw_update", "topology", "ns", "uuid", "wall", "swallow", "fragment_skip")

    def __init__(self, doc: dict[str, Any], token: dict[str, Any], ts: Timestamp) -> None:
        self.doc = doc
        self.token = token
        self.ts = ts
        self.txn_op_index = 0
        self.invalidating = False
        self.pre_image_id: tuple[bytes, Timestamp, int] | None = None
        self.raw_update: Any = None
        self.topology = False
        self.ns = ""
        self.uuid: bytes | None = None
        self.wall: Any = None
        self.swallow = False
        self.fragment_skip: int | None = None


def _ns_field(db: str, coll: str | None) -> dict[str, Any]:
    return {"db": db, "coll": coll} if coll else {"db": db}


def _except(doc: dict[str, Any], *names: str) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in names}


def _collection_type(o: dict[str, Any]) -> str:
    view_on = o.get("viewOn")
    if view_on is None:
        return "collection"
    return "timeseries" if str(view_on).startswith("system.buckets.") else "view"


# -- updateDescription from a $v:2 diff ----------------------------------------------------------

_FLAT_SECTIONS = frozenset({"u", "i", "d"})


def _is_ambiguous_field(name: str) -> bool:
    return "." in name or (name.isdigit() and name != "")


class _DiffParser:
    __slots__ = ("updated", "removed", "truncated", "disambiguated")

    def __init__(self) -> None:
        self.updated: dict[str, Any] = {}
        self.removed: list[str] = []
        self.truncated: list[dict[str, Any]] = []
        self.disambiguated: dict[str, list[Any]] = {}

    def _path(self, parts: list[Any], ambiguous: bool) -> str:
        path = ".".join(map(str, parts))
        if ambiguous:
            self.disambiguated[path] = list(parts)
        return path

    def obj(self, diff: dict[str, Any], parts: list[Any], ambiguous: bool) -> None:
        deletes = diff.get("d")
        if isinstance(deletes, dict):
            for name in deletes:
                self.removed.append(self._path(parts + [name], ambiguous or _is_ambiguous_field(name)))
        for section in ("u", "i"):
            sec = diff.get(section)
            if isinstance(sec, dict):
                for name, value in sec.items():
                    self.updated[self._path(parts + [name], ambiguous or _is_ambiguous_field(name))] = value
        for key, sub in diff.items():
            if len(key) > 1 and key[0] == "s" and isinstance(sub, dict):
                name = key[1:]
                amb = ambiguous or _is_ambiguous_field(name)
                if sub.get("a") is True:
                    self.arr(sub, parts + [name], amb)
                else:
                    self.obj(sub, parts + [name], amb)

    def arr(self, diff: dict[str, Any], parts: list[Any], ambiguous: bool) -> None:
        if "l" in diff:
            self.truncated.append({"field": self._path(parts, ambiguous), "newSize": int(diff["l"])})
        for key, value in diff.items():
            if len(key) < 2 or not key[1:].isdigit():
                continue
            idx = int(key[1:])
            if key[0] == "u":
                self.updated[self._path(parts + [idx], ambiguous)] = value
            elif key[0] == "s" and isinstance(value, dict):
                if value.get("a") is True:
                    self.arr(value, parts + [idx], ambiguous)
                else:
                    self.obj(value, parts + [idx], ambiguous)


def update_description(diff: dict[str, Any], expanded: bool) -> dict[str, Any]:
    """``{updatedFields, removedFields, truncatedArrays[, disambiguatedPaths]}`` for a diff."""
    if all(k in _FLAT_SECTIONS for k in diff):
        # Hot path: top-level fields only (no sub-diffs): paths are the field names.
        deletes, upd, ins = diff.get("d"), diff.get("u"), diff.get("i")
        deletes = deletes if isinstance(deletes, dict) else {}
        updated: dict[str, Any] = dict(upd) if isinstance(upd, dict) else {}
        if isinstance(ins, dict):
            updated.update(ins)
        flat: dict[str, Any] = {"updatedFields": updated, "removedFields": list(deletes),
                                "truncatedArrays": []}
        if expanded:
            flat["disambiguatedPaths"] = {
                n: [n] for sec in (deletes, upd, ins) if isinstance(sec, dict)
                for n in sec if _is_ambiguous_field(n)}
        return flat
    p = _DiffParser()
    p.obj(diff, [], False)
    out: dict[str, Any] = {"updatedFields": p.updated, "removedFields": p.removed,
                           "truncatedArrays": p.truncated}
    if expanded:
        out["disambiguatedPaths"] = p.disambiguated
    return out


def _command_event(entry: dict[str, Any], o: dict[str, Any], db: str) -> tuple[Any, ...] | None:
    """The event fields of a DDL command entry (``op: "c"``, ``o`` its command):
    ``(operationType, db, coll, operationDescription, fields before _id, nsType,
    stateBeforeChange, invalidating)``, or None for a command that makes no event."""
    pre: dict[str, Any] = {}
    op_desc: Any = None
    ns_type: Any = None
    state_before: Any = None
    invalidating = False
    name = next(iter(o), None)
    if name == "drop":
        op_type, coll = "drop", o["drop"]
        invalidating = True
    elif name == "renameCollection":
        op_type = "rename"
        db, _, coll = str(o["renameCollection"]).partition(".")
        tdb, _, tcoll = str(o.get("to", "")).partition(".")
        target = _ns_field(tdb, tcoll)
        pre["to"] = target
        desc = _except(o, "renameCollection", "stayTemp")
        desc["to"] = target
        op_desc = desc
        invalidating = True
    elif name == "dropDatabase":
        op_type, coll = "dropDatabase", ""
        invalidating = True
    elif name == "create":
        op_type, coll = "create", o["create"]
        op_desc = _except(o, "create")
        ns_type = _collection_type(o)
    elif name == "createIndexes":
        op_type, coll = "createIndexes", o["createIndexes"]
        op_desc = {"indexes": [_except(o, "createIndexes")]}
    elif name == "commitIndexBuild":
        op_type, coll = "createIndexes", o["commitIndexBuild"]
        op_desc = {"indexes": o.get("indexes")}
    elif name in ("startIndexBuild", "abortIndexBuild"):
        op_type, coll = name, o[name]
        op_desc = {"indexes": o.get("indexes")}
    elif name == "dropIndexes":
        op_type, coll = "dropIndexes", o["dropIndexes"]
        o2 = entry.get("o2") or {}
        op_desc = {"indexes": [_except(o2, "dropIndexes")]}
    elif name == "collMod":
        op_type, coll = "modify", o["collMod"]
        op_desc = _except(o, "collMod")
        o2 = entry.get("o2") or {}
        state_before = {k: v for k, v in (("collectionOptions", o2.get("collectionOptions_old")),
                                          ("indexOptions", o2.get("indexOptions_old")))
                        if v is not None}
    else:
        return None
    return op_type, db, coll, op_desc, pre, ns_type, state_before, invalidating


def _noop_event(o2: dict[str, Any], profile: ServerProfile,
                token_version: int = 2) -> tuple[str, Any, dict[str, Any], bool] | None:
    """The event fields of a sharding no-op (``op: "n"``, ``o2`` its payload):
    ``(operationType, operationDescription, fields before _id, topology change?)``, or None
    for a no-op that makes no event (the periodic no-op). Per server-version ``profile``: 6.0
    emits no ``refineCollectionShardKey``/``reshardCollection`` events (feature-flagged then,
    mongodb/specifications PR #1220); before 8.0 ``operationDescription`` has no
    ``provenance`` (moveCollection/unshardCollection are 8.0 commands). The new-shard event is
    ``kNewShardDetected`` in a stream of v1 tokens on 6.0/7.0, else ``migrateChunkToNewShard``
    (``token_version``; ``getNewShardDetectedOpName``, see
    :func:`shardsim.core.server_version.new_shard_op_name`)."""
    pre: dict[str, Any] = {}
    if "migrateChunkToNewShard" in o2:
        return (new_shard_op_name(token_version, profile), _except(o2, "migrateChunkToNewShard"), pre,
                True)
    for name in _NOOP_EVENTS:
        if name in o2:
            if name in _FLAGGED_BEFORE_70 and not profile.refine_reshard_events:
                return None
            if name in _RESHARD_UUID_OPS:
                pre["reshardingUUID"] = o2.get("reshardingUUID")
            desc = _except(o2, name)
            if not profile.provenance:
                desc.pop("provenance", None)
            return name, desc, pre, False
    return None


# -- the transform -------------------------------------------------------------------------------

class Transform:
    """The ``$_internalChangeStreamTransform`` stage of one stream: builds :class:`Event`
    objects (and keeps the resume-token version state). ``process(entry)`` (also ``self(entry)``)
    gives the event of one oplog entry or unwound transaction operation, or None for an entry
    that makes no event; it raises KeyError only for entries without ``ts``."""

    name = "$_internalChangeStreamTransform"

    def __init__(self, spec: StreamSpec) -> None:
        self.spec = spec
        rd = spec.resume_data
        self._resume_key = (ts_key(rd.clusterTime), rd.txnOpIndex) if rd is not None else None
        self._resume_version = rd.version if rd is not None else rt.DEFAULT_VERSION
        self._post_requested = spec.full_document in ("whenAvailable", "required")
        self._pre_requested = spec.full_document_before_change != "off"
        self._ns_cache: dict[str, tuple[str, str, bool]] = {}

    def _version(self, ts: Timestamp, txn_op_index: int) -> int:
        rk = self._resume_key
        if rk is None:
            return self.spec.token_version
        if ts_key(ts) > rk[0] or txn_op_index > rk[1]:
            return self.spec.token_version
        return self._resume_version

    def process(self, entry: dict[str, Any]) -> Event | None:
        """The event for ``entry`` (an oplog entry or one unwound transaction op), or None."""
        op = entry.get("op")
        if op in _CRUD_OPS and "txnOpIndex" not in entry:
            ev = self._crud(entry, op)
            if ev is not None:
                return ev
        spec = self.spec
        ns = entry.get("ns", "")
        db, _, coll = ns.partition(".")
        ts: Timestamp = entry["ts"]
        ui = entry.get("ui")
        uuid = bytes(ui) if ui is not None else None
        o = entry.get("o") or {}
        if coll == "system.views" and op in ("i", "u", "d") and spec.kind != "collection":
            return self._view_event(entry, op, o, ts, uuid)
        full_document: Any = _MISSING
        update_desc: Any = None
        document_key: Any = None
        op_desc: Any = None
        state_before: Any = None
        ns_type: Any = None
        pre: dict[str, Any] = {}
        raw_update = None
        invalidating = False
        topology = False

        if op == "i":
            op_type = "insert"
            full_document = o
            document_key = entry.get("o2")
            if document_key is None:
                document_key = {"_id": o.get("_id")}
        elif op == "d":
            op_type = "delete"
            document_key = o
        elif op == "u":
            if o.get("$v") == 2 and isinstance(o.get("diff"), dict):
                op_type = "update"
                if spec.show_raw_update:
                    update_desc = o
                else:
                    update_desc = update_description(o["diff"], spec.emit_disambiguated)
                raw_update = o
                if spec.full_document != "default":
                    full_document = None  # placeholder filled by add_post_image
            else:
                op_type = "replace"
                full_document = o
            document_key = entry.get("o2")
        elif op == "c":
            cmd = _command_event(entry, o, db)
            if cmd is None:
                return None
            op_type, db, coll, op_desc, pre, ns_type, state_before, invalidating = cmd
            if not spec.profile.ns_type:
                ns_type = None
        elif op == "n":
            o2 = entry.get("o2") or {}
            if spec.reader_version == "v2":  # control events (shard/change_stream/control_events)
                if "migrateChunkToNewShard" in o2:
                    return None
                ctl = control_event(o2)
                if ctl is not None:
                    return self._control(entry, ctl)
            noop = _noop_event(o2, spec.profile, spec.token_version)
            if noop is None:
                return None
            op_type, op_desc, pre, topology = noop
        else:
            return None

        txn_op_index = entry.get("txnOpIndex")
        if txn_op_index is not None:
            if "txnNumber" in entry:
                pre = {"txnNumber": entry["txnNumber"], **pre}
            if "lsid" in entry:
                pre = {**{k: v for k, v in pre.items() if k == "txnNumber"}, "lsid": entry["lsid"],
                       **{k: v for k, v in pre.items() if k != "txnNumber"}}
        idx = txn_op_index or 0
        if op_type in ("invalidate", "dropDatabase"):
            token_uuid = None
        else:
            token_uuid = uuid
        version = self._version(ts, idx)
        if version == 2 and type(document_key) is dict and op_desc is None:
            token = rt.fast_event_token(ts, token_uuid, op_type, document_key, idx)
        else:
            token = rt.encode(rt.event_token_data(ts, token_uuid, op_type, document_key, op_desc,
                                                  txn_op_index=idx, version=version))

        doc: dict[str, Any] = dict(pre)
        doc["_id"] = token
        doc["operationType"] = op_type
        doc["clusterTime"] = ts
        if spec.emit_commit_ts and "commitTimestamp" in entry:
            doc["commitTimestamp"] = entry["commitTimestamp"]
        if spec.emit_collection_uuid and uuid is not None:
            doc["collectionUUID"] = ui
        doc["wallTime"] = entry.get("wall")
        if full_document is not _MISSING:
            doc["fullDocument"] = full_document
        doc["ns"] = _ns_field(db, coll)
        if document_key is not None and op in ("i", "u", "d"):
            doc["documentKey"] = document_key
        if spec.show_expanded and op_desc is not None:
            doc["operationDescription"] = op_desc
        if update_desc is not None:
            doc["rawUpdateDescription" if spec.show_raw_update else "updateDescription"] = update_desc
        if state_before is not None:
            doc["stateBeforeChange"] = state_before
        if ns_type is not None:
            doc["nsType"] = ns_type

        ev = Event(doc, token, ts)
        ev.txn_op_index = idx
        ev.invalidating = invalidating
        ev.topology = topology
        ev.ns = f"{db}.{coll}" if coll else db
        ev.uuid = uuid
        ev.wall = entry.get("wall")
        ev.raw_update = raw_update
        if uuid is not None and ((self._pre_requested and op_type in PRE_IMAGE_OPS)
                                 or (self._post_requested and op_type == "update")):
            ev.pre_image_id = (uuid, entry.get("applyOpsTs", ts), int(entry.get("applyOpsIndex", 0)))
        return ev

    __call__ = process

    def _control(self, entry: dict[str, Any], ctl: tuple[str, Any, Any]) -> Event:
        """A v2 stream's control event (:mod:`.control_events`): ``_id``, ``operationType``,
        ``clusterTime``, ``ns``, ``operationDescription`` always (the router reads it); it
        bypasses the later stages (``topology``)."""
        op_type, op_desc, ns_override = ctl
        ts: Timestamp = entry["ts"]
        ui = entry.get("ui")
        uuid = bytes(ui) if ui is not None else None
        db, _, coll = str(entry.get("ns", "")).partition(".")
        token = rt.encode(rt.event_token_data(ts, uuid, op_type, None, op_desc,
                                              version=self._version(ts, 0)))
        doc: dict[str, Any] = {"_id": token, "operationType": op_type, "clusterTime": ts,
                               "wallTime": entry.get("wall"),
                               "ns": ns_override if ns_override is not None else _ns_field(db, coll),
                               "operationDescription": op_desc}
        ev = Event(doc, token, ts)
        ev.topology = True
        ev.ns = f"{db}.{coll}" if coll else db
        ev.uuid = uuid
        ev.wall = entry.get("wall")
        return ev

    def _ns_info(self, ns: str) -> tuple[str, str, bool]:
        """``(db, coll, fast)`` for a CRUD entry's namespace; ``fast`` False for the namespaces the
        general path treats specially (system.views of database/cluster streams)."""
        info = self._ns_cache.get(ns)
        if info is None:
            db, _, coll = ns.partition(".")
            info = (db, coll, bool(coll) and not (coll == "system.views"
                                                  and self.spec.kind != "collection"))
            if len(self._ns_cache) >= 1024:
                self._ns_cache.clear()
            self._ns_cache[ns] = info
        return info

    def _crud(self, entry: dict[str, Any], op: str) -> Event | None:
        """The hot path of :meth:`__call__` for an insert/update/replace/delete outside a
        transaction: the same event (fields, order, token) with less work per entry. None when
        the general path must decide."""
        db, coll, fast = self._ns_info(entry.get("ns", ""))
        if not fast:
            return None
        spec = self.spec
        ts: Timestamp = entry["ts"]
        ui = entry.get("ui")
        uuid = bytes(ui) if ui is not None else None
        o = entry.get("o") or {}
        update_desc: Any = None
        raw_update = None
        full_document: Any = _MISSING
        if op == "i":
            op_type = "insert"
            full_document = o
            document_key = entry.get("o2")
            if document_key is None:
                document_key = {"_id": o.get("_id")}
        elif op == "d":
            op_type = "delete"
            document_key = o
        else:
            diff = o.get("diff")
            if o.get("$v") == 2 and isinstance(diff, dict):
                op_type = "update"
                if spec.show_raw_update:
                    update_desc = o
                else:
                    update_desc = update_description(diff, spec.emit_disambiguated)
                raw_update = o
                if spec.full_document != "default":
                    full_document = None  # placeholder filled by add_post_image
            else:
                op_type = "replace"
                full_document = o
            document_key = entry.get("o2")
        version = spec.token_version if self._resume_key is None else self._version(ts, 0)
        if version == 2 and type(document_key) is dict:
            token = rt.fast_event_token(ts, uuid, op_type, document_key, 0)
        else:
            token = rt.encode(rt.event_token_data(ts, uuid, op_type, document_key, None,
                                                  txn_op_index=0, version=version))
        wall = entry.get("wall")
        doc: dict[str, Any] = {"_id": token, "operationType": op_type, "clusterTime": ts}
        if spec.emit_commit_ts and "commitTimestamp" in entry:
            doc["commitTimestamp"] = entry["commitTimestamp"]
        if spec.emit_collection_uuid and uuid is not None:
            doc["collectionUUID"] = ui
        doc["wallTime"] = wall
        if full_document is not _MISSING:
            doc["fullDocument"] = full_document
        doc["ns"] = {"db": db, "coll": coll}
        if document_key is not None:
            doc["documentKey"] = document_key
        if update_desc is not None:
            doc["rawUpdateDescription" if spec.show_raw_update else "updateDescription"] = update_desc
        ev = Event(doc, token, ts)
        ev.ns = f"{db}.{coll}"
        ev.uuid = uuid
        ev.wall = wall
        ev.raw_update = raw_update
        if uuid is not None and ((self._pre_requested and op_type in PRE_IMAGE_OPS)
                                 or (self._post_requested and op_type == "update")):
            ev.pre_image_id = (uuid, entry.get("applyOpsTs", ts), int(entry.get("applyOpsIndex", 0)))
        return ev

    def _view_event(self, entry: dict[str, Any], op: str, o: dict[str, Any], ts: Timestamp,
                    uuid: bytes | None) -> Event:
        """A CRUD entry on ``<db>.system.views`` as a view DDL event
        (``ChangeStreamViewDefinitionEventTransformation``): insert -> ``create``, replacement
        -> ``modify``, delete -> ``drop``; ``ns`` is the view (``o._id``), the token carries the
        system.views UUID and no documentKey, and there is no ``collectionUUID``."""
        view_ns = str(o.get("_id", ""))
        vdb, _, vcoll = view_ns.partition(".")
        op_desc: Any = None
        ns_type: Any = None
        if op == "i":
            op_type = "create"
            op_desc = _except(o, "_id")
            ns_type = _collection_type(o) if self.spec.profile.ns_type else None
        elif op == "u":
            op_type = "modify"
            op_desc = _except(o, "_id")
        else:
            op_type = "drop"
        idx = entry.get("txnOpIndex") or 0
        token = rt.encode(rt.event_token_data(ts, uuid, op_type, None, op_desc, txn_op_index=idx,
                                              version=self._version(ts, idx)))
        doc: dict[str, Any] = {"_id": token, "operationType": op_type, "clusterTime": ts,
                               "wallTime": entry.get("wall"), "ns": _ns_field(vdb, vcoll)}
        if op_desc is not None:
            doc["operationDescription"] = op_desc
        if ns_type is not None:
            doc["nsType"] = ns_type
        ev = Event(doc, token, ts)
        ev.txn_op_index = idx
        ev.ns = view_ns
        ev.uuid = uuid
        ev.wall = entry.get("wall")
        return ev


_MISSING = object()
_CRUD_OPS = frozenset({"i", "u", "d"})
