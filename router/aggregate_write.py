"""``$out`` and ``$merge`` through the router, with sharded or unsharded inputs and outputs
(mongos: ``src/mongo/db/pipeline/document_source_out.cpp``, ``document_source_merge.cpp``;
the router runs the part of the pipeline before the write stage like any aggregate, then
writes the results through its own write path, so the output namespace is targeted by shard
key like any client write).

* ``$out: "coll"`` / ``{db, coll}``: the output collection's documents are replaced by the
  results (existing documents removed, then the results inserted; indexes and options stay,
  as mongod's temp-collection rename keeps them). ``$out`` into a sharded collection is
  refused with 28769, as mongod 8.0 does.
* ``$merge: "coll"`` / ``{into, on, whenMatched, whenNotMatched, let}``: per result document,
  matched on ``on`` (default ``_id``): ``whenMatched`` ``merge`` (default: ``$set`` of the
  result's fields), ``replace``, ``keepExisting``, ``fail`` (DuplicateKey 11000) or a pipeline
  (with ``$$new`` bound to the result); ``whenNotMatched`` ``insert`` (default), ``discard`` or
  ``fail`` (13113).

The aggregate's reply is an empty cursor (``id: 0``), like the server's.

Not faithful: the replacement of ``$out`` is not atomic (a reader may see the output
collection between the removal and the inserts, and a change stream sees the deletes and
inserts rather than mongod's rename-over); ``on`` fields need no unique index here (mongod
refuses with 51183 when none exists).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Awaitable, Callable

from shardsim.router import writes
from shardsim.core.commands import Request, bson_type_name
from shardsim.core.errors import MongoError

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.router.node import RouterNode

# Runs an aggregate body on the router and returns its documents.
Reader = Callable[[Request], Awaitable[list[dict[str, Any]]]]


def write_stage(pipeline: list[Any]) -> tuple[str, Any] | None:
    """``("$out"|"$merge", spec)`` when the pipeline's last stage writes, else None. Location
    40601 when a write stage is not the last one."""
    for i, stage in enumerate(pipeline):
        if isinstance(stage, dict) and ("$out" in stage or "$merge" in stage):
            name = "$out" if "$out" in stage else "$merge"
            if i != len(pipeline) - 1:
                raise MongoError(40601, f"{name} can only be the final stage in the pipeline")
            return name, stage[name]
    return None


def _target(name: str, spec: Any, db: str) -> tuple[str, str]:
    """The output namespace ``(db, coll)`` of a ``$out``/``$merge`` spec."""
    if name == "$merge":
        spec = spec.get("into") if isinstance(spec, dict) else spec
    if isinstance(spec, str):
        return db, spec
    if isinstance(spec, dict) and isinstance(spec.get("coll"), str):
        return str(spec.get("db", db)), spec["coll"]
    code = 16990 if name == "$out" else 51178
    raise MongoError(code, f"{name} only supports a string or object argument, with 'coll' "
                           f"(and optionally 'db'), got {bson_type_name(spec)}")


async def _write(node: "RouterNode", req: Request, kind: str, db: str, coll: str,
                 stmts: list[Any], ordered: bool = True) -> dict[str, Any]:
    """One insert/update/delete through :func:`router.writes.run_write`; the first write
    error is raised as the aggregate's error (as the server fails the aggregate)."""
    field = {"insert": "documents", "update": "updates", "delete": "deletes"}[kind]
    body: dict[str, Any] = {kind: coll, field: stmts, "ordered": ordered, "$db": db}
    for k in ("bypassDocumentValidation", "writeConcern"):
        if k in req.body:
            body[k] = req.body[k]
    reply = await writes.run_write(node, Request(kind, db, body, req.conn), kind)
    errs = reply.get("writeErrors")
    if errs:
        e = errs[0]
        raise MongoError(int(e["code"]), e.get("errmsg", ""),
                         **{k: e[k] for k in ("keyPattern", "keyValue") if k in e})
    return reply


async def run_out(node: "RouterNode", req: Request, docs: list[dict[str, Any]],
                  spec: Any) -> None:
    """``$out``: replace the output collection's documents by ``docs``."""
    db, coll = _target("$out", spec, req.db)
    if node.catalog.collection(f"{db}.{coll}") is not None:
        raise MongoError(28769, f"{db}.{coll} cannot be sharded")
    await _write(node, req, "delete", db, coll, [{"q": {}, "limit": 0}])
    if docs:
        await _write(node, req, "insert", db, coll, docs)
    else:  # $out of nothing still leaves an (empty) collection
        await node.run_command(Request("create", db, {"create": coll, "$db": db}, req.conn))


