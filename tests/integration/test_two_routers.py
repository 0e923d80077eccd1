"""Two routers on one config server (``Cluster(routers=2)``): a database created through
one mongos is read at once through the other (the second router reloads its catalog on the
miss instead of answering "empty")."""

from __future__ import annotations

from typing import Any

import pymongo
import pytest

pytestmark = pytest.mark.timeout(120)


def test_database_made_on_one_router_is_read_on_the_other(cluster_factory: Any) -> None:
    cluster = cluster_factory(shards=2, routers=2)
    hosts = cluster.routers_uri.split("//", 1)[1].rstrip("/").split(",")
    assert len(hosts) == 2 and len(set(hosts)) == 2
    a = pymongo.MongoClient(f"mongodb://{hosts[0]}/", directConnection=True)
    b = pymongo.MongoClient(f"mongodb://{hosts[1]}/", directConnection=True)
    try:
        assert b.admin.command("hello")["msg"] == "isdbgrid"
        a.fresh_db.c.insert_many([{"_id": i} for i in range(5)])
        assert b.fresh_db.c.count_documents({}) == 5
        assert [d["_id"] for d in b.fresh_db.c.find().sort("_id", 1)] == [0, 1, 2, 3, 4]
        assert len(list(b.fresh_db.c.aggregate([{"$match": {}}]))) == 5
    finally:
        a.close()
        b.close()
