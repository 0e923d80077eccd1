"""INTERIM applier (replaced by the repl-apply branch): appends fetched entries and applies
plain CRUD and create/drop."""

from __future__ import annotations

from typing import Any

from shardsim.shard.storage import Collection


def _apply_diff(doc: dict, diff: dict) -> None:
    for key, sub in diff.items():
        if key == "d":
            for f in sub:
                doc.pop(f, None)
        elif key in ("u", "i"):
            doc.update(sub)
        elif key.startswith("s"):
            f = key[1:]
            if isinstance(doc.get(f), list) and isinstance(sub, dict) and sub.get("a"):
                arr = doc[f]
                if "l" in sub:
                    del arr[sub["l"]:]
                for k, v in sub.items():
                    if k.startswith("u"):
                        i = int(k[1:])
                        while len(arr) <= i:
                            arr.append(None)
                        arr[i] = v
                    elif k.startswith("s"):
                        _apply_diff(arr[int(k[1:])], v)
            elif isinstance(doc.get(f), dict):
                _apply_diff(doc[f], sub)


def _apply_crud(node: Any, entry: dict) -> None:
    op = entry["op"]
    ui = entry.get("ui")
    coll = node.storage.by_uuid.get(bytes(ui)) if ui is not None else None
    if coll is None:
        return
    from shardsim.shard.collection_kinds import storage_key
    if op == "i":
        coll.insert(dict(entry["o"]))
    elif op == "d":
        coll.delete(storage_key(coll, {"_id": entry["o"]["_id"]}))
    elif op == "u":
        key = storage_key(coll, {"_id": entry["o2"]["_id"]})
        cur = coll.docs.get(key)
        if cur is None:
            return
        o = entry["o"]
        if o.get("$v") == 2:
            import copy
            new = copy.deepcopy(cur)
            _apply_diff(new, o["diff"])
            coll.replace(key, new)
        else:
            coll.replace(key, dict(o))


def apply_entries(node: Any, entries: list[dict]) -> None:
    for entry in entries:
        op = entry["op"]
        if op in ("i", "u", "d"):
            _apply_crud(node, entry)
        elif op == "c":
            o = entry["o"]
            db = entry["ns"].split(".")[0]
            if "create" in o:
                opts = {k: v for k, v in o.items() if k not in ("create", "idIndex")}
                node.storage.add(Collection(db, o["create"], bytes(entry["ui"]), opts))
            elif "drop" in o:
                c = node.storage.get(db, o["drop"])
                if c is not None:
                    node.storage.remove(c)
        node.clock.advance(entry["ts"])
        node.append_entry(entry)


async def undo_entries(node: Any, undo: list[dict], refetch: Any) -> Any:
    keys = []
    for e in undo:
        if e["op"] in ("i", "u", "d") and e.get("ui") is not None:
            _id = e["o2"]["_id"] if e["op"] == "u" else e["o"]["_id"]
            keys.append((bytes(e["ui"]), _id))
    oldest = undo[-1]["ts"] if undo else None
    if oldest is not None:
        from shardsim.core.clock import ts_key
        node.oplog.discard_after(ts_key(oldest) - 1)
    docs = await refetch(keys) if keys else {}
    for (uuid, _id), doc in docs.items():
        coll = node.storage.by_uuid.get(uuid)
        if coll is None:
            continue
        from shardsim.shard.collection_kinds import storage_key
        key = storage_key(coll, {"_id": _id})
        if key in coll.docs:
            coll.delete(key)
        if doc is not None:
            coll.insert(dict(doc))
    return None
