"""The shard's storage: the collection catalog (UUIDs, options, shard keys, indexes) and documents.

Documents live in one ordered ``dict`` per collection, keyed by a hashable form of ``_id``
(:func:`id_key`); iteration order is insertion order, which is the order of a collection scan on
mongod's record store (``$natural``). Stored documents are never mutated in place: a write
replaces the dict, so cursors and oplog entries may hold references without copying.

Unique indexes (``_id_`` always, plus any ``unique: true`` index) are kept as hash maps from the
index key to the document's ``id_key``, so a duplicate is found in O(1) and reported like mongod
(DuplicateKey 11000, ``keyPattern``/``keyValue``; ``index_access_method.cpp`` builds the message).
Every ascending/descending index (unique or not, compound, multikey, sparse, partial) also has
its sorted KeyString keys (:mod:`shard.index_keys`), kept in step by the ``docs`` mapping itself
(:class:`shard.index_keys.IndexedDocs`); the planner (:mod:`shard.planner`) reads them.

Durable shards pass a ``journal`` list: every mutation appends a record that
:class:`shard.durable.DurableStore` writes in the command's SQLite transaction.
"""

from __future__ import annotations

import itertools
from collections import deque
from contextvars import ContextVar
import re
import uuid as uuid_mod
from typing import Any, Iterator

import bson
from bson import Binary

from shardsim.shard.index_keys import IndexedDocs, SortedKeys, plain_pattern
from shardsim.shard import planner as _planner
from shardsim.shard.snapshot import History
from shardsim.shard.collection_kinds import check_measurement, id_index_spec, storage_key
from shardsim.core.errors import MongoError
from shardsim.shard.write_conflicts import check_held
from shardsim.core.values import format_value, get_path, id_key

ID_INDEX = {"v": 2, "key": {"_id": 1}, "name": "_id_"}

#: what :func:`shardsim.core.query.select` reads through (importing the planner installs it)
INDEX_PLANNER = _planner.planned_select

#: the transaction whose statement is running (set by ``ShardNode._run_command``): its
#: uncommitted collections (:mod:`shard.uncommitted_catalog`) are visible to it alone, as
#: ``CollectionCatalog::lookupCollectionByNamespace`` consults the operation's
#: ``UncommittedCatalogUpdates`` (``uncommitted_catalog_updates.cpp``)
CURRENT_TXN: ContextVar[Any] = ContextVar("shardsim_current_txn", default=None)

#: the write scope of the command running (set by ``ShardNode._run_command``): a
#: :class:`Journal` append marks it, so a failed durable commit knows which in-flight commands
#: lost writes (:meth:`shard.node.ShardNode.flush`)
WRITE_SCOPE: ContextVar[Any] = ContextVar("shardsim_write_scope", default=None)


class WriteScope:
    """What one command journaled: ``wrote`` (records not yet committed) and ``lost`` (the
    MongoError of a failed commit that took them back, else None)."""

    __slots__ = ("wrote", "lost")

    def __init__(self) -> None:
        self.wrote = False
        self.lost: Any = None


class Journal(list):
    """A durable shard's pending records (:attr:`Storage.journal`); ``append`` also marks the
    running command's :data:`WRITE_SCOPE`."""

    def append(self, rec: Any) -> None:
        scope = WRITE_SCOPE.get()
        if scope is not None:
            scope.wrote = True
        list.append(self, rec)


# The per-database view catalog collection (NamespaceString::kSystemDotViewsCollectionName).
VIEWS_COLL = "system.views"

# Namespaces a client cannot write (mongod: "cannot write to '<ns>'" InvalidNamespace).
_BAD_COLL_CHARS = re.compile(r"[\x00$]")


def new_uuid() -> bytes:
    """A random collection UUID (16 bytes)."""
    return uuid_mod.uuid4().bytes


def validate_collection_name(db: str, coll: str) -> None:
    """InvalidNamespace (73) for names mongod rejects."""
    if not isinstance(coll, str) or not coll:
        raise MongoError(73, f"Invalid namespace specified '{db}.'")
    if _BAD_COLL_CHARS.search(coll) and not coll.startswith("system.") and not db == "local":
        raise MongoError(73, f"Invalid collection name: {coll}")


def validate_db_name(db: str) -> None:
    """InvalidNamespace (73) for database names mongod rejects."""
    if not db or any(c in db for c in '/\\. "$\x00') or len(db) >= 64:
        raise MongoError(73, f"Invalid database name: '{db}'")


