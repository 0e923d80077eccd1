"""Entity operations of the unified test format, executed with pymongo.

Each handler takes the :class:`Args` of one operation and returns an :class:`OpResult`
(``value`` plus whether it is an iterable of root-level documents, which changes how
``expectResult`` is matched). Unknown operations or arguments raise
:class:`~shardsim.tools.unified.matcher.RunnerError` (the spec requires an error, not silence).

Sources: ``unified-test-format.md`` §Entity Test Operations, §Cursor Operations; the CRUD,
Change Streams and Index Management specs for the argument names.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from pymongo import ReadPreference
from pymongo.change_stream import ChangeStream
from pymongo.collection import Collection
from pymongo.database import Database
from pymongo.errors import PyMongoError
from pymongo.read_concern import ReadConcern
from pymongo.read_preferences import make_read_preference, read_pref_mode_from_name
from pymongo.write_concern import WriteConcern

from .entities import CursorEntity
from .matcher import RunnerError

if TYPE_CHECKING:  # pragma: no cover
    from .runner import TestContext


@dataclass
class OpResult:
    """An operation's outcome: ``value`` (None for void) and ``docs_are_roots`` (True for
    find/aggregate-style results whose array elements match as root-level documents)."""

    value: Any = None
    docs_are_roots: bool = False
    kind: str | None = None  # entity kind when the result is a driver object


class Args:
    """Operation arguments with bookkeeping so unknown ones are reported (spec requirement)."""

    def __init__(self, op_name: str, args: dict | None, ctx: "TestContext") -> None:
        self.op = op_name
        self._args = dict(args or {})
        self._used: set[str] = set()
        self.ctx = ctx
        if "rawData" in self._args:
            # Drivers ignore rawData below server 8.2 (CRUD spec "rawData"); pymongo has no
            # such argument, so the runner only accepts it as ignored.
            self._used.add("rawData")

    def req(self, name: str) -> Any:
        if name not in self._args:
            raise RunnerError(f"{self.op}: missing required argument {name!r}")
        self._used.add(name)
        return self._args[name]

    def opt(self, name: str, default: Any = None) -> Any:
        if name in self._args:
            self._used.add(name)
            return self._args[name]
        return default

    def has(self, name: str) -> bool:
        return name in self._args

    def kwargs(self, mapping: dict[str, str]) -> dict[str, Any]:
        """Map present camelCase arguments to pymongo keyword arguments."""
        out: dict[str, Any] = {}
        for camel, snake in mapping.items():
            if camel in self._args:
                self._used.add(camel)
                out[snake] = self.convert(camel, self._args[camel])
        return out

    def convert(self, name: str, value: Any) -> Any:
        if name == "session":
            return self.ctx.entities.get(value, "session")
        if name == "readConcern":
            return ReadConcern(**({"level": value["level"]} if "level" in value else {}))
        if name == "writeConcern":
            return make_write_concern(value)
        if name == "readPreference":
            return make_read_pref(value)
        return value

    def done(self) -> None:
        extra = sorted(set(self._args) - self._used)
        if extra:
            raise RunnerError(f"{self.op}: unsupported argument(s) {extra}")


def make_write_concern(doc: dict) -> WriteConcern:
    kw: dict[str, Any] = {}
    if "w" in doc:
        kw["w"] = doc["w"]
    if "journal" in doc:
        kw["j"] = doc["journal"]
    if "j" in doc:
        kw["j"] = doc["j"]
    if "wtimeoutMS" in doc:
        kw["wtimeout"] = doc["wtimeoutMS"]
    return WriteConcern(**kw)


def make_read_pref(doc: dict) -> Any:
    """readPreference common option → pymongo read preference object."""
    name = doc["mode"][0].lower() + doc["mode"][1:]
    mode = read_pref_mode_from_name(name)
    if mode == 0:
        return ReadPreference.PRIMARY
    return make_read_preference(mode, doc.get("tagSets"), doc.get("maxStalenessSeconds", -1))


def collection_options(doc: dict | None) -> dict[str, Any]:
    """collectionOrDatabaseOptions → pymongo ``get_database``/``get_collection`` kwargs."""
    out: dict[str, Any] = {}
    for key, value in (doc or {}).items():
        if key == "readConcern":
            out["read_concern"] = ReadConcern(value.get("level"))
        elif key == "writeConcern":
            out["write_concern"] = make_write_concern(value)
        elif key == "readPreference":
            out["read_preference"] = make_read_pref(value)
        elif key == "timeoutMS":
            raise RunnerError("collection/database option timeoutMS is not supported by this runner")
        else:
            raise RunnerError(f"unsupported collection/database option {key!r}")
    return out


# ---------------------------------------------------------------------------------------------
# option maps (camelCase test argument -> pymongo keyword)
_COMMON = {"session": "session", "comment": "comment"}
_WRITE = {**_COMMON, "hint": "hint", "collation": "collation", "let": "let",
          "bypassDocumentValidation": "bypass_document_validation"}
_UPDATE = {**_WRITE, "upsert": "upsert", "arrayFilters": "array_filters", "sort": "sort"}
_FIND = {**_COMMON, "filter": "filter", "projection": "projection", "sort": "sort",
         "skip": "skip", "limit": "limit", "batchSize": "batch_size", "hint": "hint",
         "collation": "collation", "maxTimeMS": "max_time_ms", "allowDiskUse": "allow_disk_use",
         "let": "let", "min": "min", "max": "max", "returnKey": "return_key",
         "showRecordId": "show_record_id", "noCursorTimeout": "no_cursor_timeout",
         "allowPartialResults": "allow_partial_results"}
_AGG = {**_COMMON, "batchSize": "batchSize", "collation": "collation", "maxTimeMS": "maxTimeMS",
        "allowDiskUse": "allowDiskUse", "let": "let", "hint": "hint",
        "bypassDocumentValidation": "bypassDocumentValidation"}
_WATCH = {"session": "session", "comment": "comment", "fullDocument": "full_document",
          "fullDocumentBeforeChange": "full_document_before_change",
          "resumeAfter": "resume_after", "startAfter": "start_after",
          "startAtOperationTime": "start_at_operation_time", "batchSize": "batch_size",
          "collation": "collation", "maxAwaitTimeMS": "max_await_time_ms",
          "showExpandedEvents": "show_expanded_events"}


def _sort_arg(value: Any) -> Any:
    if isinstance(value, dict):
        return list(value.items())
    return value


def _fix_find_kwargs(kw: dict[str, Any]) -> dict[str, Any]:
    if "sort" in kw:
        kw["sort"] = _sort_arg(kw["sort"])
    if "hint" in kw and isinstance(kw["hint"], dict):
        kw["hint"] = list(kw["hint"].items())
    return kw


def _update_result(r: Any) -> dict:
    if not r.acknowledged:
        return {"acknowledged": False}
    out = {"matchedCount": r.matched_count, "modifiedCount": r.modified_count,
           "upsertedCount": 0 if r.upserted_id is None else 1}
    if r.upserted_id is not None:
        out["upsertedId"] = r.upserted_id
    return out


# ---------------------------------------------------------------------------------------------
# change streams and cursors

def _watch(target: Any, a: Args) -> OpResult:
    pipeline = a.opt("pipeline", [])
    kw = a.kwargs(_WATCH)
    a.done()
    # pymongo's watch() runs the aggregate immediately (ChangeStream.__init__ creates the
    # cursor), which is what createChangeStream requires.
    stream = target.watch(pipeline, **kw)
    return OpResult(stream, kind="changeStream")


def iterate_until_document_or_error(ctx: "TestContext", entity: Any, kind: str) -> OpResult:
    """Iterate until one document or an error (bounded by ``ctx.iterate_timeout`` seconds)."""
    deadline = time.monotonic() + ctx.iterate_timeout
    if kind == "changeStream":
        stream: ChangeStream = entity
        while True:
            # try_next() is one getMore at most; pymongo's next() is this same loop unbounded.
            doc = stream.try_next()
            if doc is not None:
                return OpResult(doc)
            if not stream.alive:
                raise RunnerError("change stream is closed: no document to iterate")
            if time.monotonic() > deadline:
                raise AssertionError(f"no change event within {ctx.iterate_timeout:g} s "
                                     "(iterateUntilDocumentOrError)")
    cur: CursorEntity = entity
    if cur.pending:
        return OpResult(cur.pending.pop(0))
    c = cur.cursor
    if hasattr(c, "try_next"):
        while True:
            doc = c.try_next()
            if doc is not None:
                return OpResult(doc)
            if not c.alive:
                raise RunnerError("cursor is exhausted: no document to iterate")
            if time.monotonic() > deadline:
                raise AssertionError(f"no document within {ctx.iterate_timeout:g} s")
    try:
        return OpResult(next(c))
    except StopIteration:
        raise RunnerError("cursor is exhausted: no document to iterate") from None


def iterate_once(ctx: "TestContext", entity: Any, kind: str) -> OpResult:
    """One iteration: at most one getMore when the current batch is empty."""
    if kind == "changeStream":
        return OpResult(entity.try_next())
    cur: CursorEntity = entity
    if cur.pending:
        return OpResult(cur.pending.pop(0))
    c = cur.cursor
    if hasattr(c, "try_next"):
        return OpResult(c.try_next())
    if not c.alive:
        return OpResult(None)
    try:
        return OpResult(next(c))
    except StopIteration:
        return OpResult(None)


def close_cursor(entity: Any, kind: str) -> None:
    """Close a change stream/cursor, suppressing every error (spec: Cursor Operations close)."""
    try:
        if kind == "changeStream":
            entity.close()
        else:
            entity.cursor.close()
    except Exception:
        pass


# ---------------------------------------------------------------------------------------------
# client operations

def client_op(ctx: "TestContext", client_id: str, name: str, a: Args) -> OpResult:
    ce = ctx.entities.get(client_id, "client")
    client = ce.client
    if name == "createChangeStream":
        return _watch(client, a)
    if name == "close":
        a.done()
        ctx.close_client(ce)
        return OpResult()
    if name == "listDatabases":
        kw = a.kwargs({**_COMMON, "filter": "filter", "nameOnly": "nameOnly",
                       "authorizedDatabases": "authorizedDatabases"})
        a.done()
        return OpResult(list(client.list_databases(**kw)), docs_are_roots=True)
    if name == "listDatabaseNames":
        kw = a.kwargs({**_COMMON, "filter": "filter"})
        a.done()
        return OpResult(client.list_database_names(**kw))
    if name == "dropDatabase":
        db = a.req("database") if a.has("database") else a.req("databaseName")
        kw = a.kwargs(_COMMON)
        a.done()
        client.drop_database(db, **kw)
        return OpResult()
    from .operations_extra import client_extra
    result = client_extra(ctx, client, name, a)
    if result is not None:
        return result
    raise RunnerError(f"unsupported client operation {name!r}")


# ---------------------------------------------------------------------------------------------
# database operations

def database_op(ctx: "TestContext", db: Database, name: str, a: Args) -> OpResult:
    if name == "createChangeStream":
        return _watch(db, a)
    if name == "runCommand":
        command = a.req("command")
        a.req("commandName")
        kw = a.kwargs({"session": "session", "readPreference": "read_preference"})
        a.done()
        return OpResult(db.command(dict(command), **kw))
    if name in ("runCursorCommand", "createCommandCursor"):
        command = a.req("command")
        a.req("commandName")
        batch = a.opt("batchSize")
        kw = a.kwargs({"session": "session", "readPreference": "read_preference",
                       "comment": "comment", "maxTimeMS": "max_await_time_ms"})
        # a tailable cursor is the server's business (the command says tailable/awaitData);
        # pymongo's CommandCursor keeps a live cursor open across empty batches
        if a.opt("cursorType") not in (None, "tailable", "tailableAwait"):
            raise RunnerError(f"{name}: unknown cursorType")
        if a.has("timeoutMode"):
            raise RunnerError(f"{name}: timeoutMode is not supported by this runner")
        a.done()
        cursor = db.cursor_command(dict(command), **kw)
        if batch is not None:
            cursor.batch_size(batch)
        if name == "createCommandCursor":
            return OpResult(CursorEntity(cursor), kind="commandCursor")
        return OpResult(list(cursor), docs_are_roots=True)
    if name == "aggregate":
        pipeline = a.req("pipeline")
        kw = a.kwargs(_AGG)
        a.done()
        return OpResult(list(db.aggregate(pipeline, **kw)), docs_are_roots=True)
    if name == "createCollection":
        coll = a.req("collection")
        session = a.opt("session")
        opts = {k: v for k, v in a._args.items() if k not in ("collection", "session")}
        a._used.update(opts)
        a.done()
        kw: dict[str, Any] = {}
        if session is not None:
            kw["session"] = ctx.entities.get(session, "session")
        # check_exists=False: the spec's create is one command (no listCollections first)
        result = db.create_collection(coll, check_exists=False, **kw, **opts)
        return OpResult(result, kind="collection")
    if name == "dropCollection":
        coll = a.req("collection")
        kw = a.kwargs(_COMMON)
        if a.has("encryptedFields"):
            kw["encrypted_fields"] = a.req("encryptedFields")
        a.done()
        db.drop_collection(coll, **kw)
        return OpResult()
    if name == "modifyCollection":
        coll = a.req("collection")
        session = a.opt("session")
        opts = {k: v for k, v in a._args.items() if k not in ("collection", "session")}
        a._used.update(opts)
        a.done()
        cmd = {"collMod": coll, **opts}
        kw = {"session": ctx.entities.get(session, "session")} if session else {}
        return OpResult(db.command(cmd, **kw))
    if name == "dropDatabase":
        kw = a.kwargs(_COMMON)
        a.done()
        db.client.drop_database(db.name, **kw)
        return OpResult()
    if name == "listCollections":
        kw = a.kwargs({**_COMMON, "filter": "filter", "batchSize": "batchSize",
                       "nameOnly": "nameOnly", "authorizedCollections": "authorizedCollections"})
        a.done()
        return OpResult(list(db.list_collections(**kw)), docs_are_roots=True)
    if name == "listCollectionNames":
        kw = a.kwargs({**_COMMON, "filter": "filter"})
        a.done()
        return OpResult(db.list_collection_names(**kw))
    from .operations_extra import database_extra
    result = database_extra(ctx, db, name, a)
    if result is not None:
        return result
    raise RunnerError(f"unsupported database operation {name!r}")


# ---------------------------------------------------------------------------------------------
# collection operations

def collection_op(ctx: "TestContext", coll: Collection, name: str, a: Args) -> OpResult:
    if name == "createChangeStream":
        return _watch(coll, a)
    if name == "insertOne":
        doc = a.req("document")
        kw = a.kwargs(_WRITE)
        kw.pop("hint", None)
        a.done()
        r = coll.insert_one(doc, **kw)
        return OpResult({"insertedId": r.inserted_id})
    if name == "insertMany":
        docs = a.req("documents")
        kw = a.kwargs({**_WRITE, "ordered": "ordered"})
        a.done()
        r = coll.insert_many(docs, **kw)
        return OpResult({"insertedIds": {str(i): v for i, v in enumerate(r.inserted_ids)}})
    if name in ("updateOne", "updateMany"):
        flt = a.req("filter")
        upd = a.req("update")
        kw = a.kwargs(_UPDATE)
        a.done()
        fn = coll.update_one if name == "updateOne" else coll.update_many
        return OpResult(_update_result(fn(flt, upd, **kw)))
    if name == "replaceOne":
        flt = a.req("filter")
        rep = a.req("replacement")
        kw = a.kwargs({k: v for k, v in _UPDATE.items() if k != "arrayFilters"})
        a.done()
        return OpResult(_update_result(coll.replace_one(flt, rep, **kw)))
    if name in ("deleteOne", "deleteMany"):
        flt = a.req("filter")
        kw = a.kwargs({k: v for k, v in _WRITE.items() if k != "bypassDocumentValidation"})
        a.done()
        fn = coll.delete_one if name == "deleteOne" else coll.delete_many
        r = fn(flt, **kw)
        return OpResult({"deletedCount": r.deleted_count} if r.acknowledged
                        else {"acknowledged": False})
    if name in ("find", "createFindCursor"):
        kw = _fix_find_kwargs(a.kwargs(_FIND))
        a.done()
        cursor = coll.find(**kw)
        if name == "find":
            return OpResult(list(cursor), docs_are_roots=True)
        ent = CursorEntity(cursor)
        # Create the server-side cursor now; keep the first document for the first iteration.
        try:
            ent.pending.append(next(cursor))
        except StopIteration:
            pass
        return OpResult(ent, kind="findCursor")
    if name == "aggregate":
        pipeline = a.req("pipeline")
        kw = a.kwargs(_AGG)
        a.done()
        return OpResult(list(coll.aggregate(pipeline, **kw)), docs_are_roots=True)
    if name == "countDocuments":
        flt = a.req("filter")
        kw = a.kwargs({**_COMMON, "skip": "skip", "limit": "limit", "hint": "hint",
                       "collation": "collation", "maxTimeMS": "maxTimeMS"})
        a.done()
        return OpResult(coll.count_documents(flt, **kw))
    if name == "estimatedDocumentCount":
        kw = a.kwargs({"comment": "comment", "maxTimeMS": "maxTimeMS"})
        a.done()
        return OpResult(coll.estimated_document_count(**kw))
    if name == "mapReduce":
        # pymongo 4 has no map_reduce helper: the command, as drivers send it (not retried)
        cmd: dict[str, Any] = {"mapReduce": coll.name, "map": a.req("map"),
                               "reduce": a.req("reduce"), "out": a.req("out")}
        for opt in ("query", "sort", "limit", "finalize", "scope", "jsMode", "verbose",
                    "bypassDocumentValidation", "collation"):
            if a.opt(opt) is not None:
                cmd[opt] = a.opt(opt)
        kw = a.kwargs(_COMMON)
        a.done()
        reply = coll.database.command(cmd, read_preference=coll.read_preference,
                                      codec_options=coll.codec_options, **kw)
        return OpResult(reply["results"] if "results" in reply else reply.get("result"))
    if name == "distinct":
        key = a.req("fieldName")
        flt = a.req("filter")
        kw = a.kwargs({**_COMMON, "collation": "collation", "hint": "hint"})
        a.done()
        return OpResult(coll.distinct(key, flt, **kw))
    if name in ("findOneAndUpdate", "findOneAndReplace", "findOneAndDelete"):
        from pymongo import ReturnDocument
        flt = a.req("filter")
        kw = a.kwargs({**_WRITE, "projection": "projection", "sort": "sort", "upsert": "upsert",
                       "arrayFilters": "array_filters", "maxTimeMS": "maxTimeMS",
                       # pymongo's find_one_and_* pass extra keywords into the command as is
                       "bypassDocumentValidation": "bypassDocumentValidation"})
        if "sort" in kw:
            kw["sort"] = _sort_arg(kw["sort"])
        rd = a.opt("returnDocument")
        if rd is not None:
            if rd.lower() not in ("before", "after"):
                raise RunnerError(f"invalid returnDocument {rd!r}")
            kw["return_document"] = ReturnDocument.AFTER if rd.lower() == "after" \
                else ReturnDocument.BEFORE
        if name == "findOneAndUpdate":
            upd = a.req("update")
            a.done()
            return OpResult(coll.find_one_and_update(flt, upd, **kw))
        if name == "findOneAndReplace":
            rep = a.req("replacement")
            a.done()
            return OpResult(coll.find_one_and_replace(flt, rep, **kw))
        a.done()
        return OpResult(coll.find_one_and_delete(flt, **kw))
    if name == "createIndex":
        keys = a.req("keys")
        kw = a.kwargs({"session": "session", "comment": "comment"})
        opts = {k: v for k, v in a._args.items() if k not in ("keys", "session", "comment")}
        a._used.update(opts)
        a.done()
        return OpResult(coll.create_index(list(keys.items()), **kw, **opts))
    if name == "dropIndex":
        idx = a.req("name")
        kw = a.kwargs(_COMMON)
        a.done()
        coll.drop_index(idx, **kw)
        return OpResult()
    if name == "dropIndexes":
        kw = a.kwargs(_COMMON)
        a.done()
        coll.drop_indexes(**kw)
        return OpResult()
    if name == "listIndexes":
        kw = a.kwargs(_COMMON)
        a.done()
        return OpResult(list(coll.list_indexes(**kw)), docs_are_roots=True)
    if name == "rename":
        to = a.req("to")
        kw = a.kwargs(_COMMON)
        if a.has("dropTarget"):
            kw["dropTarget"] = a.req("dropTarget")
        a.done()
        coll.rename(to, **kw)
        return OpResult()
    if name == "drop":
        kw = a.kwargs(_COMMON)
        a.done()
        coll.drop(**kw)
        return OpResult()
    from .operations_extra import collection_extra
    result = collection_extra(ctx, coll, name, a)
    if result is not None:
        return result
    raise RunnerError(f"unsupported collection operation {name!r}")


# ---------------------------------------------------------------------------------------------
# session operations

def session_op(ctx: "TestContext", session: Any, name: str, a: Args,
               run_nested: Callable[[list], None]) -> OpResult:
    if name == "startTransaction":
        kw = a.kwargs({"readConcern": "read_concern", "writeConcern": "write_concern",
                       "readPreference": "read_preference", "maxCommitTimeMS": "max_commit_time_ms"})
        a.done()
        session.start_transaction(**kw)
        ctx.started_transaction = True
        return OpResult()
    if name == "commitTransaction":
        a.done()
        session.commit_transaction()
        return OpResult()
    if name == "abortTransaction":
        a.done()
        session.abort_transaction()
        return OpResult()
    if name == "getSnapshotTime":
        a.done()
        # pymongo keeps the snapshot time of a snapshot session (the first reply's
        # atClusterTime) in _snapshot_time; it has no public accessor.
        return OpResult(session._snapshot_time)
    if name == "endSession":
        a.done()
        session.end_session()
        return OpResult()
    if name == "withTransaction":
        callback = a.req("callback")
        kw = a.kwargs({"readConcern": "read_concern", "writeConcern": "write_concern",
                       "readPreference": "read_preference", "maxCommitTimeMS": "max_commit_time_ms"})
        a.done()
        ctx.started_transaction = True
        session.with_transaction(lambda s: run_nested(callback), **kw)
        return OpResult()
    raise RunnerError(f"unsupported session operation {name!r}")


def error_is_from_server(exc: BaseException) -> bool:
    """True when the error carries a server reply (OperationFailure, NotPrimaryError...)."""
    from pymongo.errors import NotPrimaryError, OperationFailure
    return isinstance(exc, (OperationFailure, NotPrimaryError))


def server_reply(exc: BaseException) -> dict | None:
    """The server's error document behind a pymongo error, if any."""
    if not error_is_from_server(exc):
        return None
    details = getattr(exc, "details", None)
    return details if isinstance(details, dict) else None


__all__ = ["Args", "OpResult", "PyMongoError", "client_op", "database_op", "collection_op",
           "session_op", "iterate_once", "iterate_until_document_or_error", "close_cursor",
           "collection_options", "error_is_from_server", "server_reply"]
