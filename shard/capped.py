"""Capped collections that evict, as mongod 8.0 (``src/mongo/db/catalog/capped_collection_maintenance.cpp``,
``cappedDeleteUntilBelowConfiguredMaximum``, called after every insert by
``collection_write_path.cpp``).

* After an insert, while the collection's data size (the BSON size of its documents) is above
  ``size`` or its count above ``max`` (when set and above 0), the oldest documents in insertion
  (RecordId) order are deleted, never the one just inserted. ``size`` is used as given: the
  rounding up to a multiple of 256 of older servers (``adjustCappedSize`` in
  ``collection_options.cpp``) is off from FCV 7.0 (``featureFlagCappedCollectionsRelaxedSize``).
* Each eviction on a primary is replicated: ``OpObserver::onDelete`` writes an ordinary delete
  oplog entry (with the pre-image when ``changeStreamPreAndPostImages`` is on), after the insert's
  entry, so change streams see ``delete`` events for evicted documents (mongod does this since
  FCV 5.0; secondaries apply those deletes instead of evicting on their own).
* ``local`` is not replicated: evictions there log nothing (mongod: ``nss.isReplicated()``).

A document's RecordId is kept by :class:`shardsim.shard.storage.Collection` (``record_ids``,
``record_sizes``, ``capped_bytes``); :func:`sync` rebuilds them, in document order, for a
collection whose documents were loaded without its insert (durable restart, undo).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import bson

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.shard.node import ShardNode
    from shardsim.shard.storage import Collection


def sync(coll: "Collection") -> None:
    """Make ``record_ids``/``record_sizes``/``capped_bytes`` match ``coll.docs`` (cheap when
    they already do: a length check)."""
    if len(coll.record_ids) == len(coll.docs) and len(coll.record_sizes) == len(coll.docs):
        return
    ids: dict[Any, int] = {}
    sizes: dict[Any, int] = {}
    for k, doc in coll.docs.items():
        rid = coll.record_ids.get(k)
        if rid is None:
            rid = coll.next_record_id
            coll.next_record_id += 1
        ids[k] = rid
        sizes[k] = coll.record_sizes.get(k) or len(bson.encode(doc))
    coll.record_ids, coll.record_sizes = ids, sizes
    coll.capped_bytes = sum(sizes.values())


def limits(coll: "Collection") -> tuple[int, int]:
    """``(size in bytes, max documents or 0 for none)``."""
    size = int(coll.options.get("size") or 0)
    max_docs = int(coll.options.get("max") or 0)
    return size, max_docs if max_docs > 0 else 0


def evict(node: "ShardNode", coll: "Collection", just_inserted: Any) -> int:
    """Delete the oldest documents of capped ``coll`` until it is within its limits, logging
    each as a delete; returns how many were deleted. A no-op for other collections."""
    if not getattr(coll, "capped", False) or not hasattr(coll, "record_ids"):
        return 0
    sync(coll)
    cap_size, cap_docs = limits(coll)
    over_size = coll.capped_bytes - cap_size if coll.capped_bytes > cap_size else 0
    over_docs = len(coll.docs) - cap_docs if cap_docs and len(coll.docs) > cap_docs else 0
    saved = removed = 0
    while saved < over_size or removed < over_docs:
        key = next(iter(coll.docs), None)
        if key is None or key == just_inserted:
            break
        saved += coll.record_sizes.get(key, 0)
        removed += 1
        old = coll.delete(key)
        node.storage.note_doc(coll, key, None)
        node.log_op("d", coll, coll.document_key(old), None, pre_image=old)
    return removed
