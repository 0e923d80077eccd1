"""Collection kinds and index options beyond a plain collection, as mongod 8.0 keeps them:
clustered collections (``clusteredIndex``), time-series collections (``timeseries``) and the
``prepareUnique`` → ``unique`` conversion of an index by ``collMod``.

* Clustered (``clustered_util.cpp``, ``clustered_collection_options.idl``): the only replicated
  clustered key is ``{_id: 1}``, ``unique`` must be true; the stored option gets ``v: 2`` and
  the default name ``_id_``. The clustered index takes the place of the ``_id`` index:
  listIndexes shows ``{v, key: {_id: 1}, name, unique: true, clustered: true}`` and
  listCollections shows no ``idIndex``.
* Time series (``timeseries.idl``, ``timeseries_options.cpp``): ``timeField`` is required,
  ``granularity`` is seconds/minutes/hours (default seconds, which sets ``bucketMaxSpanSeconds``
  3600; minutes 86400; hours 2592000), or custom ``bucketMaxSpanSeconds`` and
  ``bucketRoundingSeconds``, both set and equal. listCollections shows ``type: "timeseries"``
  with the completed options. shardsim stores the measurements as they were inserted (no
  ``system.buckets`` collection, no ``_id`` index, so ``_id`` values may repeat, as on mongod);
  every measurement needs a date in ``timeField``.
* ``collMod`` ``index: {prepareUnique: true}`` makes the index refuse new duplicate keys
  (DuplicateKey 11000) while keeping existing ones; ``unique: true`` then converts it, or fails
  with CannotConvertIndexToUnique (359) and ``violations: [{ids: [...]}]``
  (``coll_mod.cpp`` / ``scanIndexForDuplicates``).
"""

from __future__ import annotations

import datetime
from typing import Any

from shardsim.core.errors import MongoError
from shardsim.core.values import id_key

_GRANULARITY_SPAN = {"seconds": 3600, "minutes": 86400, "hours": 2592000}


def normalize_clustered_index(spec: Any) -> dict[str, Any]:
    """The stored ``clusteredIndex`` option ``{v: 2, key: {_id: 1}, name, unique: true}`` for
    the create option ``spec``. Errors: TypeMismatch (14) for a non-document, IDLFailedToParse
    (40414) without ``key``/``unique``, 5979700 for ``unique: false``, 5979701 for another
    key than ``{_id: 1}``."""
    if spec is True:  # the legacy boolean form (time-series buckets)
        return {"v": 2, "key": {"_id": 1}, "name": "_id_", "unique": True}
    if not isinstance(spec, dict):
        raise MongoError(14, "BSON field 'create.clusteredIndex' is the wrong type, expected "
                             "types '[bool, object]'")
    for field in ("key", "unique"):
        if field not in spec:
            raise MongoError(40414, f"BSON field 'ClusteredIndexSpec.{field}' is missing but a "
                                    f"required field")
    if spec["unique"] is not True:
        raise MongoError(5979700, "The clusteredIndex option requires unique: true")
    key = spec["key"]
    if not isinstance(key, dict) or list(key) != ["_id"] or key["_id"] != 1:
        raise MongoError(5979701, "The clusteredIndex option is only supported for key: {_id: 1}")
    name = spec.get("name", "_id_")
    if not isinstance(name, str):
        raise MongoError(14, "BSON field 'ClusteredIndexSpec.name' is the wrong type, expected "
                             "type 'string'")
    return {"v": int(spec.get("v", 2)), "key": {"_id": 1}, "name": name, "unique": True}


def normalize_timeseries(spec: Any) -> dict[str, Any]:
    """The stored ``timeseries`` option ``{timeField[, metaField], granularity,
    bucketMaxSpanSeconds}`` (or the custom ``bucketRoundingSeconds``/``bucketMaxSpanSeconds``
    pair). Errors: TypeMismatch (14), IDLFailedToParse (40414) without ``timeField``, unknown
    field (40415), InvalidOptions (72) for a bad granularity, unequal bucket values or a
    ``metaField`` equal to ``timeField``."""
    if not isinstance(spec, dict):
        raise MongoError(14, "BSON field 'create.timeseries' is the wrong type, expected type "
                             "'object'")
    allowed = {"timeField", "metaField", "granularity", "bucketMaxSpanSeconds",
               "bucketRoundingSeconds"}
    for k in spec:
        if k not in allowed:
            raise MongoError(40415, f"BSON field 'TimeseriesOptions.{k}' is an unknown field.")
    time_field = spec.get("timeField")
    if time_field is None:
        raise MongoError(40414, "BSON field 'TimeseriesOptions.timeField' is missing but a "
                                "required field")
    for k in ("timeField", "metaField", "granularity"):
        if k in spec and not isinstance(spec[k], str):
            raise MongoError(14, f"BSON field 'TimeseriesOptions.{k}' is the wrong type, "
                                 f"expected type 'string'")
    out: dict[str, Any] = {"timeField": time_field}
    if "metaField" in spec:
        if spec["metaField"] == time_field:
            raise MongoError(72, "The 'metaField' and 'timeField' must be different")
        out["metaField"] = spec["metaField"]
    span, rounding = spec.get("bucketMaxSpanSeconds"), spec.get("bucketRoundingSeconds")
    if span is not None or rounding is not None:
        if "granularity" in spec or span is None or rounding is None or span != rounding:
            raise MongoError(72, "Time-series 'bucketMaxSpanSeconds' and "
                                 "'bucketRoundingSeconds' fields must be set and equal, and "
                                 "'granularity' must not be set")
        out["bucketRoundingSeconds"] = rounding
        out["bucketMaxSpanSeconds"] = span
        return out
    granularity = spec.get("granularity", "seconds")
    if granularity not in _GRANULARITY_SPAN:
        raise MongoError(72, f"Invalid timeseries granularity: {granularity}")
    out["granularity"] = granularity
    out["bucketMaxSpanSeconds"] = _GRANULARITY_SPAN[granularity]
    return out