class Index:
    """One index's catalog entry (``spec`` as listIndexes shows it) and, if unique, its map."""

    __slots__ = ("spec", "name", "fields", "unique", "sparse", "partial", "entries", "sorted")

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.name: str = spec["name"]
        self.fields: list[str] = list(spec["key"].keys())
        # prepareUnique (collMod): new duplicate keys are refused like a unique index's
        self.unique: bool = bool(spec.get("unique") or spec.get("prepareUnique")) \
            or self.name == "_id_"
        self.sparse: bool = bool(spec.get("sparse"))
        self.partial: dict[str, Any] | None = spec.get("partialFilterExpression")
        self.entries: dict[Any, Any] = {}
        # the sorted keys (shard.index_keys) of a plain index other than _id_ (the docs map
        # is the _id index); None for hashed/text/geo/wildcard ones
        pattern = plain_pattern(spec["key"]) if spec.get("name") != "_id_" else None
        self.sorted: SortedKeys | None = SortedKeys(pattern, self.sparse, self.partial) \
            if pattern is not None else None

    def keys_of(self, doc: dict[str, Any]) -> list[tuple[Any, dict[str, Any]]]:
        """``[(hash key, keyValue doc)]`` for ``doc``: one per array element for a multikey
        index (arrays are unwound like mongod's index keys), ``[]`` when the index skips it
        (sparse without the fields, or outside the partialFilterExpression)."""
        per_field: list[list[Any]] = []
        any_found = False
        for f in self.fields:
            found, v = get_path(doc, f)
            any_found |= found
            if not found:
                per_field.append([None])
            elif isinstance(v, list):
                per_field.append(_unique_values(v) if v else [None])
            else:
                per_field.append([v])
        if self.sparse and not any_found:
            return []
        if self.partial is not None:
            from shardsim.core.query import matches
            if not matches(self.partial, doc):
                return []
        out = []
        for combo in itertools.product(*per_field):
            out.append((tuple(id_key(v) for v in combo), dict(zip(self.fields, combo))))
        return out


def _unique_values(values: list[Any]) -> list[Any]:
    seen: set[Any] = set()
    out = []
    for v in values:
        k = id_key(v)
        if k not in seen:
            seen.add(k)
            out.append(v)
    return out


