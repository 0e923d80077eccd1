"""Stage 9: ``fullDocument`` for update events (``$_internalChangeStreamAddPostImage``,
``document_source_change_stream_add_post_image.cpp``).

``updateLookup`` reads the document's current version by ``documentKey`` (null if it is gone),
on the shard that owns its chunk now (:class:`RemoteLookup` when that is another shard).
``whenAvailable``/``required`` compute the point-in-time post-image: the pre-image with the
event's ``$v: 2`` diff applied (``doc_diff_applier.cpp`` semantics); without a pre-image
``whenAvailable`` gives null and ``required`` fails with NoMatchingDocument (47).
"""

from __future__ import annotations

from typing import Any

from shardsim.core.errors import MongoError
from shardsim.shard.change_stream.add_pre_image import event_repr, fetch_pre_image
from shardsim.shard.change_stream.transform import Event


def apply_diff(doc: dict[str, Any], diff: dict[str, Any]) -> dict[str, Any]:
    """A new document: ``doc`` with the object diff applied (``d``/``u``/``i``/``s<field>``)."""
    out = dict(doc)
    deletes = diff.get("d") or {}
    for name in deletes:
        out.pop(name, None)
    for name, value in (diff.get("u") or {}).items():
        out[name] = value
    for name, value in (diff.get("i") or {}).items():
        out.pop(name, None)
        out[name] = value
    for key, sub in diff.items():
        if len(key) > 1 and key[0] == "s" and isinstance(sub, dict):
            name = key[1:]
            cur = out.get(name)
            if sub.get("a") is True:
                out[name] = apply_array_diff(cur if isinstance(cur, list) else [], sub)
            else:
                out[name] = apply_diff(cur if isinstance(cur, dict) else {}, sub)
    return out


def apply_array_diff(arr: list[Any], diff: dict[str, Any]) -> list[Any]:
    """A new array: ``l`` new length, ``u<i>`` set, ``s<i>`` sub-diff."""
    out = list(arr)
    if "l" in diff:
        n = int(diff["l"])
        out = out[:n] + [None] * max(0, n - len(out))
    for key, value in diff.items():
        if len(key) < 2 or not key[1:].isdigit():
            continue
        idx = int(key[1:])
        if idx >= len(out):
            out.extend([None] * (idx + 1 - len(out)))
        if key[0] == "u":
            out[idx] = value
        elif key[0] == "s" and isinstance(value, dict):
            cur = out[idx]
            if value.get("a") is True:
                out[idx] = apply_array_diff(cur if isinstance(cur, list) else [], value)
            else:
                out[idx] = apply_diff(cur if isinstance(cur, dict) else {}, value)
    return out


class RemoteLookup(Exception):
    """Raised by :class:`AddPostImage` for an ``updateLookup`` whose document belongs to a
    chunk another shard owns now (``owner``), or that must wait because this shard's critical
    section of the namespace blocks reads (a resharding's commit: the routing table is about to
    change): the cursor looks it up asynchronously (``ShardingRuntime.lookup_remote``), as
    ``ShardServerProcessInterface::lookupSingleDocument`` runs a routed, versioned read by
    documentKey that waits out a critical section and is retried by the refreshed routing
    table, then runs the stages after this one (:meth:`shard.change_stream.cursor.ShardCursor`)."""

    def __init__(self, event: Event, owner: str | None) -> None:
        super().__init__(owner)
        self.event = event
        self.owner = owner


class AddPostImage:
    """The ``$_internalChangeStreamAddPostImage`` stage, in a stream whose ``fullDocument`` is
    ``mode`` (``updateLookup`` | ``whenAvailable`` | ``required``; the pipeline has no such
    stage for ``default``). ``node`` gives ``find_document(ns, documentKey)`` and
    ``pre_images``.

    ``process(ev)`` fills ``fullDocument`` of an update event and returns ``ev``; other events
    pass unchanged. Raises NoMatchingDocument (47) when ``mode`` is ``required`` and the
    post-image cannot be computed.
    """

    name = "$_internalChangeStreamAddPostImage"
    __slots__ = ("node", "mode")

    def __init__(self, node: Any, mode: str) -> None:
        self.node = node
        self.mode = mode

    def process(self, ev: Event) -> Event:
        """``ev``, with ``fullDocument`` for an update."""
        if ev.doc.get("operationType") != "update":
            return ev
        mode = self.mode
        if mode == "updateLookup":
            key = ev.doc.get("documentKey") or {}
            sharding = self.node.sharding
            owner = sharding.owner_of(ev.ns, key) if sharding is not None else None
            if owner is not None and owner != self.node.shard_name:
                raise RemoteLookup(ev, owner)  # the chunk lives elsewhere now
            if sharding is not None and sharding.reads_blocked(ev.ns):
                raise RemoteLookup(ev, owner)  # waits for the critical section, then routes
            post = self.node.find_document(ev.ns, key)
        else:
            pre = fetch_pre_image(self.node, ev)
            post = None
            if pre is not None and isinstance(ev.raw_update, dict):
                post = apply_diff(pre, ev.raw_update.get("diff") or {})
            if post is None and mode == "required":
                raise MongoError(47, "Change stream was configured to require a post-image for "
                                     "all update events, but the post-image was not found for "
                                     "event: " + event_repr(ev.doc))
        ev.doc["fullDocument"] = post
        return ev
