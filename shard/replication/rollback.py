"""Rollback by refetch: a member undoes its oplog entries after the common point with its sync
source, as the server's ``rs_rollback.cpp`` did before recover-to-stable-timestamp
(``syncRollback`` -> ``updateFixUpInfoFromLocalOplogEntry`` builds a ``FixUpInfo``, then
``syncFixUp`` refetches and rewrites).

:func:`undo_entries` gets the local entries after the common point, newest first, and a
``refetch`` coroutine that asks the sync source for its current version of what they touched.
The keys (:data:`Key`, ``tuple[bytes, bytes]``, hashable and wire-friendly) are:

===============================================  =============================================
``(<collection UUID, 16 bytes>, BSON {_id: v})``  the source's document ``{_id: v}`` of that
                                                  collection, or None (no document, or no
                                                  such collection)
``(SESSIONS, <session key>)``                     the source's session record for the lsid
                                                  (:func:`shard.sessions.session_key`), as
                                                  :meth:`shard.sessions.Session.record` gives
                                                  it, or None (``config.transactions`` has no
                                                  document for it)
``(CATALOG, <collection UUID>)``                  ``{db, name, uuid, options, shardKey,
                                                  indexes}`` (:meth:`shard.storage.Collection.
                                                  catalog_doc`), or None
``(DOCUMENTS, <collection UUID>)``                ``{documents: [...]}`` (the whole
                                                  collection in ``$natural`` order), asked only
                                                  for a collection dropped after the common
                                                  point, or None
``(MIN_VALID, b"")``                              ``{ts}``: the source's newest oplog entry
                                                  when it answered (always asked)
===============================================  =============================================

The refetched documents are the source's *current* versions, newer than the common point: the
member must then apply the source's entries after the common point up to
:attr:`RollbackResult.min_valid` with ``apply_entries(..., idempotent=True)`` (the server's
``minValid`` and recovering-mode application), after which it is consistent and applies in
steady state again.

:func:`answer_refetch` is the source's side (the member wiring maps it onto a command or a
``find``).

The fix-up, all in one synchronous step once the answers are in (nothing else runs between, so
no reader sees a half-undone member): the oplog is truncated after the common point
(``Oplog.discard_after``; on a durable member also the disk rows, ``("discard_after", key)``
in the same SQLite transaction as the rest) with the pre-images of the truncated entries;
local prepared transactions are unlocked (their documents refetched); collections created after the
common point are dropped (their documents go to the rollback file); renames are undone (newest
first); dropped collections (``drop``, a rename's ``dropTarget``) are restored under their
name at the common point with the source's options, indexes and documents
(``FixUpInfo::collectionsToResync``; not restored when the source no longer has them); the
options and indexes of collections whose ``createIndexes`` / ``dropIndexes`` / ``collMod``
were undone are taken from the source
(``collectionsToResyncMetadata``, ``indexesToDrop``/``indexesToCreate``); every touched document
is set to the source's version or deleted (``docsToRefetch``; with the documents of undone
commit/abort decisions, read from their prepare entry); every session record is set to the
source's (or emptied), as the server reloads session state after a rollback. Touched
collections lose their snapshot history (reads at earlier times get SnapshotTooOld 239, as
history behind a rollback is gone on the server).

Every document version the fix-up removes or overwrites is saved, as the server's
``RemoveSaver("rollback", <uuid>, "removed")`` (``remove_saver.cpp``; ``rollback_impl.cpp``
``_writeRollbackFileForNamespace``) writes it: ``<dbpath>/rollback/<collection UUID>/removed.
<YYYY-MM-DDTHH-MM-SS>.<n>.bson``, the documents' BSON concatenated (readable with
``bsondump``). Members without a dbpath keep them in :attr:`RollbackResult.files` only.

Not done here (the caller's part, docs/replication.md): killing user operations (11602), the
rollback id, the ROLLBACK state, and the catch-up to the source's ``minValid`` (documents may be
newer than the common point until the member has applied the source's entries after it).
"""

from __future__ import annotations

import datetime
import itertools
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import bson
from bson.timestamp import Timestamp

from shardsim.core.clock import ts_key
from shardsim.core.errors import MongoError
from shardsim.core.node import CODEC
from shardsim.shard.replication.documents import document_key_of
from shardsim.shard.replication import rollback_fixup
from shardsim.shard.replication.rollback_fixup import (CATALOG, DOCUMENTS, MIN_VALID, SESSIONS,
                                                       uuid_string)
from shardsim.shard.sessions import session_key

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.shard.node import ShardNode

Key = tuple[bytes, bytes]
Refetch = Callable[[list[Key]], Awaitable[dict[Key, "dict[str, Any] | None"]]]
_FILE_NUM = itertools.count()  # RemoveSaver's static NUM


@dataclass
class RollbackResult:
    """What :func:`undo_entries` did: ``common_point_ts`` (the newest entry kept; None when the
    whole oplog was undone), ``undone`` (entries removed), ``files`` (rollback file path ->
    the documents written to it on a durable member; collection UUID string -> the documents
    without a dbpath), ``min_valid`` (the source's newest ``ts`` when it answered: apply its
    entries up to there idempotently before the member is consistent)."""

    common_point_ts: Timestamp | None
    undone: int
    files: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    min_valid: Timestamp | None = None


