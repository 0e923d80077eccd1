"""Router stage: new shards seen on the config server's ``config.shards`` stream
(``$_internalChangeStreamHandleTopologyChange``,
``document_source_change_stream_handle_topology_change.cpp``, notes §4.2).

On mongos it sits right above ``$mergeCursors``: every event of the ``config.shards`` monitor
cursor is swallowed, and an insert (``addShard``) of a shard that has no cursor yet opens one on
it, from ``resumeAfter: HWM(event clusterTime + 1 tick)``
(``createUpdatedCommandForNewShard``), before anything later is released. Legacy
new-shard events from shards are swallowed too (4.4+ no longer relies on them, SERVER-44039):
``kNewShardDetected`` from 6.0 shards, ``migrateChunkToNewShard`` from 7.0+ ones
(``isShardConfigEvent`` compares with ``kNewShardDetectedOpType``; shardsim's router swallows
both names, whatever its profile, see ``server_version.NEW_SHARD_OPS``). Here the stage only decides; the cursor
(:meth:`router.change_stream.cursor.RouterChangeStream.open_new_shard`) opens the cursor and
adds the remote to the merger.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from shardsim.core.resume_token import hwm_token, token_ts_key
from shardsim.router.change_stream.raw_events import Item


@dataclass(slots=True)
class NewShard:
    """Output of the merge when a shard was added: open a cursor on ``shard`` with
    ``resumeAfter: start_token`` (HWM of the addShard event's clusterTime + 1 tick, a
    ``{_data}`` dict) and add it with :meth:`Merger.add_remote` before asking for the next
    event. ``host`` — the added shard's connection string from the event, if any."""

    shard: str
    start_token: dict[str, str]
    host: str | None = None


class HandleTopologyChange:
    """The stage's state: the shards that have a cursor (``known_shards``, a set of names).

    The merge calls :meth:`process` only for the events this stage swallows (every event of
    the config cursor, and shards' ``kNewShardDetected``), never for the other shard events, so
    it costs nothing per event.
    """

    __slots__ = ("known_shards",)

    def __init__(self, known_shards: Iterable[str] = ()) -> None:
        self.known_shards = set(known_shards)

    def process(self, item: Item, from_config: bool) -> NewShard | None:
        """The action for a swallowed event (``from_config``: it came from the config cursor,
        else it is a shard's ``kNewShardDetected``, swallowed with no action):
        :class:`NewShard` for a ``config.shards`` insert of a shard not known yet (it is then
        known), else None. ``item.meta`` carries ``is_shard_insert``, ``shard``, ``host`` and
        ``cluster_time`` (a Timestamp key) for config events
        (:func:`router.change_stream.raw_events.item_from_raw_event`); without ``cluster_time``
        the event's token gives the time. Never raises."""
        if not from_config:
            return None
        meta: dict[str, Any] = item.meta
        shard = meta.get("shard")
        if meta.get("is_shard_insert") and shard and shard not in self.known_shards:
            ct = meta.get("cluster_time")
            if ct is None:
                ct = token_ts_key(item.key[0]) or 0
            self.known_shards.add(shard)
            return NewShard(shard, hwm_token(ct + 1), meta.get("host"))
        return None
