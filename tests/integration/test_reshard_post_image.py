"""``fullDocument: "updateLookup"`` of an update event read while a resharding commits (the
flake of ``test_reshard_storm``): the recipients have renamed the temporary collections over the
original (a document that changes shard under the new key is gone from the shard that wrote the
event) before the shards have the new routing table. In 8.0 every donor and recipient holds the
collection's critical section, promoted to block reads too, from before that rename until it
has the new metadata (``ReshardingDonorService::DonorStateMachine::
_dropOriginalCollectionThenTransitionToDone``, ``ReshardingRecipientService::RecipientStateMachine
::_renameTemporaryReshardingCollection``); the post-image look-up is a routed, versioned read
(``ShardServerProcessInterface::lookupSingleDocument``), so it waits for the critical section and
is retried by the new routing table: it finds the document, never ``null``.

The in-process kit holds the commit in that window (the push of the new metadata waits) while
the stream reads the events written before the resharding."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from shardsim.configsvr import migration
from shardsim.testing import ShardedCluster

pytestmark = pytest.mark.timeout(60)


def test_update_lookup_during_reshard_commit(monkeypatch: Any) -> None:
    armed, renamed, read = threading.Event(), threading.Event(), threading.Event()
    original = migration.push_metadata

    async def held_push(node: Any, ns: str, shards: Any = None) -> None:
        if ns == "rl.c" and armed.is_set() and not renamed.is_set():
            renamed.set()  # the renames are done; the shards still route by the old table
            for _ in range(60):  # until the stream has read the events (at most 3 s)
                if read.is_set():
                    break
                await asyncio.sleep(0.05)
        await original(node, ns, shards)

    monkeypatch.setattr(migration, "push_metadata", held_push)
    with ShardedCluster(shards=2) as c:
        client = c.client()
        try:
            admin = client.admin
            admin.command("balancerStop")
            admin.command("enableSharding", "rl", primaryShard="shard0")
            admin.command("shardCollection", "rl.c", key={"_id": 1})
            coll = client.rl.c
            with client.start_session() as session:
                coll.insert_many([{"_id": i, "v": 0} for i in range(20)], session=session)
                start = session.operation_time
            for i in range(20):
                coll.update_one({"_id": i}, {"$set": {"v": 1}})
            errors: list[BaseException] = []

            def reshard() -> None:
                try:
                    admin.command("reshardCollection", "rl.c", key={"_id": "hashed"})
                except BaseException as exc:  # reported below
                    errors.append(exc)

            armed.set()
            t = threading.Thread(target=reshard)
            t.start()
            assert renamed.wait(30)
            # Opened (and read) only now, so that no event was looked up before the window.
            got: list[dict[str, Any]] = []
            with coll.watch(full_document="updateLookup", max_await_time_ms=100,
                            start_at_operation_time=start) as stream:
                for _ in range(200):
                    ev = stream.try_next()
                    if ev is not None and ev["operationType"] == "update":
                        got.append(ev)
                    if len(got) == 20:
                        break
            read.set()
            t.join(30)
            assert not errors, errors
            assert [e["documentKey"]["_id"] for e in got] == list(range(20))
            assert [e["fullDocument"] for e in got] == [{"_id": i, "v": 1} for i in range(20)]
            placed = {d["_id"] for d in client.rl.c.find()}
            assert placed == set(range(20))
        finally:
            client.close()