class Collection:
    """One collection: identity (``db``, ``name``, ``uuid`` 16 bytes), ``options`` (as given to
    create, shown by listCollections), ``shard_key`` (dict or None), indexes and documents."""

    def __init__(self, db: str, name: str, uuid: bytes, options: dict[str, Any] | None = None,
                 shard_key: dict[str, Any] | None = None) -> None:
        self.db = db
        self.name = name
        self.uuid = bytes(uuid)
        self._ui = Binary(self.uuid, 4)
        self.options: dict[str, Any] = dict(options or {})
        self.shard_key = shard_key
        self.indexes: dict[str, Index] = {}
        self.docs: dict[Any, dict[str, Any]] = IndexedDocs(self.indexes)
        self.ts_seq = 0  # time series: storage keys of measurements (collection_kinds)
        # snapshot reads (shard.snapshot): the Storage's History, and this collection's
        # stamped undo log [(ts, key, document before)] with the ts of the oldest dropped entry
        self.recorder: Any = None
        self.history: deque[tuple[Any, Any, dict[str, Any] | None]] = deque()
        self.history_floor: Any = None
        # capped collections (shard.capped): each document's RecordId (insertion sequence) and
        # BSON size, and their total, kept by insert/replace/delete
        self.capped = bool(self.options.get("capped"))
        self.record_ids: dict[Any, int] = {}
        self.record_sizes: dict[Any, int] = {}
        self.capped_bytes = 0
        self.next_record_id = 1
        id_spec = id_index_spec(self.options)
        if id_spec is not None:
            idx = Index(id_spec)
            idx.name = "_id_"  # a clustered index named otherwise still is the _id index
            idx.unique = True
            idx.sorted = None
            self.indexes["_id_"] = idx
        # id_key -> the prepared, undecided transaction holding the document
        # (shard.sessions.Transaction.lock): other writers wait for it (shard.write_conflicts),
        # or get WriteConflict (112) inside transactions.
        self.prepared: dict[Any, Any] = {}
        # id_key -> the in-progress transaction that wrote the document (shard.sessions.TxnView):
        # another transaction writing it gets WriteConflict (112) at once, as WiredTiger's; a
        # write outside transactions waits until it ends (shard.write_conflicts).
        self.txn_writers: dict[Any, Any] = {}

    @property
    def ns(self) -> str:
        return f"{self.db}.{self.name}"

    @property
    def ui(self) -> Binary:
        """The UUID as BSON Binary subtype 4 (oplog ``ui``, listCollections ``info.uuid``)."""
        return self._ui

    @property
    def pre_post_images(self) -> bool:
        """True when ``changeStreamPreAndPostImages: {enabled: true}``."""
        opt = self.options.get("changeStreamPreAndPostImages")
        return isinstance(opt, dict) and bool(opt.get("enabled"))

    def document_key(self, doc: dict[str, Any]) -> dict[str, Any]:
        """``documentKey``/``o2``: shard key fields then ``_id`` (just ``{_id}`` if unsharded)."""
        if not self.shard_key:
            return {"_id": doc.get("_id")}
        out: dict[str, Any] = {}
        for f in self.shard_key:
            found, v = get_path(doc, f)
            if found:
                out[f] = v
        if "_id" not in out:
            out["_id"] = doc.get("_id")
        return out

    # -- index maintenance --------------------------------------------------------------------
    def _dup_error(self, idx: Index, key_value: dict[str, Any]) -> MongoError:
        pattern = idx.spec["key"]
        msg = (f"E11000 duplicate key error collection: {self.ns} index: {idx.name} dup key: "
               f"{format_value(key_value)}")
        return MongoError(11000, msg, keyPattern=dict(pattern), keyValue=dict(key_value))

    def check_unique(self, doc: dict[str, Any], own_key: Any = None) -> list[tuple[Index, Any]]:
        """Raise DuplicateKey (11000) if ``doc`` clashes on a unique index (``own_key`` = the
        document's own id_key when replacing it). Returns ``(index, hash key)`` to register."""
        out = []
        for idx in self.indexes.values():
            if not idx.unique:
                continue
            if idx.name == "_id_":
                k = id_key(doc["_id"])
                other = self.docs.get(k)
                if other is not None and k != own_key:
                    raise self._dup_error(idx, {"_id": doc["_id"]})
                continue
            for hk, kv in idx.keys_of(doc):
                holder = idx.entries.get(hk)
                if holder is not None and holder != own_key:
                    raise self._dup_error(idx, kv)
                out.append((idx, hk))
        return out

    def _unindex(self, key: Any, doc: dict[str, Any]) -> None:
        for idx in self.indexes.values():
            if idx.unique and idx.name != "_id_":
                for hk, _ in idx.keys_of(doc):
                    if idx.entries.get(hk) == key:
                        del idx.entries[hk]

    # -- document mutations (callers log oplog entries) ----------------------------------------
    def insert(self, doc: dict[str, Any]) -> Any:
        """Insert (``_id`` must be set); DuplicateKey (11000) on a clash. Returns the id_key."""
        check_measurement(self.options, doc)
        regs = self.check_unique(doc)
        k = storage_key(self, doc)
        if self.prepared or self.txn_writers:
            check_held(self, k)  # another transaction holds it: WriteConflictWait
        if self.recorder is not None:
            self.recorder.record(self, k, None)
        self.docs[k] = doc
        for idx, hk in regs:
            idx.entries[hk] = k
        if self.capped:
            self.record_ids[k] = self.next_record_id
            self.next_record_id += 1
            size = len(bson.encode(doc))
            self.record_sizes[k] = size
            self.capped_bytes += size
        return k

    def replace(self, key: Any, new: dict[str, Any]) -> dict[str, Any]:
        """Replace the document at ``key`` by ``new`` (same _id); returns the old document."""
        old = self.docs[key]
        if self.prepared or self.txn_writers:
            check_held(self, key)
        regs = self.check_unique(new, own_key=key)
        if self.recorder is not None:
            self.recorder.record(self, key, old)
        self._unindex(key, old)
        self.docs[key] = new
        for idx, hk in regs:
            idx.entries[hk] = key
        if self.capped and key in self.record_sizes:
            size = len(bson.encode(new))
            self.capped_bytes += size - self.record_sizes[key]
            self.record_sizes[key] = size
        return old

    def delete(self, key: Any) -> dict[str, Any]:
        """Remove and return the document at ``key``."""
        if self.prepared or self.txn_writers:
            check_held(self, key)
        old = self.docs.pop(key)
        if self.recorder is not None:
            self.recorder.record(self, key, old)
        self._unindex(key, old)
        if self.capped:
            self.record_ids.pop(key, None)
            self.capped_bytes -= self.record_sizes.pop(key, 0)
        return old

    def add_index(self, spec: dict[str, Any]) -> None:
        """Register an index; builds a unique index's map (DuplicateKey 11000 if the data clash)."""
        idx = Index(spec)
        if idx.unique:
            for k, doc in self.docs.items():
                for hk, kv in idx.keys_of(doc):
                    if idx.entries.get(hk, k) != k:
                        raise self._dup_error(idx, kv)
                    idx.entries[hk] = k
        if idx.sorted is not None and isinstance(self.docs, IndexedDocs):
            self.docs.build(idx.sorted)
        self.indexes[idx.name] = idx

    def catalog_doc(self) -> dict[str, Any]:
        """The persisted catalog record (durable mode)."""
        return {"db": self.db, "name": self.name, "uuid": Binary(self.uuid, 4),
                "options": self.options, "shardKey": self.shard_key,
                "indexes": [i.spec for i in self.indexes.values()]}


