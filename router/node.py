"""The router (``mongos``): no data; targets commands at shards from the cached catalog.

* Identity: ``hello`` with ``msg: "isdbgrid"`` (no ``setName``/``hosts``), ``serverStatus``
  ``process: "mongos"``, ``getCmdLineOpts`` with ``sharding.configDB``.
* Commands: one module per family in :mod:`router.commands` (crud, reads, ddl, sharding,
  transactions, admin), installed here. Sharding commands go to the config server under its
  internal names (see :mod:`configsvr.node`).
* Writes are targeted by shard key (:mod:`router.writes`), reads are targeted or broadcast and
  merged (:mod:`router.commands.reads`), DDL reaches every shard that owns the namespace
  with only the primary shard's oplog entry visible to change streams (others get
  ``fromMigrate: true``).
* Cluster time: every shard command carries the router's ``$clusterTime``; replies advance
  the router's clock and the reply ``operationTime`` is the newest ``operationTime`` of the
  shard replies consumed (:mod:`shardsim.core.gossip`, notes §7.4).
* Change streams are built by :mod:`router.change_stream` (``aggregate_change_stream``); the
  router-wide state they share is :attr:`RouterNode.promise_requests`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from bson.int64 import Int64

from shardsim.router import security as router_security
from shardsim.router import shard_versioning
from shardsim.router.catalog import CatalogCache
from shardsim.router.change_stream.promise_requests import PromiseRequests
from shardsim.router.commands import FAMILIES
from shardsim.router.commands import transactions as txn_cmds
from shardsim.router.forwarding import BIG_BATCH
from shardsim.core.gossip import OPERATION_TIME, gossip_command
from shardsim.router.read_concern import run_with_read_concern
from shardsim.router.shard_registry import ShardRegistry, config_pool, read_preference_document
from shardsim.router.transactions import TransactionRouter
from shardsim.router.writes import NamespaceGate
from shardsim.core.client import Pool, parse_address
from shardsim.core.replica_set_monitor import (DEFAULT_FIND_HOST_TIMEOUT_MS, DEFAULT_HEARTBEAT_S,
                                               NETWORK_CODES, NOT_PRIMARY_CODES, SHUTDOWN_CODES,
                                               ReadPreference)
from shardsim.core.commands import Request
from shardsim.core.cursors import ListCursor
from shardsim.core import failpoints
from shardsim.core.errors import RETRYABLE_WRITE_CODES, MongoError, transaction_labels
from shardsim.core.txn_rules import check_transaction_command
from shardsim.core.node import Node
from shardsim.core.protocol import configsvr as csrq

log = logging.getLogger("shardsim.router")

REFRESH_INTERVAL_S = 1.0
#: Attempts to open a shard cursor (``kMaxNumFailedHostRetryAttempts``, async_requests_sender.cpp).
ESTABLISH_ATTEMPTS = 3
# What a retry of a cursor's establishment may cure: the member is not primary, unreachable
# or shutting down (the codes ShardRemote::updateReplSetMonitor acts on).
_ESTABLISH_RETRY_CODES = NOT_PRIMARY_CODES | NETWORK_CODES | SHUTDOWN_CODES
CONFIG_ATTEMPTS = 3  # a config command refused by a member that is not primary (config_command)
_CONFIG_REFUSALS = frozenset({10107, 13435, 13436})


# Authentication of the internal user (__system@local) through the router.
_LOCAL_AUTH_COMMANDS = frozenset({"saslStart", "saslContinue", "authenticate", "logout"})


class RouterNode(Node):
    """``python -m shardsim.router --configdb HOST:PORT`` (or ``setName/HOST:PORT,...``: the
    config server's replica set, reached at its primary through a monitor).

    Attributes other router modules use: ``catalog`` (:class:`router.catalog.CatalogCache`),
    ``config_pool`` (:class:`shardsim.core.client.Pool` to the config server), ``shards``
    (:class:`router.shard_registry.ShardRegistry`: a replica-set monitor per shard),
    :meth:`pool_for` (a shard primary's pool), :meth:`shard_command`, ``cursors``, and the
    state the command handlers share:

    * ``transactions`` (:class:`router.transactions.TransactionRouter`): the one shard of each
      open transaction;
    * ``write_gates`` (``{namespace or database: router.writes.NamespaceGate}``): this router's
      writes held during a moveChunk/movePrimary it runs;
    * ``promise_requests`` (:class:`router.change_stream.promise_requests.PromiseRequests`): the
      change streams' promise requests to idle shards, told of every shard write by
      :mod:`router.writes`.
    """

    role = "router"

    def __init__(self, *, configdb: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.configdb = configdb
        self.catalog = CatalogCache(None, self.clock)  # type: ignore[arg-type]
        # options rsm_heartbeat_ms / find_host_timeout_ms (the test kit sets a small heartbeat)
        self.shards = ShardRegistry(
            self.catalog,
            heartbeat_s=float(self.options.get("rsm_heartbeat_ms") or
                              DEFAULT_HEARTBEAT_S * 1000) / 1000.0,
            find_host_timeout_ms=int(self.options.get("find_host_timeout_ms") or
                                     DEFAULT_FIND_HOST_TIMEOUT_MS))
        # --configdb host:port: one pool; setName/h1,h2: the set's primary through a monitor
        self.config_pool = config_pool(configdb, self.shards)
        self.catalog.config_pool = self.config_pool
        self.catalog.primary_resolver = self._primary_address
        self._refresher: asyncio.Task | None = None
        self.transactions = TransactionRouter(self.clock)
        self.promise_requests = PromiseRequests(self.clock)
        self.write_gates: dict[str, NamespaceGate] = {}
        self.commands.install(self, *FAMILIES)
        if not self.profile.commands_80:  # 8.0 commands: CommandNotFound on 6.0/7.0
            self.commands.remove("moveCollection", "unshardCollection")
        router_security.install(self)  # users, roles and HMAC keys from the config server
        failpoints.install(self)

    # -- identity -------------------------------------------------------------------------
    def hello(self, req: Request) -> dict[str, Any]:
        """A router's hello: ``msg: "isdbgrid"`` and no replica-set fields."""
        return {"msg": "isdbgrid"}

    def process_name(self) -> str:
        """``serverStatus.process``."""
        return "mongos"

    def parameters(self) -> dict[str, Any]:
        """getParameter values: the common ones and ``defaultFindReplicaSetHostTimeoutMS``
        (how long a shard command waits for a member matching its read preference)."""
        params = super().parameters()
        params["defaultFindReplicaSetHostTimeoutMS"] = self.shards.find_host_timeout_ms
        return params

    def set_parameter(self, name: str, value: Any) -> None:
        """setParameter: ``defaultFindReplicaSetHostTimeoutMS`` (a non-negative integer,
        BadValue (2) otherwise, as the IDL's ``gte: 0``); others as :meth:`Node.set_parameter`."""
        if name == "defaultFindReplicaSetHostTimeoutMS":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise MongoError(2, f"Invalid value for parameter "
                                    f"defaultFindReplicaSetHostTimeoutMS: {value!r}")
            self.shards.find_host_timeout_ms = int(value)
        else:
            super().set_parameter(name, value)

    def parsed_options(self) -> dict[str, Any]:
        """``getCmdLineOpts.parsed`` beyond ``net``: ``sharding.configDB``."""
        return {"sharding": {"configDB": self.configdb}}

    def server_status(self) -> dict[str, Any]:
        """``serverStatus`` with ``sharding.configsvrConnectionString``."""
        st = super().server_status()
        st["sharding"] = {"configsvrConnectionString": self.configdb}
        return st

    # -- shards -----------------------------------------------------------------------------
    def pool_for(self, shard: str) -> Pool:
        """The pool of shard ``shard``'s primary as its monitor knows it (the first member's
        when no primary is known yet: callers that cannot wait); ShardNotFound (70) if the
        catalog does not list the shard. Commands should use :meth:`shard_command`, which
        waits for a primary and tells the monitor about failures."""
        return self.shards.primary_pool_or_seed(shard)

    def _primary_address(self, shard: str) -> tuple[str, int] | None:
        """The known primary of ``shard`` as ``(host, port)`` (the catalog's
        ``shard_address``), or None."""
        mon = self.shards.monitors.get(shard)
        if mon is None or mon.primary is None:
            return None
        return parse_address(mon.primary)

    async def shard_command(self, shard: str, db: str, cmd: dict[str, Any], *, raw: bool = False,
                            check: bool = True, timeout: float | None = None,
                            read_preference: ReadPreference | None = None,
                            host: str | None = None) -> Any:
        """Run ``cmd`` on ``shard`` with cluster-time gossip (MongoError on failure). A command
        inside a transaction gets the fields its participant needs
        (:meth:`router.transactions.TransactionRouter.attach`); CRUD and reads carry the
        namespace's ``shardVersion`` (:func:`router.shard_versioning.attach`).

        Targeting (:meth:`router.shard_registry.ShardRegistry.target`): ``host`` when given (a
        cursor's getMore goes where the cursor is), else the member ``read_preference``
        selects (primary by default, always inside a transaction; a non-primary read carries
        ``$readPreference`` so the member serves it, as ``ShardRemote``'s
        ``_appendMetadataForCommand``); FailedToSatisfyReadPreference (133) when no member
        fits within ``defaultFindReplicaSetHostTimeoutMS``. A failure that says something about
        the member (not primary, network, shutdown) is told to the shard's monitor."""
        return (await self.shard_command_at(shard, db, cmd, raw=raw, check=check,
                                            timeout=timeout, read_preference=read_preference,
                                            host=host))[1]

    async def shard_command_at(self, shard: str, db: str, cmd: dict[str, Any], *,
                               raw: bool = False, check: bool = True,
                               timeout: float | None = None,
                               read_preference: ReadPreference | None = None,
                               host: str | None = None,
                               target_timeout_s: float | None = None) -> tuple[str, Any]:
        """:meth:`shard_command` returning ``(host, reply)``: the member that answered (where
        the getMores of a cursor it opened must go). ``target_timeout_s`` bounds the wait for a
        member (default ``defaultFindReplicaSetHostTimeoutMS``)."""
        if cmd.get("autocommit") is False:
            cmd = self.transactions.attach(shard, cmd)
            read_preference = None
        cmd = shard_versioning.attach(self, shard, db, cmd)
        registry = self.shards
        if host is None:
            host, pool = await registry.target(shard, read_preference,
                                               timeout_s=target_timeout_s)
            if read_preference is not None and read_preference.mode != "primary":
                cmd = {**cmd, "$readPreference": read_preference_document(read_preference)}
        else:
            pool = registry.monitor(shard).pool(host)
        try:
            reply = await gossip_command(self.clock, pool, db, cmd, raw=raw, check=check,
                                         timeout=timeout)
        except MongoError as exc:
            registry.report(shard, host, exc)
            raise
        if not check and not reply.get("ok"):
            registry.report_reply(shard, host, reply)
        return host, reply

    async def establish_cursor(self, shard: str, db: str, cmd: dict[str, Any], *,
                               raw: bool = False,
                               read_preference: ReadPreference | None = None) -> tuple[Pool, Any]:
        """Open a cursor on ``shard`` (``establishCursors``): ``(pool of the member that
        answered, reply)``. A failure that says the member is not primary, unreachable or
        shutting down is retried on the member the monitor selects next, up to
        :data:`ESTABLISH_ATTEMPTS` attempts (``AsyncRequestsSender``'s
        ``kMaxNumFailedHostRetryAttempts``), all within one ``defaultFindReplicaSetHostTimeoutMS``
        (15 s) of waiting for a member, after which FailedToSatisfyReadPreference (133,
        ``RemoteCommandTargeterRS::findHost``). Other errors are raised at once. Safe to
        repeat: a cursor opened by a lost reply is never used and times out on the member."""
        deadline = time.monotonic() + self.shards.find_host_timeout_ms / 1000.0
        for attempt in range(ESTABLISH_ATTEMPTS):
            try:
                host, reply = await self.shard_command_at(
                    shard, db, cmd, raw=raw, read_preference=read_preference,
                    target_timeout_s=max(0.0, deadline - time.monotonic()))
                return self.shards.monitor(shard).pool(host), reply
            except MongoError as exc:
                if exc.code not in _ESTABLISH_RETRY_CODES or attempt == ESTABLISH_ATTEMPTS - 1:
                    raise
                log.info("establishing a cursor on %s failed (%s), attempt %d", shard,
                         exc.errmsg, attempt + 1)
        raise AssertionError("unreachable")  # pragma: no cover

    async def config_command(self, cmd: dict[str, Any], db: str = "admin") -> dict[str, Any]:
        """Run ``cmd`` on the config server. On a config server replica set a refusal that
        says the member is not (or no longer) primary (10107, 13435, 13436: nothing ran) is
        sent again to the primary the monitor finds next, up to :data:`CONFIG_ATTEMPTS`
        times, as mongos runs its config commands with ``runCommandWithFixedRetryAttempts``
        (``src/mongo/s/client/shard.cpp``): a stepdown between two DDLs is not the client's
        error."""
        for attempt in range(CONFIG_ATTEMPTS):
            try:
                return await gossip_command(self.clock, self.config_pool, db, cmd)
            except MongoError as exc:
                if exc.code not in _CONFIG_REFUSALS or attempt == CONFIG_ATTEMPTS - 1 or \
                        not hasattr(self.config_pool, "monitor"):
                    raise
                log.info("config server refused %s (%s), attempt %d", next(iter(cmd)),
                         exc.errmsg, attempt + 1)
        raise AssertionError("unreachable")  # pragma: no cover

    async def ensure_database(self, db: str) -> str:
        """The primary shard of ``db``, creating the database entry when it has none
        (implicit database creation on first write, as on mongos)."""
        primary = self.catalog.primary_shard(db)
        if primary is not None:
            return primary
        if db in ("admin", "config", "local"):
            raise MongoError(73, f"cannot write to the '{db}' database through the router")
        reply = await self.config_command(csrq.CreateDatabase(db).to_command())
        await self.catalog.refresh()
        return reply["primary"]

    async def _reload_empty_shard_registry(self) -> None:
        """Reload the catalog when it knows no shard (a router started before the shards were
        added, between two periodic refreshes), as ``ShardRegistry::getAllShardIds`` reloads
        an empty registry before answering (``shard_registry.cpp``). Concurrent callers share
        one reload; a config server that does not answer leaves the catalog as it is."""
        try:
            await self.catalog.refresh(if_generation=self.catalog.generation)
        except MongoError as exc:
            log.debug("catalog reload failed: %s", exc.errmsg)

    async def refresh_on_database_miss(self, db: str) -> None:
        """Reload the catalog when it has no entry for ``db`` (a database made through another
        mongos since the last refresh), as mongos' CatalogCache loads a database on a miss."""
        if self.catalog.primary_shard(db) is None:
            await self.catalog.refresh()

    def read_primary(self, db: str) -> str | None:
        """Where reads of an unsharded namespace of ``db`` go: its primary shard, or the first
        shard when the database does not exist (it then answers "empty"/"not found")."""
        primary = self.catalog.primary_shard(db)
        if primary is not None:
            return primary
        shards = self.catalog.shards()
        return shards[0][0] if shards else None

    # -- dispatch -------------------------------------------------------------------------
    async def execute(self, req: Request) -> dict[str, Any]:
        """Run one command with a fresh operationTime holder
        (:data:`shardsim.core.gossip.OPERATION_TIME`)."""
        token = OPERATION_TIME.set([None])
        try:
            if not self.catalog.has_shards():
                await self._reload_empty_shard_registry()
            if req.body.get("autocommit") is False:
                # inside a transaction a statement is not re-run on StaleConfig: the error
                # aborts the transaction, which the driver retries whole
                reply = await super().execute(req)
            else:  # a StaleConfig from a shard: refresh and run the command again
                reply = await shard_versioning.run_with_retries(
                    self, lambda: super(RouterNode, self).execute(req))
        finally:
            OPERATION_TIME.reset(token)
        if req.body.get("autocommit") is False and isinstance(reply, dict):
            rt = self.transactions.recovery_token(req)
            if rt is not None and "recoveryToken" not in reply:
                reply["recoveryToken"] = rt
        return reply

    async def invoke(self, handler: Any, req: Request) -> dict[str, Any]:
        """The handler under the request's readConcern (:mod:`router.read_concern`); inside a
        transaction only the commands :func:`shardsim.core.txn_rules.check_transaction_command`
        allows (263 otherwise). Nothing runs on the ``local`` database: IllegalOperation (20)
        "Can't use 'local' database through mongos", as ``ExecCommandClient::_prologue``
        (``src/mongo/s/commands/strategy.cpp``) refuses every command whose ``$db`` is
        ``local`` (reads, writes, DDL alike). Authentication is not such a command: a member's
        ``__system`` user authenticates against ``local`` (the key file), so ``saslStart``,
        ``saslContinue``, ``authenticate`` and ``logout`` pass."""
        if req.db == "local" and self.commands.canonical(req.name) not in _LOCAL_AUTH_COMMANDS:
            raise MongoError(20, "Can't use 'local' database through mongos")
        if req.body.get("autocommit") is False:
            name = self.commands.canonical(req.name)
            check_transaction_command(name, req.db, req.body)
            if name not in txn_cmds.END_COMMANDS:
                return await txn_cmds.invoke_in_transaction(
                    self, req, lambda: run_with_read_concern(self, handler, req))
        return await run_with_read_concern(self, handler, req)

    def cluster_time_fields(self, req: Request | None, reply: dict[str, Any]) -> None:
        """As the base class, with ``operationTime`` the newest of the shard replies used."""
        holder = OPERATION_TIME.get()
        if holder and holder[0] is not None and "__operationTime" not in reply:
            reply["__operationTime"] = holder[0]
        super().cluster_time_fields(req, reply)

    def error_labels(self, req: Request | None, exc: MongoError) -> list[str]:
        """Labels as mongos adds them (``ErrorLabelBuilder``, ``error_labels.cpp``): inside a
        transaction :func:`shardsim.core.errors.transaction_labels` (TransientTransactionError for a
        transient code, RetryableWriteError for a commit/abort failing with a retryable one);
        RetryableWriteError on a retryable write failing with a retryable code; change-stream
        labels from the base class. UnknownTransactionCommitResult is the driver's to add."""
        labels = list(super().error_labels(req, exc))
        if req is None:
            return labels
        name = self.commands.canonical(req.name)
        body = req.body
        if body.get("autocommit") is False:
            wc = exc.extra.get("writeConcernError") if isinstance(exc.extra, dict) else None
            wc_code = wc.get("code") if isinstance(wc, dict) else None
            for lb in transaction_labels(exc.code, command=name, body=body, wc_code=wc_code):
                if lb not in labels:
                    labels.append(lb)
        elif "txnNumber" in body and self.commands.spec(name).retryable_write and \
                exc.code in RETRYABLE_WRITE_CODES and "RetryableWriteError" not in labels:
            labels.append("RetryableWriteError")
        return labels

    # -- lifecycle ------------------------------------------------------------------------
    async def startup(self) -> None:
        """Load the catalog (a config server that is not up yet is only logged) and start
        refreshing it every :data:`REFRESH_INTERVAL_S`."""
        await super().startup()
        try:
            await self.catalog.refresh()
        except MongoError as exc:
            log.warning("config server not reachable yet: %s", exc.errmsg)
        await router_security.refresh_keys(self)
        self._refresher = asyncio.get_running_loop().create_task(self._refresh_loop())

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_INTERVAL_S)
            try:
                await self.catalog.refresh()
                await router_security.refresh_keys(self)
            except MongoError as exc:
                log.debug("catalog refresh failed: %s", exc.errmsg)
            except Exception:  # keep refreshing whatever happened
                log.exception("catalog refresh failed")

    def crash(self) -> None:
        """``kill -9`` (see :meth:`Node.crash`): stop refreshing the catalog, stop the shards'
        monitors and close their connection pools."""
        super().crash()
        if self._refresher is not None:
            self._refresher.cancel()
        self.shards.close()
        self.config_pool.close()

    async def shutdown(self) -> None:
        """Stop refreshing, close the promise channels of change streams, stop the shards'
        monitors and close every pool."""
        if self._refresher is not None:
            self._refresher.cancel()
        await super().shutdown()
        self.promise_requests.close()
        self.shards.close()
        self.config_pool.close()

    # -- helpers for command modules ----------------------------------------------------------
    async def drain(self, shard: str, db: str, cmd: dict[str, Any], *,
                    session: dict[str, Any] | None = None,
                    read_preference: ReadPreference | None = None) -> tuple[str, list[Any]]:
        """Run a cursor-returning command on ``shard`` (the member ``read_preference``
        selects) and read the cursor to the end on that member. Returns ``(ns, docs)``;
        ``session`` fields (lsid/txnNumber/autocommit) go on getMores."""
        host, reply = await self.shard_command_at(shard, db, cmd,
                                                  read_preference=read_preference)
        cur = reply["cursor"]
        docs = list(cur.get("firstBatch", []))
        ns = cur.get("ns", "")
        coll = ns.split(".", 1)[1] if "." in ns else ns
        while cur.get("id"):
            more: dict[str, Any] = {"getMore": Int64(cur["id"]), "collection": coll,
                                    "batchSize": BIG_BATCH}
            if session:
                more.update(session)
            reply = await self.shard_command(shard, db, more, host=host)
            cur = reply["cursor"]
            docs.extend(cur.get("nextBatch", []))
        return ns, docs

    async def cursor_reply(self, ns: str, docs: list[Any], req: Request,
                           batch_size: Any = None, single_batch: bool = False) -> dict[str, Any]:
        """A client cursor over ``docs`` (router-owned; getMore/killCursors via Node)."""
        cursor = ListCursor(ns, docs)
        if isinstance(batch_size, bool) or (batch_size is not None and not isinstance(batch_size, (int, float))):
            raise MongoError(14, "batchSize must be a number")
        bs = int(batch_size) if batch_size is not None else None
        if bs is not None and bs < 0:
            raise MongoError(51024, f"BatchSize value must be non-negative, but received: {bs}")
        reply = await self.cursors.run_first_batch(cursor, bs)
        if single_batch and reply["id"]:
            await self.cursors.kill([int(reply["id"])])
            reply["id"] = Int64(0)
        return {"cursor": reply}

