"""More unified-test-format operations: the ones the CRUD, retryable, session, collection and
index suites use beyond :mod:`shardsim.tools.unified.operations`.

Collection: ``count``, ``findOne``, ``bulkWrite`` (``insertOne``/``updateOne``/``updateMany``/
``replaceOne``/``deleteOne``/``deleteMany`` requests, BulkWriteResult fields),
``listIndexNames``, the search-index helpers (``createSearchIndex(es)``, ``listSearchIndexes``,
``dropSearchIndex``, ``updateSearchIndex``). Database: ``listCollectionObjects``. Client:
``listDatabaseObjects``, ``clientBulkWrite`` (pymongo's ``MongoClient.bulk_write``, result
fields of the CRUD spec's ClientBulkWriteResult). Special (``testRunner``) operations:
``targetedFailPoint`` (on a client connected directly to the mongos the session is pinned
to; RunnerError when it is not pinned),
``assertSessionPinned/Unpinned``, ``assertSessionDirty/NotDirty``,
``assertSameLsidOnLastTwoCommands``, ``assertDifferentLsidOnLastTwoCommands``.

Each function returns ``None`` when it does not know the operation, so the caller reports
``runner: unsupported ... operation``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from pymongo import DeleteMany, DeleteOne, InsertOne, ReplaceOne, UpdateMany, UpdateOne
from pymongo.operations import _Op

from .operations import Args, OpResult, RunnerError, _COMMON, _FIND, _fix_find_kwargs

if TYPE_CHECKING:  # pragma: no cover
    from .runner import TestContext

_MODEL_ARGS = {"filter": "filter", "update": "update", "replacement": "replacement",
               "document": "document", "upsert": "upsert", "arrayFilters": "array_filters",
               "collation": "collation", "hint": "hint", "sort": "sort"}


def _model(request: Mapping[str, Any], namespace: str | None = None) -> Any:
    """One bulk-write request (``{insertOne: {...}}``...) as a pymongo write model."""
    if len(request) != 1:
        raise RunnerError(f"bad bulk write request {request!r}")
    (kind, spec), = request.items()
    kw: dict[str, Any] = {}
    for key, value in spec.items():
        if key == "namespace":
            continue
        if key not in _MODEL_ARGS:
            raise RunnerError(f"unsupported argument {key!r} of {kind}")
        kw[_MODEL_ARGS[key]] = value
    ns = {"namespace": namespace} if namespace else {}
    if kind == "insertOne":
        return InsertOne(kw["document"], **ns)
    if kind in ("updateOne", "updateMany"):
        cls = UpdateOne if kind == "updateOne" else UpdateMany
        flt, upd = kw.pop("filter"), kw.pop("update")
        return cls(flt, upd, **kw, **ns)
    if kind == "replaceOne":
        return ReplaceOne(kw.pop("filter"), kw.pop("replacement"), **kw, **ns)
    if kind in ("deleteOne", "deleteMany"):
        cls = DeleteOne if kind == "deleteOne" else DeleteMany
        return cls(kw.pop("filter"), **kw, **ns)
    raise RunnerError(f"unsupported bulk write request {kind!r}")


def _bulk_result(r: Any) -> dict[str, Any]:
    if not r.acknowledged:
        return {"acknowledged": False}
    return {"deletedCount": r.deleted_count, "insertedCount": r.inserted_count,
            "matchedCount": r.matched_count, "modifiedCount": r.modified_count,
            "upsertedCount": r.upserted_count,
            "upsertedIds": {str(k): v for k, v in (r.upserted_ids or {}).items()}}


def error_result(exc: BaseException) -> dict[str, Any] | None:
    """The partial result a write exception carries, in the unified format's shape (for
    ``expectError.expectResult``): a BulkWriteError's raw ``{nInserted, nRemoved, ...}`` as a
    BulkWriteResult, a ClientBulkWriteException's ``partial_result`` as a ClientBulkWriteResult;
    None when the exception has none."""
    partial = getattr(exc, "partial_result", None)
    if partial is not None:
        return _client_bulk_result(partial)
    if type(exc).__name__ == "ClientBulkWriteException":
        return None
    details = getattr(exc, "details", None)
    if type(exc).__name__ == "BulkWriteError" and isinstance(details, Mapping):
        return {"deletedCount": details.get("nRemoved", 0),
                "insertedCount": details.get("nInserted", 0),
                "matchedCount": details.get("nMatched", 0),
                "modifiedCount": details.get("nModified", 0),
                "upsertedCount": details.get("nUpserted", 0),
                "upsertedIds": {str(u["index"]): u["_id"] for u in details.get("upserted", [])}}
    return details


def check_client_bulk_error(ctx: "TestContext", key: str, want: Any, exc: BaseException) -> None:
    """``expectError.writeErrors`` (``{"<index>": error}``, exactly those indexes) and
    ``expectError.writeConcernErrors`` (a list) of a ClientBulkWriteException."""
    from .matcher import MatchError
    if type(exc).__name__ != "ClientBulkWriteException":
        raise MatchError(f"expected a client bulk write error with {key}, got "
                         f"{type(exc).__name__}: {exc}")
    if key == "writeErrors":
        got = {str(e["idx"]): {k: v for k, v in e.items() if k not in ("idx", "op")}
               for e in exc.write_errors or []}
        if sorted(got) != sorted(want):
            raise MatchError(f"expected write errors at {sorted(want)}, got {sorted(got)}")
        for i, spec in want.items():
            ctx.matcher.match(spec, got[i], root=True, path=f"writeErrors.{i}")
        return
    got_wce = [{"code": e.get("code"), "message": e.get("errmsg"),
                **({"details": e["errInfo"]} if "errInfo" in e else {})}
               for e in exc.write_concern_errors or []]
    ctx.matcher.match(want, got_wce, root=True, path="writeConcernErrors")


def collection_extra(ctx: "TestContext", coll: Any, name: str, a: Args) -> OpResult | None:
    """The collection operations :func:`operations.collection_op` does not know."""
    if name == "count":
        flt = a.opt("filter", {})
        kw = a.kwargs({**_COMMON, "skip": "skip", "limit": "limit", "hint": "hint",
                       "collation": "collation", "maxTimeMS": "maxTimeMS"})
        a.done()
        cmd: dict[str, Any] = {"count": coll.name, "query": flt}
        session = kw.pop("session", None)
        cmd.update(kw)
        # the count command as drivers run it: a retryable read (pymongo keeps the helper
        # estimated_document_count uses; it has no public count with a filter)
        return OpResult(coll._retryable_non_cursor_read(
            lambda s, _server, conn, rp: coll._count_cmd(s, conn, rp, cmd, None),
            session, _Op.COUNT))
    if name == "findOne":
        kw = _fix_find_kwargs(a.kwargs(_FIND))
        a.done()
        return OpResult(coll.find_one(**kw))
    if name == "bulkWrite":
        models = [_model(r) for r in a.req("requests")]
        kw = a.kwargs({**_COMMON, "ordered": "ordered", "let": "let",
                       "bypassDocumentValidation": "bypass_document_validation"})
        a.done()
        return OpResult(_bulk_result(coll.bulk_write(models, **kw)))
    if name == "listIndexNames":
        kw = a.kwargs(_COMMON)
        a.done()
        return OpResult([ix["name"] for ix in coll.list_indexes(**kw)])
    return _search_index_op(coll, name, a)


def _search_index_op(coll: Any, name: str, a: Args) -> OpResult | None:
    from pymongo.operations import SearchIndexModel

    if name == "createSearchIndex":
        model = a.req("model")
        a.done()
        return OpResult(coll.create_search_index(SearchIndexModel(**model)))
    if name == "createSearchIndexes":
        models = a.req("models")
        a.done()
        return OpResult(coll.create_search_indexes([SearchIndexModel(**m) for m in models]))
    if name == "listSearchIndexes":
        kw = {}
        if a.has("name"):
            kw["name"] = a.req("name")
        agg = a.opt("aggregationOptions") or {}
        a.done()
        return OpResult(list(coll.list_search_indexes(**kw, **agg)), docs_are_roots=True)
    if name == "dropSearchIndex":
        index = a.req("name")
        a.done()
        coll.drop_search_index(index)
        return OpResult()
    if name == "updateSearchIndex":
        index, definition = a.req("name"), a.req("definition")
        a.done()
        coll.update_search_index(index, definition)
        return OpResult()
    return None


def database_extra(ctx: "TestContext", db: Any, name: str, a: Args) -> OpResult | None:
    """Database operations beyond :func:`operations.database_op`."""
    if name == "listCollectionObjects":
        kw = a.kwargs({**_COMMON, "filter": "filter", "batchSize": "batchSize"})
        a.done()
        return OpResult(list(db.list_collections(**kw)), docs_are_roots=True)
    return None


def client_extra(ctx: "TestContext", client: Any, name: str, a: Args) -> OpResult | None:
    """Client operations beyond :func:`operations.client_op`."""
    if name == "listDatabaseObjects":
        kw = a.kwargs({**_COMMON, "filter": "filter"})
        a.done()
        return OpResult(list(client.list_databases(**kw)), docs_are_roots=True)
    if name == "clientBulkWrite":
        models = [_model(m, ns) for m, ns in _client_models(a.req("models"))]
        kw = a.kwargs({**_COMMON, "ordered": "ordered", "let": "let",
                       "verboseResults": "verbose_results", "writeConcern": "write_concern",
                       "bypassDocumentValidation": "bypass_document_validation"})
        a.done()
        return OpResult(_client_bulk_result(client.bulk_write(models, **kw)))
    return None


def _client_models(models: list[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], str]]:
    out = []
    for m in models:
        (kind, spec), = m.items()
        out.append(({kind: spec}, spec["namespace"]))
    return out


def _client_bulk_result(r: Any) -> dict[str, Any]:
    if not r.acknowledged:
        return {"acknowledged": False}
    out: dict[str, Any] = {"insertedCount": r.inserted_count, "upsertedCount": r.upserted_count,
                           "matchedCount": r.matched_count, "modifiedCount": r.modified_count,
                           "deletedCount": r.deleted_count}
    if r.has_verbose_results:
        out["insertResults"] = {str(i): {"insertedId": v.inserted_id}
                                for i, v in r.insert_results.items()}
        out["updateResults"] = {str(i): {"matchedCount": v.matched_count,
                                         "modifiedCount": v.modified_count,
                                         **({"upsertedId": v.upserted_id}
                                            if v.upserted_id is not None else {})}
                                for i, v in r.update_results.items()}
        out["deleteResults"] = {str(i): {"deletedCount": v.deleted_count}
                                for i, v in r.delete_results.items()}
    return out


def direct_command(cache: dict[tuple[str, int], Any], address: tuple[str, int],
                   cmd: Mapping[str, Any], uri: str | None = None) -> Any:
    """Run ``cmd`` on ``admin`` of the one server at ``address`` through an internal client
    connected directly to it, kept in ``cache`` (format: ``targetedFailPoint`` on the pinned
    mongos, ``killAllSessions`` on each mongos). ``uri``: a connection string for that server
    whose credentials and options the client takes (an authenticated deployment)."""
    from pymongo import MongoClient
    client = cache.get(address)
    if client is None:
        if uri is not None:
            client = MongoClient(uri, directConnection=True, serverSelectionTimeoutMS=10000)
        else:
            client = MongoClient(address[0], address[1], directConnection=True,
                                 serverSelectionTimeoutMS=10000)
        cache[address] = client
    return client.admin.command(dict(cmd))


def special_extra(ctx: "TestContext", name: str, args: Mapping[str, Any]) -> bool:
    """``testRunner`` operations beyond the runner's own; False when unknown."""
    if name == "targetedFailPoint":
        # format: set the fail point on the mongos the session is pinned to, through a new
        # client connected directly to it, and disable it later on that same mongos
        session = ctx.entities.get(args["session"], "session")
        address = getattr(session, "_pinned_address", None)  # pymongo keeps it private
        if address is None:
            raise RunnerError("targetedFailPoint: the session is not pinned to a mongos")
        fp = dict(args["failPoint"])
        ctx.runner.command_on(address, fp)
        ctx.targeted_failpoints.append((address, fp["configureFailPoint"]))
        return True
    if name in ("assertSessionPinned", "assertSessionUnpinned"):
        session = ctx.entities.get(args["session"], "session")
        # pymongo keeps the mongos a transaction is pinned to in _transaction.pinned_address,
        # also after commit (then _pinned_address, which asks for an active transaction, is
        # None): "pinned" is that address, "unpinned" needs both to be None.
        kept = getattr(getattr(session, "_transaction", None), "pinned_address", None)
        pinned = kept is not None if name == "assertSessionPinned" else \
            kept is not None or getattr(session, "_pinned_address", None) is not None
        if pinned != (name == "assertSessionPinned"):
            raise AssertionError(f"{name}: the session is {'' if pinned else 'not '}pinned")
        return True
    if name in ("assertSessionDirty", "assertSessionNotDirty"):
        session = ctx.entities.get(args["session"], "session")
        dirty = bool(session._server_session.dirty)  # pymongo keeps it private
        if dirty != (name == "assertSessionDirty"):
            raise AssertionError(f"{name}: the session is {'' if dirty else 'not '}dirty")
        return True
    if name in ("assertSameLsidOnLastTwoCommands", "assertDifferentLsidOnLastTwoCommands"):
        ce = ctx.entities.get(args["client"], "client")
        events = ce.recorder.events if ce.recorder is not None else []
        started = [e.event for e in events if e.kind == "commandStartedEvent"]
        if len(started) < 2:
            raise AssertionError(f"{name}: fewer than two commands were observed")
        a, b = (e.command.get("lsid") for e in started[-2:])
        if (a == b) != (name == "assertSameLsidOnLastTwoCommands"):
            raise AssertionError(f"{name}: lsids {a} and {b}")
        return True
    return False