def normalize_create_options(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` of a ``create`` with ``clusteredIndex``/``timeseries`` completed as mongod
    stores them (the other options unchanged). Raises the errors of the two normalizers and
    InvalidOptions (72) for ``timeseries`` with ``capped``."""
    out = dict(options)
    if "timeseries" in out:
        if out.get("capped"):
            raise MongoError(72, "Time-series collections may not be capped")
        out["timeseries"] = normalize_timeseries(out["timeseries"])
    if "clusteredIndex" in out and "timeseries" not in out:
        out["clusteredIndex"] = normalize_clustered_index(out["clusteredIndex"])
    return out


def id_index_spec(options: dict[str, Any]) -> dict[str, Any] | None:
    """The spec listIndexes shows for the ``_id``/clustered index of a collection with these
    options, or None for a time series (no ``_id`` index)."""
    if "timeseries" in options:
        return None
    clustered = options.get("clusteredIndex")
    if isinstance(clustered, dict):
        return {"v": clustered.get("v", 2), "key": dict(clustered["key"]),
                "name": clustered["name"], "unique": True, "clustered": True}
    return {"v": 2, "key": {"_id": 1}, "name": "_id_"}


def check_measurement(options: dict[str, Any], doc: dict[str, Any]) -> None:
    """A time-series insert needs a date in ``timeField``: BadValue (2) otherwise
    (``timeseries::extractTime``)."""
    ts = options.get("timeseries")
    if not isinstance(ts, dict):
        return
    field = ts["timeField"]
    if not isinstance(doc.get(field), datetime.datetime):
        raise MongoError(2, f"'{field}' must be present and contain a valid BSON UTC datetime "
                            f"value")


def duplicate_groups(coll: Any, idx: Any) -> list[list[Any]]:
    """The ``_id`` lists of documents of ``coll`` sharing a key of ``idx`` (in scan order),
    for CannotConvertIndexToUnique's ``violations``."""
    groups: dict[Any, list[Any]] = {}
    for doc in coll.docs.values():
        seen = set()
        for hk, _ in idx.keys_of(doc):
            if hk in seen:
                continue
            seen.add(hk)
            groups.setdefault(hk, []).append(doc.get("_id"))
    return [ids for ids in groups.values() if len(ids) > 1]


def rebuild_unique_entries(coll: Any, idx: Any) -> None:
    """Fill ``idx.entries`` from the documents (the first holder of a key keeps it), after
    ``prepareUnique``/``unique`` is set on an existing index."""
    idx.entries.clear()
    for k, doc in coll.docs.items():
        for hk, _ in idx.keys_of(doc):
            idx.entries.setdefault(hk, k)


def apply_unique_options(coll: Any, idx: Any, spec: dict[str, Any]) -> None:
    """``collMod`` ``index: {prepareUnique?, unique?}`` on ``idx``: refuses ``unique: true``
    without ``prepareUnique`` first (InvalidOptions 72) or over duplicates
    (CannotConvertIndexToUnique 359 with ``violations``). Updates ``idx.spec``/``idx.unique``
    and the key map; call before the other index options are written."""
    if spec.get("unique") is True and not idx.spec.get("unique"):
        if not idx.spec.get("prepareUnique") and not spec.get("prepareUnique"):
            raise MongoError(72, "Cannot make index unique with 'prepareUnique=false'. Run "
                                 "collMod to set it first.")
        violations = duplicate_groups(coll, idx)
        if violations:
            raise MongoError(359, "Cannot convert the index to unique. Please resolve "
                                  "conflicting documents before running collMod again.",
                             violations=[{"ids": ids} for ids in violations])
    turning_on = (spec.get("prepareUnique") is True or spec.get("unique") is True)
    if turning_on and not idx.unique:
        idx.unique = True
        rebuild_unique_entries(coll, idx)


def storage_key(coll: Any, doc: dict[str, Any]) -> Any:
    """The key a document is stored under: its ``_id``'s id_key, or for a time series (where
    ``_id`` may repeat) a fresh per-collection sequence key."""
    if "timeseries" in coll.options:
        coll.ts_seq += 1
        return ("$measurement", coll.ts_seq)
    return id_key(doc["_id"])
