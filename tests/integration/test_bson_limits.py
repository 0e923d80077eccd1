"""BSON limits at the router's door (issue 17, item 3): a 900-level document is refused with
Overflow (15) and the collection stays usable; 181 levels are refused by the shard with 15 as a
write error; 180 levels are stored and read back."""

from __future__ import annotations

import pytest
from pymongo.errors import OperationFailure, WriteError


def nest(levels: int) -> dict:
    doc: dict = {"a": 1}
    for _ in range(levels - 1):
        doc = {"a": doc}
    return doc


def test_deep_documents_through_the_router(router_client):
    coll = router_client.bson_limits.deep
    coll.drop()
    coll.insert_many([{"_id": i, "v": i} for i in range(5)])
    with pytest.raises(OperationFailure) as err:
        coll.insert_one({"_id": 900, "d": nest(900)})
    assert err.value.code == 15
    with pytest.raises(WriteError) as err:
        coll.insert_one({"_id": 181, "d": nest(180)})  # 181 levels with the document itself
    assert err.value.code == 15 and "180 levels of nesting" in str(err.value)
    coll.insert_one({"_id": 180, "d": nest(179)})
    assert coll.find_one({"_id": 180})["d"] == nest(179)
    assert coll.count_documents({}) == 6
    assert list(coll.aggregate([{"$group": {"_id": None, "n": {"$sum": 1}}}]))[0]["n"] == 6
    assert coll.count_documents({"d.a.a": {"$exists": True}}) == 1