class Storage:
    """All databases and collections of one shard: ``dbs[db][coll] -> Collection``.

    ``journal`` (a list) is set by durable shards; each mutation appends a record
    ``("doc", uuid, id_key_bytes, doc|None)`` or ``("catalog", uuid, catalog_doc|None)``.
    """

    def __init__(self) -> None:
        self.dbs: dict[str, dict[str, Collection]] = {}
        self.by_uuid: dict[bytes, Collection] = {}
        self.journal: list[tuple] | None = None
        self.history = History()  # undo log for snapshot reads (shard.snapshot)

    def get(self, db: str, name: str) -> Collection | None:
        """The collection or None; inside a transaction's statement also the collections that
        transaction created and has not committed (:data:`CURRENT_TXN`)."""
        txn = CURRENT_TXN.get()
        if txn is not None and txn.created:
            coll = txn.created.get((db, name))
            if coll is not None:
                return coll
        colls = self.dbs.get(db)
        return colls.get(name) if colls else None

    def collections(self, db: str | None = None) -> Iterator[Collection]:
        if db is not None:
            yield from list(self.dbs.get(db, {}).values())
            return
        for colls in list(self.dbs.values()):
            yield from list(colls.values())

    def add(self, coll: Collection) -> Collection:
        coll.recorder = self.history
        self.dbs.setdefault(coll.db, {})[coll.name] = coll
        self.by_uuid[coll.uuid] = coll
        self.note_catalog(coll)
        return coll

    def remove(self, coll: Collection) -> None:
        colls = self.dbs.get(coll.db, {})
        colls.pop(coll.name, None)
        if not colls:
            self.dbs.pop(coll.db, None)
        self.by_uuid.pop(coll.uuid, None)
        if self.journal is not None:
            self.journal.append(("catalog", coll.uuid, None))

    def rename(self, coll: Collection, db: str, name: str) -> None:
        colls = self.dbs.get(coll.db, {})
        colls.pop(coll.name, None)
        if not colls:
            self.dbs.pop(coll.db, None)
        coll.db, coll.name = db, name
        self.dbs.setdefault(db, {})[name] = coll
        self.note_catalog(coll)

    # -- views (mongod keeps them as documents of ``<db>.system.views``; views_for_database.cpp)
    def view_def(self, db: str, name: str) -> dict[str, Any] | None:
        """The ``system.views`` document ``{_id: "db.name", viewOn, pipeline[, collation]}`` of
        view ``db.name``, or None when ``db.name`` is not a view."""
        views = self.get(db, VIEWS_COLL)
        if views is None:
            return None
        return views.docs.get(f"{db}.{name}")  # id_key of a string is the string itself

    def views(self, db: str) -> list[dict[str, Any]]:
        """All view definitions of ``db`` (``system.views`` documents, in creation order)."""
        views = self.get(db, VIEWS_COLL)
        return list(views.docs.values()) if views is not None else []

    def resolve_view(self, db: str, name: str) -> tuple[str, list[dict[str, Any]]] | None:
        """``(source collection name, full pipeline)`` for view ``db.name`` (views on views are
        unfolded innermost first, like ``ViewCatalog::resolveView``), or None if not a view.
        The source collection may not exist (a view on a missing collection reads nothing)."""
        doc = self.view_def(db, name)
        if doc is None:
            return None
        pipeline: list[dict[str, Any]] = []
        seen = {name}
        while doc is not None:
            pipeline = list(doc.get("pipeline") or []) + pipeline
            name = doc["viewOn"]
            if name in seen:  # creation refuses cycles; a hand-edited catalog must not hang us
                raise MongoError(93, f"View cycle detected: {db}.{name}")
            seen.add(name)
            doc = self.view_def(db, name)
        return name, pipeline

    def note_catalog(self, coll: Collection) -> None:
        """Record a catalog change for the durable store."""
        if self.journal is not None:
            self.journal.append(("catalog", coll.uuid, coll))

    def note_doc(self, coll: Collection, doc_id: Any, doc: dict[str, Any] | None) -> None:
        """Record a document change (``doc`` None = deleted) for the durable store."""
        if self.journal is not None:
            self.journal.append(("doc", coll.uuid, doc_id, doc))
