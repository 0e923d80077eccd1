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

from shardsim.errors import MongoError
from shard.change_stream.transform import Event


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


def add_pre_image(node: Any, mode: str, ev: Event) -> None:
    """Set ``fullDocumentBeforeChange`` on ``ev`` per ``mode`` (whenAvailable | required)."""
    if ev.doc.get("operationType") not in ("update", "replace", "delete"):
        return
    pre = fetch_pre_image(node, ev)
    if pre is None and mode == "required":
        raise MongoError(47, "Change stream was configured to require a pre-image for all update, "
                             "delete and replace events, but the pre-image was not found for event: "
                             + event_repr(ev.doc))
    ev.doc["fullDocumentBeforeChange"] = pre
