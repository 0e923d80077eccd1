"""Document effects of CRUD oplog operations on a member (an entry's or an ``applyOps``
operation's ``i``/``u``/``d``), as ``applyOperation_inlock`` (``src/mongo/db/repl/oplog.cpp``)
applies them in steady-state replication: the collection is found by ``ui`` and never created
implicitly; an update or delete of a missing document is an error, not a no-op."""

from __future__ import annotations

import weakref
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from shardsim.core.errors import MongoError
from shardsim.core.values import id_key
from shardsim.shard.change_stream.add_post_image import apply_diff

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.shard.node import ShardNode
    from shardsim.shard.storage import Collection


#: True while :func:`shard.replication.applier.apply_entries` runs with ``idempotent=True``
#: (the catch-up to ``minValid`` after a rollback): operations whose effect is already there
#: are tolerated, as the server's ``OplogApplication::Mode::kRecovering`` tolerates them.
IDEMPOTENT: ContextVar[bool] = ContextVar("shardsim_repl_idempotent", default=False)


def short(entry: Any) -> str:
    """``repr(entry)`` cut to 300 characters (error messages)."""
    text = repr(entry)
    return text if len(text) <= 300 else text[:300] + "..."


def collection_of(node: "ShardNode", entry: dict[str, Any]) -> "Collection | None":
    """The collection a CRUD entry (or applyOps operation) names by ``ui``; None for the
    unreplicated ``local`` database (and, idempotent, for a missing collection).
    NamespaceNotFound (26) when it does not exist (the server's "Failed to apply operation due
    to missing collection", ``oplog.cpp``)."""
    ui = entry.get("ui")
    ns = entry.get("ns") or ""
    if ns.startswith("local."):
        return None
    coll = node.storage.by_uuid.get(bytes(ui)) if ui is not None else None
    if coll is None and ui is None:
        db, _, name = ns.partition(".")
        coll = node.storage.get(db, name)
    if coll is None:
        if IDEMPOTENT.get():
            return None  # dropped later on the source: its drop follows
        raise MongoError(26, f"Failed to apply operation due to missing collection "
                             f"({ui.hex() if ui is not None else ns}): {short(entry)}")
    return coll


def updated_document(old: dict[str, Any], o: dict[str, Any]) -> dict[str, Any]:
    """The document after an update entry's ``o``: the ``$v: 2`` diff applied to ``old``, or
    the replacement (which keeps ``old``'s ``_id`` when it has none)."""
    if o.get("$v") == 2 and isinstance(o.get("diff"), dict):
        return apply_diff(old, o["diff"])
    if "_id" not in o:
        return {"_id": old["_id"], **o}
    return o


def document_key_of(coll: "Collection", doc_key: dict[str, Any]) -> Any:
    """The storage key of the document ``doc_key`` (``o2`` of an update, ``o`` of a delete)
    names; for a time-series collection (where ``_id`` may repeat) the first document with that
    ``_id`` and the other fields of ``doc_key``; None when there is none."""
    if "timeseries" not in coll.options:
        key = id_key(doc_key.get("_id"))
        return key if key in coll.docs else None
    for key, doc in coll.docs.items():
        if all(doc.get(f) == v for f, v in doc_key.items()):
            return key
    return None