def doc_key(uuid: bytes, _id: Any) -> Key:
    """The refetch key of document ``_id`` of collection ``uuid``."""
    return (bytes(uuid), bson.encode({"_id": _id}, codec_options=CODEC))


async def undo_entries(node: "ShardNode", undo: list[dict[str, Any]],
                       refetch: Refetch) -> RollbackResult:
    """Undo ``undo`` (the local entries after the common point, newest first) on ``node`` by
    refetching from the sync source (see the module docstring). UnrecoverableRollbackError
    (127) when ``undo`` is not the newest part of the local oplog, newest first, or when a
    collection cannot be put back (its name taken) or the oplog changed while ``refetch`` ran;
    the node is unchanged then, and also when ``refetch`` raises."""
    common = _check_tail(node, undo)
    info = rollback_fixup.FixUpInfo.from_entries(node, undo)
    latest = node.oplog.latest_key
    answers = await refetch(info.keys())
    if node.oplog.latest_key != latest:  # written while refetching: the plan is stale
        raise MongoError(127, "cannot roll back: the oplog changed while refetching from the "
                              "sync source (nothing was undone)")
    info.check_restorable(node, answers)
    files: dict[str, list[dict[str, Any]]] = {}
    node.command_depth += 1
    try:
        _truncate(node, common)
        rollback_fixup.fix_up(node, info, answers, files, common)
    finally:
        node.command_depth -= 1
    mv = answers.get((MIN_VALID, b""))
    result = RollbackResult(common, len(undo), _write_files(node, files),
                            mv.get("ts") if isinstance(mv, dict) else None)
    if node.durable is not None and node.command_depth == 0:
        node.flush()
    return result


def _check_tail(node: "ShardNode", undo: list[dict[str, Any]]) -> Timestamp | None:
    """The common point: the entry before ``undo``'s oldest (127 when ``undo`` is not the tail
    of the oplog, newest first)."""
    newest = node.oplog.entries_reversed()
    for i, entry in enumerate(undo):
        local = next(newest, None)
        ts = entry.get("ts") if isinstance(entry, dict) else None
        if local is None or not isinstance(ts, Timestamp) or local["ts"] != ts:
            raise MongoError(127, f"cannot roll back: entry {i} to undo ({ts}) is not the "
                                  f"local oplog's entry {local['ts'] if local else None} "
                                  f"(the entries after the common point, newest first)")
    before = next(newest, None)
    return before["ts"] if before is not None else None


def _truncate(node: "ShardNode", common: Timestamp | None) -> None:
    key = ts_key(common) if common is not None else 0
    node.oplog.discard_after(key)
    node.pre_images.discard_from(key + 1)
    if node.storage.journal is not None:
        node.storage.journal.append(("discard_after", key))


def _write_files(node: "ShardNode", saved: dict[str, list[dict[str, Any]]]
                 ) -> dict[str, list[dict[str, Any]]]:
    """The rollback files: written under ``<dbpath>/rollback/`` on a durable member (keys
    become the paths), kept as they are (keys the collection UUIDs) otherwise."""
    dbpath = node.options.get("dbpath")
    if not dbpath:
        return saved
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H-%M-%S")
    out: dict[str, list[dict[str, Any]]] = {}
    for uuid_str, docs in saved.items():
        folder = os.path.join(dbpath, "rollback", uuid_str)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"removed.{stamp}.{next(_FILE_NUM)}.bson")
        with open(path, "wb") as f:
            for doc in docs:
                f.write(bson.encode(doc, codec_options=CODEC))
        out[path] = docs
    return out


def answer_refetch(node: "ShardNode", keys: list[Key]) -> dict[Key, dict[str, Any] | None]:
    """The sync source's side of a refetch: its current version of every key (see the module
    docstring for the keys and the answers)."""
    storage = node.storage
    out: dict[Key, dict[str, Any] | None] = {}
    for key in keys:
        kind, arg = key
        if kind == MIN_VALID:
            out[key] = {"ts": node.oplog.last_ts()}
        elif kind == SESSIONS:
            s = node.sessions._sessions.get(arg)
            out[key] = s.record() if s is not None and s.txn_number >= 0 else None
        elif kind == CATALOG:
            coll = storage.by_uuid.get(arg)
            out[key] = coll.catalog_doc() if coll is not None else None
        elif kind == DOCUMENTS:
            coll = storage.by_uuid.get(arg)
            out[key] = {"documents": list(coll.docs.values())} if coll is not None else None
        else:
            coll = storage.by_uuid.get(kind)
            _id = bson.decode(arg, CODEC)["_id"]
            k = document_key_of(coll, {"_id": _id}) if coll is not None else None
            out[key] = coll.docs.get(k) if k is not None else None
    return out


__all__ = ["undo_entries", "RollbackResult", "answer_refetch", "doc_key", "session_key",
           "SESSIONS", "CATALOG", "DOCUMENTS", "MIN_VALID", "uuid_string"]
