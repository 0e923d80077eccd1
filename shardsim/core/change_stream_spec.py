"""Parsing and validation of ``{$changeStream: {...}}`` and the rest of the pipeline.

Mirrors ``DocumentSourceChangeStream::createFromBson`` / ``assertIsLegalSpecification``
(``src/mongo/db/pipeline/document_source_change_stream.cpp``) and the IDL of
``DocumentSourceChangeStreamSpec`` (``document_source_change_stream.idl``): unknown fields are
IDLUnknownField (40415), wrong types TypeMismatch (14), bad enum values BadValue (2), two start
points 50865/40674, ``resumeAfter`` an invalidate token InvalidResumeToken (260), namespace rules
InvalidNamespace (73)/InvalidOptions (72), stages that may not follow ``$changeStream``
IllegalOperation (20), unknown stages 40324, ``$changeStream`` not first 40602.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bson.timestamp import Timestamp

from shardsim.core import resume_token as rt
from shardsim.core import server_version as versions
from shardsim.core.commands import bson_type_name
from shardsim.core.errors import MongoError

FULL_DOCUMENT_MODES = ("default", "updateLookup", "whenAvailable", "required")
FULL_DOCUMENT_BEFORE_CHANGE_MODES = ("off", "whenAvailable", "required")

# Field name -> (accepted python types, IDL type name). None = any.
_BOOL = ((bool,), "bool")
_OPTIONS: dict[str, Any] = {
    "resumeAfter": ((dict,), "object"),
    "startAfter": ((dict,), "object"),
    "startAtOperationTime": ((Timestamp,), "timestamp"),
    "fullDocument": ((str,), "string"),
    "fullDocumentBeforeChange": ((str,), "string"),
    "allChangesForCluster": _BOOL,
    "showExpandedEvents": _BOOL,
    "showMigrationEvents": _BOOL,
    "showSystemEvents": _BOOL,
    "showRawUpdateDescription": _BOOL,
    "showCommitTimestamp": _BOOL,
    "allowToRunOnConfigDB": _BOOL,
    "allowToRunOnSystemNS": _BOOL,
    "ignoreRemovedShards": _BOOL,
    "version": ((str,), "string"),
    "supportedEvents": ((list,), "array"),
    "$_generateV2ResumeTokens": _BOOL,
    "matchCollectionUUIDForUpdateLookup": _BOOL,
}

# Stages a change stream may be followed by (change_stream_helpers / DocumentSourceChangeStream
# ::checkValidUserStage: stages that neither reorder nor aggregate events).
USER_STAGES = ("$match", "$project", "$addFields", "$set", "$unset", "$replaceRoot",
               "$replaceWith", "$redact", "$changeStreamSplitLargeEvent")

# Every other stage name the server knows (so it gets IllegalOperation, not "Unrecognized").
KNOWN_STAGES = frozenset(USER_STAGES) | frozenset((
    "$changeStream", "$group", "$sort", "$limit", "$skip", "$unwind", "$lookup", "$graphLookup",
    "$facet", "$bucket", "$bucketAuto", "$sortByCount", "$count", "$out", "$merge", "$sample",
    "$geoNear", "$collStats", "$indexStats", "$currentOp", "$listSessions", "$listLocalSessions",
    "$planCacheStats", "$unionWith", "$documents", "$densify", "$fill", "$setWindowFields",
    "$search", "$searchMeta", "$vectorSearch", "$listSearchIndexes", "$changeStreamSplitLargeEvent",
    "$querySettings", "$listSampledQueries", "$shardedDataDistribution", "$listClusterCatalog",
))


@dataclass
class StreamSpec:
    """Everything the shard pipeline needs to know about one change stream.

    ``kind`` is ``collection`` | ``database`` | ``cluster``; ``coll`` is None unless a
    collection stream. ``resume_token`` is the client's token document (resumeAfter/startAfter)
    and ``resume_data`` its decoded ``ResumeTokenData``; ``start_key`` the ``ts_key`` the oplog
    scan starts at (inclusive); ``initial_pbrt`` the first ``postBatchResumeToken``.
    """

    db: str
    coll: str | None
    kind: str
    full_document: str = "default"
    full_document_before_change: str = "off"
    show_expanded: bool = False
    show_migration: bool = False
    show_raw_update: bool = False
    show_commit_ts: bool = False
    needs_merge: bool = False
    resume_token: dict[str, Any] | None = None
    resume_data: rt.ResumeTokenData | None = None
    start_after: bool = False
    start_at: Timestamp | None = None
    token_version: int = rt.DEFAULT_VERSION
    user_stages: list[tuple[str, Any]] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)
    profile: versions.ServerProfile = versions.DEFAULT
    # What the release emits, derived from the options and the profile by parse():
    emit_collection_uuid: bool = False  # collectionUUID (showExpandedEvents; always on 8.2.0)
    emit_disambiguated: bool = False  # updateDescription.disambiguatedPaths (same, 7.0+)
    emit_commit_ts: bool = False  # commitTimestamp (showCommitTimestamp; always on 8.2.0)
    # "v2": opened by a v2 router (9.0 precise shard targeting): control events, no new-shard
    # event (shard/change_stream/control_events.py). "v1" otherwise.
    reader_version: str = "v1"

    @property
    def ns(self) -> str:
        """``db.coll``, or ``db.$cmd.aggregate`` for database/cluster streams."""
        return f"{self.db}.{self.coll}" if self.coll is not None else f"{self.db}.$cmd.aggregate"

    @property
    def cursor_ns(self) -> str:
        """The ``ns`` a cursor reply carries: ``db.coll`` or ``db.$cmd.aggregate``."""
        return self.ns


def _type_error(name: str, value: Any, expected: str) -> MongoError:
    return MongoError(14, f"BSON field '$changeStream.{name}' is the wrong type "
                          f"'{bson_type_name(value)}', expected type '{expected}'")


def parse(db: str, target: Any, pipeline: list[Any], *, needs_merge: bool = False,
          profile: versions.ServerProfile | None = None) -> StreamSpec:
    """Validate the aggregate's ``pipeline`` (``pipeline[0]`` is ``$changeStream``) run against
    ``db`` and ``target`` (collection name, or 1 for a collection-less aggregate), as the
    server-version ``profile`` does (default 8.0): ``version`` is a field from 8.2 on
    (``"v1"``/``"v2"``, other strings BadValue), ``ignoreRemovedShards`` from 9.0; before them
    they are unknown fields (40415). 6.0 makes v1 resume tokens unless
    ``$_generateV2ResumeTokens: true``."""
    profile = profile or versions.DEFAULT
    stage = pipeline[0]
    if len(stage) != 1:
        raise MongoError(40323, "A pipeline stage specification object must contain exactly one field.")
    raw = stage["$changeStream"]
    if not isinstance(raw, dict):
        raise MongoError(50808, "$changeStream stage expects a document as argument")
    for name, value in raw.items():
        opt = _OPTIONS.get(name)
        if (name == "version" and not profile.change_stream_version_field) or (
                name == "ignoreRemovedShards" and not profile.ignore_removed_shards):
            opt = None  # added by 8.2 / 9.0 (document_source_change_stream.idl)
        if opt is None:
            raise MongoError(40415, f"BSON field '$changeStream.{name}' is an unknown field.")
        types, tname = opt
        if isinstance(value, bool) and bool not in types:
            raise _type_error(name, value, tname)
        if not isinstance(value, types):
            raise _type_error(name, value, tname)

    if isinstance(target, str):
        coll: str | None = target
    else:
        coll = None
    all_for_cluster = bool(raw.get("allChangesForCluster", False))
    if all_for_cluster and not (db == "admin" and coll is None):
        found = f"{db}.{coll}" if coll is not None else f"{db}.$cmd.aggregate"
        raise MongoError(72, "A $changeStream with 'allChangesForCluster:true' may only be opened on "
                             f"the 'admin' database, and with no collection name; found {found}")
    if db == "admin":
        if not all_for_cluster:
            raise MongoError(73, "$changeStream may not be opened on the internal admin database")
    elif db == "local" or (db == "config" and not raw.get("allowToRunOnConfigDB")):
        raise MongoError(73, f"$changeStream may not be opened on the internal {db} database")
    if coll is not None and coll.startswith("system."):
        raise MongoError(73, f"$changeStream may not be opened on the internal {db}.{coll} collection"
                             + (" through mongos" if raw.get("allowToRunOnSystemNS") else ""))
    kind = "cluster" if all_for_cluster else ("collection" if coll is not None else "database")

    spec = StreamSpec(db=db, coll=coll, kind=kind, needs_merge=needs_merge, raw=raw,
                      profile=profile)
    reader = raw.get("version")
    if reader is not None and reader not in ("v1", "v2"):
        raise MongoError(2, f"Enumeration value '{reader}' for field '$changeStream.version' is not a "
                            "valid value.")
    spec.reader_version = reader or "v1"
    fd = raw.get("fullDocument", "default")
    if fd not in FULL_DOCUMENT_MODES:
        raise MongoError(2, f"Enumeration value '{fd}' for field '$changeStream.fullDocument' is not a valid value.")
    fdb = raw.get("fullDocumentBeforeChange", "off")
    if fdb not in FULL_DOCUMENT_BEFORE_CHANGE_MODES:
        raise MongoError(2, f"Enumeration value '{fdb}' for field '$changeStream.fullDocumentBeforeChange' "
                            "is not a valid value.")
    spec.full_document, spec.full_document_before_change = fd, fdb
    spec.show_expanded = bool(raw.get("showExpandedEvents", False))
    spec.show_migration = bool(raw.get("showMigrationEvents", False))
    spec.show_raw_update = bool(raw.get("showRawUpdateDescription", False))
    spec.show_commit_ts = bool(raw.get("showCommitTimestamp", False))
    always = profile.expanded_fields_always  # 8.2.0 (SERVER-86688, reverted by SERVER-109626)
    spec.emit_collection_uuid = spec.show_expanded or always
    spec.emit_disambiguated = (spec.show_expanded and profile.disambiguated_paths) or always
    spec.emit_commit_ts = (spec.show_commit_ts and profile.show_commit_timestamp) or always
    # $_generateV2ResumeTokens: false asks for v1 tokens (eventIdentifier = documentKey); true
    # for v2; without it the release's default (v1 on 6.0, v2 after).
    gen_v2 = raw.get("$_generateV2ResumeTokens")
    spec.token_version = (profile.resume_token_version if gen_v2 is None
                          else (2 if gen_v2 else 1))

    if "resumeAfter" in raw and "startAfter" in raw:
        raise MongoError(50865, "Do not specify both 'resumeAfter' and 'startAfter' in a $changeStream stage")
    token = raw.get("resumeAfter", raw.get("startAfter"))
    if token is not None:
        data = rt.decode(token)
        spec.resume_token = {"_data": token["_data"], **({"_typeBits": token["_typeBits"]}
                                                         if token.get("_typeBits") is not None else {})}
        spec.resume_data = data
        spec.start_after = "startAfter" in raw
    if "startAtOperationTime" in raw and token is not None:
        raise MongoError(40674, "Only one type of resume option is allowed, but multiple were found")
    if token is not None:
        data = spec.resume_data
        assert data is not None
        if "resumeAfter" in raw and data.fromInvalidate:
            raise MongoError(260, "Attempting to resume a change stream using 'resumeAfter' is not "
                                  "allowed from an invalidate notification")
        if (kind == "collection" and data.uuid is None and not rt.is_high_water_mark(data)
                and not (isinstance(data.eventIdentifier, dict)
                         and data.eventIdentifier.get("operationType") == "endOfTransaction")):
            raise MongoError(260, "Attempted to resume a single-collection stream, but the resume "
                                  "token does not include a UUID")
        spec.token_version = max(spec.token_version, data.version)
    spec.start_at = raw.get("startAtOperationTime")

    stages: list[tuple[str, Any]] = []
    rest = pipeline[1:]
    for i, st in enumerate(rest):
        if not isinstance(st, dict) or len(st) != 1:
            raise MongoError(40323, "A pipeline stage specification object must contain exactly one field.")
        name, arg = next(iter(st.items()))
        if name == "$changeStream":
            raise MongoError(40602, "$changeStream is only valid as the first stage in a pipeline")
        if name not in KNOWN_STAGES:
            raise MongoError(40324, f"Unrecognized pipeline stage name: '{name}'")
        if name not in USER_STAGES:
            raise MongoError(20, f"{name} is not permitted in a $changeStream pipeline")
        if name == "$changeStreamSplitLargeEvent":
            if not isinstance(arg, dict) or arg:
                raise MongoError(7182800, "$changeStreamSplitLargeEvent spec must be an empty object")
            if any(n == name for n, _ in stages):
                raise MongoError(7183900, f"{name} can only be used once in the pipeline")
            if i != len(rest) - 1:  # validatePipelinePosition (split_large_event.cpp)
                raise MongoError(7182802, f"{name} must be the last stage in the pipeline")
        stages.append((name, arg))
    spec.user_stages = stages
    if (spec.resume_data is not None and spec.resume_data.fragmentNum is not None
            and not any(n == "$changeStreamSplitLargeEvent" for n, _ in stages)):
        raise MongoError(280, "To resume from a split event, the $changeStream pipeline must include "
                              "a $changeStreamSplitLargeEvent stage")
    return spec