def _merge_stmt(doc: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any] | None:
    """The update statement that merges ``doc`` (None for ``whenNotMatched: discard`` with
    ``whenMatched: keepExisting``, which never writes)."""
    on = spec.get("on", "_id")
    on_fields = [on] if isinstance(on, str) else list(on)
    q: dict[str, Any] = {}
    for f in on_fields:
        if f not in doc:
            raise MongoError(51132, f"$merge write error: 'on' field '{f}' cannot be missing, "
                                    f"null, undefined or an array")
        q[f] = doc[f]
    matched = spec.get("whenMatched", "merge")
    upsert = spec.get("whenNotMatched", "insert") == "insert"
    if matched == "merge":
        u: Any = {"$set": {k: v for k, v in doc.items() if k != "_id" or "_id" in on_fields}}
        if not u["$set"]:
            u = {"$set": {on_fields[0]: doc[on_fields[0]]}}
    elif matched == "replace":
        u = doc
    elif matched == "keepExisting":
        if not upsert:
            return None
        u = {"$setOnInsert": doc}
    elif isinstance(matched, list):
        stmt = {"q": q, "u": matched, "upsert": upsert, "c": dict(spec.get("let") or {},
                                                                   new=doc)}
        if upsert:
            stmt["upsertSupplied"] = True
        return stmt
    else:
        raise MongoError(51191, f"Enumeration value '{matched}' for field 'whenMatched' is "
                                f"not a valid value.")
    return {"q": q, "u": u, "upsert": upsert}


async def run_merge(node: "RouterNode", req: Request, docs: list[dict[str, Any]],
                    spec: Any) -> None:
    """``$merge``: merge ``docs`` into the output collection (see the module text)."""
    if isinstance(spec, str):
        spec = {"into": spec}
    if not isinstance(spec, dict):
        raise MongoError(51182, "$merge only supports a string or object argument")
    db, coll = _target("$merge", spec, req.db)
    matched = spec.get("whenMatched", "merge")
    not_matched = spec.get("whenNotMatched", "insert")
    if not_matched not in ("insert", "discard", "fail"):
        raise MongoError(2, f"Enumeration value '{not_matched}' for field 'whenNotMatched' is "
                            f"not a valid value.")
    for doc in docs:
        if matched == "fail":
            if not_matched != "insert":
                raise MongoError(51189, "$merge: whenMatched: fail requires whenNotMatched: "
                                        "insert")
            await _write(node, req, "insert", db, coll, [doc])
            continue
        stmt = _merge_stmt(doc, spec)
        if stmt is None:
            continue
        stmt.pop("upsertSupplied", None)
        reply = await _write(node, req, "update", db, coll, [stmt])
        if not_matched == "fail" and not reply.get("n"):
            raise MongoError(13113, "$merge could not find a matching document in the target "
                                    "collection for at least one document in the source "
                                    "collection")


async def aggregate_with_write(node: "RouterNode", req: Request, read: Reader
                               ) -> dict[str, Any]:
    """An aggregate whose last stage is ``$out``/``$merge``: ``read`` runs the rest of the
    pipeline (a copy of ``req`` without the write stage), the results are written, and the
    reply is an empty cursor on the aggregate's namespace."""
    pipeline = list(req.get("pipeline") or [])
    stage = write_stage(pipeline)
    assert stage is not None
    name, spec = stage
    level = (req.get("readConcern") or {}).get("level")
    if level == "linearizable":  # DocumentSourceOut/Merge constraints
        raise MongoError(72, f"{name} cannot be used with a 'linearizable' read concern level")
    body = dict(req.body)
    body["pipeline"] = pipeline[:-1]
    body.pop("writeConcern", None)
    docs = await read(Request(req.name, req.db, body, req.conn))
    if name == "$out":
        await run_out(node, req, docs, spec)
    else:
        await run_merge(node, req, docs, spec)
    ns = f"{req.db}.{req.arg}" if isinstance(req.arg, str) else f"{req.db}.$cmd.aggregate"
    return await node.cursor_reply(ns, [], req, None)
