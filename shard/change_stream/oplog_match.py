"""Stage 1: which oplog entries can concern a stream (``$_internalChangeStreamOplogMatch``).

The server builds one ``$match`` over ``local.oplog.rs`` from ``change_stream_filter_helpers.cpp``
(``buildTsFilter``, ``buildNotFromMigrateFilter``, ``buildOperationFilter``,
``buildInvalidationFilter``, ``buildTransactionFilter``, ``buildInternalOpFilter``). Here it is a
predicate over the entry dict, in the same spirit: CRUD ops on watched namespaces and not
``fromMigrate``; the DDL commands that produce events (expanded ones only with
``showExpandedEvents``); ``applyOps`` transactions touching a watched namespace; the sharding
no-ops (``shardCollection``, ... and ``migrateChunkToNewShard`` → ``kNewShardDetected`` for the
router only). Periodic no-ops never match (they only move the scan position, i.e. the
high-water mark). The same predicate decides whether a write wakes a waiting cursor.
"""

from __future__ import annotations

from typing import Any, Callable

from shardsim.core.change_stream_spec import StreamSpec
from shardsim.shard.change_stream.control_events import is_control_noop

INTERNAL_DBS = frozenset({"admin", "config", "local"})

# Commands that always produce events, and those shown only with showExpandedEvents.
CLASSIC_COMMANDS = ("drop", "renameCollection", "dropDatabase")
EXPANDED_COMMANDS = ("create", "createIndexes", "commitIndexBuild", "dropIndexes", "collMod",
                     "startIndexBuild", "abortIndexBuild")

# o2 keys of sharding no-ops that become events (kBuiltInNoopEvents), all "expanded".
NOOP_EVENTS = ("shardCollection", "migrateLastChunkFromShard", "refineCollectionShardKey",
               "reshardCollection", "reshardBegin", "reshardBlockingWrites", "reshardDoneCatchUp",
               "endOfTransaction")


def ns_predicate(spec: StreamSpec) -> Callable[[str], bool]:
    """``ns`` ("db.coll") -> watched? System collections are never watched except by name."""
    if spec.kind == "collection":
        target = f"{spec.db}.{spec.coll}"
        return lambda ns: ns == target
    if spec.kind == "database":
        prefix = spec.db + "."

        def in_db(ns: str) -> bool:
            return ns.startswith(prefix) and not ns.startswith("system.", len(prefix))
        return in_db

    def in_cluster(ns: str) -> bool:
        db, _, coll = ns.partition(".")
        return bool(coll) and db not in INTERNAL_DBS and not coll.startswith("system.")
    return in_cluster


def view_ns_predicate(spec: StreamSpec) -> Callable[[str], bool]:
    """``ns`` -> is it a ``system.views`` collection whose CRUD entries are view events for this
    stream (``buildViewDefinitionEventFilter``: database/cluster streams with
    showExpandedEvents only; ``getViewNsRegexForChangeStream``)?"""
    if spec.kind == "collection" or not spec.show_expanded:
        return lambda ns: False
    if spec.kind == "database":
        target = f"{spec.db}.system.views"
        return lambda ns: ns == target

    def any_db(ns: str) -> bool:
        db, _, coll = ns.partition(".")
        return coll == "system.views" and db not in INTERNAL_DBS
    return any_db


def db_predicate(spec: StreamSpec) -> Callable[[str], bool]:
    """Database name -> does a command on it concern the stream?"""
    if spec.kind == "cluster":
        return lambda db: db not in INTERNAL_DBS
    return lambda db, _d=spec.db: db == _d


