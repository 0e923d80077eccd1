"""The entities a unified test creates (``createEntities``): clients (with their event
recorders and ``useMultipleMongoses``), databases, collections, sessions, GridFS buckets
(``unified-test-format.md`` §entity). A mixin of :class:`~shardsim.tools.unified.runner.Runner`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from pymongo import MongoClient
from pymongo.client_session import TransactionOptions
from pymongo.server_api import ServerApi

from . import operations as ops
from .cmap import CMAP_EVENTS, CmapRecorder
from .entities import COMMAND_EVENTS, ClientEntity, CommandRecorder
from .gridfs_ops import make_bucket
from .matcher import RunnerError, is_operator
from .uris import _hosts_of, _single_host_uri

if TYPE_CHECKING:  # pragma: no cover
    from .runner import TestContext

SERVER_SELECTION_TIMEOUT_MS = 10000


class SkipTest(Exception):
    """A test cannot run here for a real missing precondition (message = the reason)."""


class EntitySetup:
    """Entity creation for :class:`~shardsim.tools.unified.runner.Runner` (uses its ``uri``
    and ``info``)."""

    uri: str
    info: Any

    def _create_entity(self, ctx: TestContext, ent: Mapping) -> None:
        if len(ent) != 1:
            raise RunnerError(f"entity must have exactly one key: {list(ent)}")
        kind, spec = next(iter(ent.items()))
        eid = spec["id"]
        if kind == "client":
            ce = self._make_client(ctx, spec)
            ctx.entities.add(eid, "client", ce)
            ctx.clients.append(ce)
        elif kind == "database":
            ce = ctx.entities.get(spec["client"], "client")
            db = ce.client.get_database(spec["databaseName"],
                                        **ops.collection_options(spec.get("databaseOptions")))
            ctx.entities.add(eid, "database", db)
        elif kind == "collection":
            db = ctx.entities.get(spec["database"], "database")
            coll = db.get_collection(spec["collectionName"],
                                     **ops.collection_options(spec.get("collectionOptions")))
            ctx.entities.add(eid, "collection", coll)
        elif kind == "session":
            ce = ctx.entities.get(spec["client"], "client")
            opts = dict(spec.get("sessionOptions") or {})
            snapshot_time = opts.pop("snapshotTime", None)
            session = ce.client.start_session(**session_options(opts))
            if snapshot_time is not None:
                # pymongo has no snapshotTime option: the session starts with the saved
                # snapshot time, which it then sends as readConcern.atClusterTime.
                session._snapshot_time = ctx.entities.get(snapshot_time, "bson")
            ctx.entities.add(eid, "session", session)
            ctx.entities.lsids[eid] = session.session_id
        elif kind == "bucket":
            db = ctx.entities.get(spec["database"], "database")
            ctx.entities.add(eid, "bucket", make_bucket(db, spec.get("bucketOptions")))
        else:
            raise RunnerError(f"unsupported entity type {kind!r}")

    def _make_client(self, ctx: TestContext, spec: Mapping) -> ClientEntity:
        supported = {"id", "uriOptions", "useMultipleMongoses", "observeEvents",
                     "ignoreCommandMonitoringEvents", "observeSensitiveCommands", "serverApi"}
        extra = set(spec) - supported
        if extra:
            raise RunnerError(f"client entity option(s) not supported by this runner: "
                              f"{sorted(extra)}")
        uri_options = dict(spec.get("uriOptions") or {})
        for key, value in uri_options.items():
            if is_operator(value):
                raise RunnerError(f"uriOptions.{key}: {next(iter(value))} cannot be replaced here")
        observe = list(spec.get("observeEvents") or [])
        for name in observe:
            if name not in COMMAND_EVENTS and name not in CMAP_EVENTS:
                raise RunnerError(f"observeEvents {name!r} is not supported by this runner "
                                  "(command monitoring and CMAP events only)")
        recorder = None
        listeners: list[Any] = []
        if any(n in COMMAND_EVENTS for n in observe):
            recorder = CommandRecorder(observe, list(spec.get("ignoreCommandMonitoringEvents") or []),
                                       bool(spec.get("observeSensitiveCommands", False)))
            listeners.append(recorder)
        cmap = CmapRecorder(observe) if any(n in CMAP_EVENTS for n in observe) else None
        if cmap is not None:
            listeners.append(cmap)
        uri = self.uri
        multi = spec.get("useMultipleMongoses")
        if self.info.topology == "sharded":
            if multi is True and len(_hosts_of(uri)) < 2:
                raise SkipTest("useMultipleMongoses: true needs at least 2 mongos hosts "
                               "(the URI lists 1)")
            if multi is not True:  # false or unset: one mongos (the format allows either
                uri = _single_host_uri(uri)  # for unset; one keeps fail points on it)
        kwargs: dict[str, Any] = {}
        if not any(k.lower() == "serverselectiontimeoutms" for k in uri_options):
            kwargs["serverSelectionTimeoutMS"] = SERVER_SELECTION_TIMEOUT_MS
        kwargs.update(uri_options)
        if spec.get("serverApi"):
            api = spec["serverApi"]
            kwargs["server_api"] = ServerApi(api["version"], strict=api.get("strict"),
                                             deprecation_errors=api.get("deprecationErrors"))
        client = MongoClient(uri, event_listeners=listeners, **kwargs)
        return ClientEntity(spec["id"], client, recorder, cmap=cmap)


def session_options(opts: Mapping) -> dict[str, Any]:
    """sessionOptions → ``MongoClient.start_session`` kwargs."""
    out: dict[str, Any] = {}
    for key, value in opts.items():
        if key == "causalConsistency":
            out["causal_consistency"] = value
        elif key == "snapshot":
            out["snapshot"] = value
        elif key == "defaultTransactionOptions":
            kw: dict[str, Any] = {}
            if "readConcern" in value:
                from pymongo.read_concern import ReadConcern
                kw["read_concern"] = ReadConcern(value["readConcern"].get("level"))
            if "writeConcern" in value:
                kw["write_concern"] = ops.make_write_concern(value["writeConcern"])
            if "readPreference" in value:
                kw["read_preference"] = ops.make_read_pref(value["readPreference"])
            if "maxCommitTimeMS" in value:
                kw["max_commit_time_ms"] = value["maxCommitTimeMS"]
            out["default_transaction_options"] = TransactionOptions(**kw)
        else:
            raise RunnerError(f"sessionOptions.{key} is not supported by this runner")
    return out
