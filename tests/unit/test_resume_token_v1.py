"""Version-1 resume tokens (MongoDB 6.0 and before, issue 27): byte-exact against tokens real
servers sent. v1 tokens carry ``tokenType`` and ``fromInvalidate`` like v2, no ``null`` for a
missing UUID, and for classic events the bare documentKey as eventIdentifier
(``ResumeToken::ResumeToken(const ResumeTokenData&)``, ``src/mongo/db/pipeline/resume_token.cpp``).

Sources of the vectors: event documents printed by applications and committed to public GitHub
files, found with the code index (``find_string "2B022C0100296E5A1004"``, i.e. the v1 event
header ``version 1, tokenType 128, txnOpIndex 0, fromInvalidate false, UUID``); each file
shows the whole event next to its ``_id``, so clusterTime, operationType and documentKey are
known independently of the token:

* ``A``: a Node.js auction app's comment block (index id 325047368), a ``delete`` of
  ``{_id: ObjectId('5d897ee109190b015fcb21ad')}`` at ``Timestamp(1569292443, 1)`` (2019, 4.x
  era: v1 was the only format then).
* ``B``: a Socket.io server's comment (index id 4225659700), an ``insert`` of
  ``{_id: ObjectId('63df8648c817953f69bef191')}`` at ``Timestamp(1675593288, 2)`` (Feb. 2023).
* ``C``: a NestJS search daemon's comment (index id 25185628658), an ``update`` of
  ``{_id: ObjectId('657adb477df7fd75cbed4b4d')}`` at ``Timestamp(1723711841, 1)`` (Aug. 2024).

The v1 high-water mark has no real capture here; it follows from the same encoder and the v2
vectors of /work/shared/specs/resume-token-vectors.json (``...2B0429296E1404`` = version 2,
HWM, 0, false, null; v1 drops the null).
"""

from __future__ import annotations

import uuid

import pytest
from bson import ObjectId
from bson.timestamp import Timestamp

from shardsim.core import resume_token as rt

VECTORS = [  # (source, operationType, clusterTime, collection UUID, documentKey, _data)
    ("A", "delete", Timestamp(1569292443, 1), "693b9096-0ec3-49a2-b616-b1b2f1cf3d23",
     {"_id": ObjectId("5d897ee109190b015fcb21ad")},
     "825D89809B000000012B022C0100296E5A1004693B90960EC349A2B616B1B2F1CF3D2346645F696400645D897E"
     "E109190B015FCB21AD0004"),
    ("B", "insert", Timestamp(1675593288, 2), "9bf97fed-d65d-4f97-89da-7b2eccde1c88",
     {"_id": ObjectId("63df8648c817953f69bef191")},
     "8263DF8648000000022B022C0100296E5A10049BF97FEDD65D4F9789DA7B2ECCDE1C8846645F6964006463DF86"
     "48C817953F69BEF1910004"),
    ("C", "update", Timestamp(1723711841, 1), "e9487b8e-f286-4139-a085-dbc4ad6db29c",
     {"_id": ObjectId("657adb477df7fd75cbed4b4d")},
     "8266BDC161000000012B022C0100296E5A1004E9487B8EF2864139A085DBC4AD6DB29C46645F69640064657ADB"
     "477DF7FD75CBED4B4D0004"),
]


@pytest.mark.parametrize("source,op,ts,coll_uuid,dk,data", VECTORS, ids=[v[0] for v in VECTORS])
def test_v1_event_token_byte_exact(source: str, op: str, ts: Timestamp, coll_uuid: str,
                                   dk: dict, data: str) -> None:
    token = rt.event_token(ts, uuid.UUID(coll_uuid).bytes, op, dk, version=1)
    assert token == {"_data": data}
    decoded = rt.decode({"_data": data})
    assert (decoded.version, decoded.tokenType, decoded.clusterTime) == (1, rt.EVENT, ts)
    assert decoded.eventIdentifier == dk  # v1: the documentKey alone, no operationType
    assert decoded.uuid == uuid.UUID(coll_uuid).bytes and not decoded.fromInvalidate


def test_v1_high_water_mark() -> None:
    ts = Timestamp(1773154695, 2)
    v2 = rt.make_high_water_mark(ts, 2)["_data"]
    assert v2 == "8269B03187000000022B0429296E1404"  # resume-token-vectors.json, captured
    v1 = rt.make_high_water_mark(ts, 1)["_data"]
    assert v1 == "8269B03187000000022B0229296E04"
    assert rt.is_hwm_data(v1) and rt.is_high_water_mark(rt.decode({"_data": v1}))


def test_v1_ddl_event_keeps_operation_type() -> None:
    """Non-classic (expanded) events get ``{operationType, operationDescription}`` in v1 too."""
    ts = Timestamp(100, 1)
    data = rt.event_token_data(ts, b"\x01" * 16, "createIndexes", None, {"indexes": []},
                               version=1)
    assert data.eventIdentifier == {"operationType": "createIndexes",
                                    "operationDescription": {"indexes": []}}
    drop = rt.event_token_data(ts, b"\x01" * 16, "drop", None, None, version=1)
    assert drop.eventIdentifier is None
    assert rt.decode(rt.encode(drop)).eventIdentifier is None