def apply_crud(node: "ShardNode", coll: "Collection", op: str, o: dict[str, Any],
               o2: dict[str, Any] | None, entry: dict[str, Any]) -> dict[str, Any] | None:
    """Apply one CRUD operation to ``coll`` (journaled for the durable store, recorded for the
    snapshot history); returns the document before (None for an insert)."""
    storage = node.storage
    idempotent = IDEMPOTENT.get()
    if op == "i":
        key = document_key_of(coll, o) if idempotent else None
        if key is not None:  # already there (refetched): the insert becomes an upsert
            write_document(node, coll, key, o)
            return None
        key = write_document(node, coll, None, o)
        return None
    if op == "u":
        key = document_key_of(coll, o2 or {})
        if key is None:
            if idempotent:
                if not (o.get("$v") == 2 and isinstance(o.get("diff"), dict)):
                    doc = updated_document({"_id": (o2 or {}).get("_id")}, o)
                    write_document(node, coll, None, doc)  # a replacement upserts
                return None  # a diff of a document deleted later: nothing to do
            raise MongoError(218, f"Failed to apply update due to missing document: "
                                  f"{short(entry)}")
        old = coll.docs[key]
        new = updated_document(old, o)
        write_document(node, coll, key, new)
        return old
    key = document_key_of(coll, o)
    if key is None:
        if idempotent:
            return None
        raise MongoError(47, f"Failed to apply delete due to missing document: {short(entry)}")
    old = coll.delete(key)
    storage.note_doc(coll, key, None)
    return old


def write_document(node: "ShardNode", coll: "Collection", key: Any, doc: dict[str, Any]) -> Any:
    """Insert (``key`` None) or replace ``doc``, journaled; returns its storage key. In
    idempotent application a unique secondary index does not refuse it (the refetched
    documents are newer than the entries replayed over them, so a key may be held twice for a
    while): the server relaxes index constraints there too (``isEnforcingConstraints``). The
    index's key map is rebuilt at the end of each such batch until no key is held twice
    (:func:`settle_unique_indexes`)."""
    try:
        key = coll.insert(doc) if key is None else (coll.replace(key, doc), key)[1]
    except MongoError as exc:
        if exc.code != 11000 or not IDEMPOTENT.get() or "_id_" in exc.errmsg.split(" dup key")[0]:
            raise
        key = id_key(doc["_id"]) if key is None else key
        old = coll.docs.get(key)
        if coll.recorder is not None:
            coll.recorder.record(coll, key, old)
        if old is not None:
            coll._unindex(key, old)
        coll.docs[key] = doc
        _UNSETTLED.setdefault(node, set()).add(coll.uuid)
        settle_unique_indexes(node, [coll.uuid])
    node.storage.note_doc(coll, key, doc)
    return key


def add_index_relaxed(node: "ShardNode", coll: "Collection", spec: dict[str, Any]) -> None:
    """``coll.add_index(spec)``; a unique index whose keys the documents hold twice (a
    rollback's fix-up: local documents not yet refetched, or not yet caught up) is added all
    the same, its key map settled later (:func:`settle_unique_indexes`)."""
    try:
        coll.add_index(spec)
    except MongoError as exc:
        if exc.code != 11000:
            raise
        from shardsim.shard.index_keys import IndexedDocs
        from shardsim.shard.storage import Index
        idx = Index(spec)
        if idx.sorted is not None and isinstance(coll.docs, IndexedDocs):
            coll.docs.build(idx.sorted)
        coll.indexes[idx.name] = idx
        _UNSETTLED.setdefault(node, set()).add(coll.uuid)
        settle_unique_indexes(node, [coll.uuid])


def settle_unique_indexes(node: "ShardNode", uuids: Any = None) -> None:
    """Rebuild the unique key maps of the collections that met a duplicate key in idempotent
    application (``uuids``: those, default every one pending); a collection stays pending
    while one of its keys is still held by two documents."""
    pending = _UNSETTLED.get(node)
    if not pending:
        return
    for uuid in list(pending if uuids is None else uuids):
        coll = node.storage.by_uuid.get(uuid)
        clean = True
        if coll is not None:
            for idx in coll.indexes.values():
                if idx.unique and idx.name != "_id_":
                    idx.entries.clear()
                    for k, d in coll.docs.items():
                        for hk, _ in idx.keys_of(d):
                            clean &= idx.entries.setdefault(hk, k) == k
        if clean and uuids is None:
            pending.discard(uuid)


#: node -> UUIDs of collections whose unique indexes hold a key twice (idempotent application)
_UNSETTLED: "weakref.WeakKeyDictionary[Any, set[bytes]]" = weakref.WeakKeyDictionary()