def build(spec: StreamSpec) -> Callable[[dict[str, Any]], bool]:
    """The oplog filter for ``spec``: ``entry -> bool``."""
    ns_ok = ns_predicate(spec)
    db_ok = db_predicate(spec)
    show_expanded = spec.show_expanded
    show_migration = spec.show_migration
    needs_merge = spec.needs_merge
    op_ok = crud_predicate(spec)
    view_ok = view_ns_predicate(spec)
    v2 = spec.reader_version == "v2"

    def command_matches(entry: dict[str, Any]) -> bool:
        o = entry.get("o")
        if not isinstance(o, dict) or not o:
            return False
        name = next(iter(o))
        db = entry.get("ns", "").partition(".")[0]
        if name == "commitTransaction":
            # A prepared transaction's commit: its operations are in the prepare entry (the
            # unwind stage looks them up and filters them).
            return True
        if name == "applyOps":
            if o.get("prepare"):
                return False  # not decided yet: its events come with the commitTransaction
            ops = o.get("applyOps")
            return isinstance(ops, list) and any(isinstance(op, dict) and op_ok(op) for op in ops)
        if entry.get("fromMigrate"):
            return False
        if name == "renameCollection":  # source or target watched (may be another database)
            return ns_ok(str(o.get("renameCollection", ""))) or ns_ok(str(o.get("to", "")))
        if not db_ok(db):
            return False
        if name == "dropDatabase":
            return True
        if name == "drop":
            return ns_ok(f"{db}.{o['drop']}")
        if name in EXPANDED_COMMANDS:
            return show_expanded and ns_ok(f"{db}.{o[name]}")
        return False

    def matches(entry: dict[str, Any]) -> bool:
        op = entry.get("op")
        if op in ("i", "u", "d"):
            if entry.get("fromMigrate") and not show_migration:
                return False
            ns = entry.get("ns", "")
            return ns_ok(ns) or view_ok(ns)
        if op == "c":
            return command_matches(entry)
        if op == "n":
            o2 = entry.get("o2")
            if not isinstance(o2, dict) or not o2:
                return False
            if v2 and is_control_noop(o2):  # control no-ops of the stream's namespace or its db
                ns = entry.get("ns", "")
                return ns_ok(ns) or ns == spec.db or spec.kind == "cluster"
            if not ns_ok(entry.get("ns", "")):
                return False
            if "migrateChunkToNewShard" in o2 or o2.get("type") == "migrateChunkToNewShard":
                return needs_merge
            if show_expanded:
                return any(k in o2 for k in NOOP_EVENTS)
            return False
        return False

    return matches


class OplogMatch:
    """The ``$_internalChangeStreamOplogMatch`` stage of one stream.

    ``process(entry) -> bool``: does the oplog entry (dict) concern the stream? It is the
    predicate :func:`build` returns, held as the instance's ``process`` so the cursor's one call
    per entry is the filter itself (the cursor also uses it to decide which appends wake a
    waiting getMore). Never raises for odd entries: they do not match.
    """

    name = "$_internalChangeStreamOplogMatch"
    __slots__ = ("process",)

    def __init__(self, spec: StreamSpec) -> None:
        self.process: Callable[[dict[str, Any]], bool] = build(spec)


#: the commands a transaction's applyOps can carry (a collection or index created in it)
TXN_COMMANDS = ("create", "createIndexes")


def crud_predicate(spec: StreamSpec) -> Callable[[dict[str, Any]], bool]:
    """Filter for the operations inside an ``applyOps`` (unwound transactions): CRUD on a
    watched namespace; with ``showExpandedEvents`` also ``{op: "c", ns: "<db>.$cmd", o:
    {create|createIndexes: <coll>}}`` of a watched namespace, which a transaction that created
    a collection or an index carries (``buildUnwindTransactionFilter`` applies the same
    ``buildOperationFilter`` as the oplog match, ``change_stream_filter_helpers.cpp``)."""
    ns_ok = ns_predicate(spec)
    if not spec.show_expanded:
        return lambda op: op.get("op") in ("i", "u", "d") and ns_ok(op.get("ns", ""))

    def op_ok(op: dict[str, Any]) -> bool:
        kind = op.get("op")
        if kind in ("i", "u", "d"):
            return ns_ok(op.get("ns", ""))
        o = op.get("o")
        if kind != "c" or not isinstance(o, dict) or not o:
            return False
        name = next(iter(o))
        return name in TXN_COMMANDS and \
            ns_ok(f"{str(op.get('ns', '')).partition('.')[0]}.{o[name]}")
    return op_ok
