"""Stage 8: ``fullDocumentBeforeChange`` (``$_internalChangeStreamAddPreImage``,
``document_source_change_stream_add_pre_image.cpp``).

For update, replace and delete events the pre-image recorded by the shard (collections with
``changeStreamPreAndPostImages: {enabled: true}``) is looked up by
``{nsUUID, ts (applyOps entry ts in a transaction), applyOpsIndex}``. ``whenAvailable`` gives
``null`` when there is none; ``required`` fails with NoMatchingDocument (47). The field is
appended at the end of the event, as the server's stage does.
"""

from __future__ import annotations

from typing import Any

from shardsim.core.errors import MongoError
from shardsim.shard.change_stream.transform import Event


def event_repr(doc: dict[str, Any]) -> str:
    """A short rendering of an event for error messages."""
    return "{" + ", ".join(f"{k}: {v!r}" for k, v in doc.items()
                           if k in ("_id", "operationType", "clusterTime", "ns", "documentKey")) + "}"


def fetch_pre_image(node: Any, ev: Event) -> dict[str, Any] | None:
    """The stored pre-image for ``ev`` or None."""
    if ev.pre_image_id is None:
        return None
    uuid, ts, index = ev.pre_image_id
    return node.pre_images.get(uuid, ts, index)


class AddPreImage:
    """The ``$_internalChangeStreamAddPreImage`` stage, in a stream whose
    ``fullDocumentBeforeChange`` is ``mode`` (``whenAvailable`` | ``required``; the pipeline
    has no such stage for ``off``). ``node`` gives ``pre_images`` (:class:`shard.oplog.PreImages`).

    ``process(ev)`` sets ``fullDocumentBeforeChange`` (the stored pre-image, or null) on update,
    replace and delete events and returns ``ev``; other events pass unchanged. Raises
    NoMatchingDocument (47) when ``mode`` is ``required`` and there is no pre-image.
    """

    name = "$_internalChangeStreamAddPreImage"
    __slots__ = ("node", "mode")

    def __init__(self, node: Any, mode: str) -> None:
        self.node = node
        self.mode = mode

    def process(self, ev: Event) -> Event:
        """``ev``, with ``fullDocumentBeforeChange`` for update/replace/delete."""
        if ev.doc.get("operationType") not in _PRE_IMAGE_OPS:
            return ev
        pre = fetch_pre_image(self.node, ev)
        if pre is None and self.mode == "required":
            raise MongoError(47, "Change stream was configured to require a pre-image for all "
                                 "update, delete and replace events, but the pre-image was not "
                                 "found for event: " + event_repr(ev.doc))
        ev.doc["fullDocumentBeforeChange"] = pre
        return ev


_PRE_IMAGE_OPS = ("update", "replace", "delete")
