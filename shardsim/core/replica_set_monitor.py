"""Replica-set monitoring and host targeting: which member of a shard (or of the config server)
a command goes to, as the server's internal client does it (``src/mongo/client/``).

* :class:`ConnectionString` -- ``setName/host1:port1,host2:port2`` or a plain ``host:port``
  (``ConnectionString::parse``).
* :class:`ReadPreference` -- ``{mode, tags}`` as ``$readPreference`` carries it
  (``ReadPreferenceSetting::fromInnerBSON``); ``maxStalenessSeconds`` is accepted and not
  applied (every member is taken as fresh enough).
* :class:`ReplicaSetMonitor` -- one per replica set (``StreamableReplicaSetMonitor`` +
  ``RemoteCommandTargeterRS``): a connection pool per member, the members discovered from
  ``hello`` (the primary's ``hosts``/``passives``/``arbiters`` are the membership, as SDAM's
  ``updateRSFromPrimary``), the primary known from ``isWritablePrimary``. Each member is
  checked by its own task: with an awaitable ``hello`` (``topologyVersion`` +
  ``maxAwaitTimeMS``) once the member has answered with a ``topologyVersion`` (the streaming
  protocol: the reply comes when the member's state changes), else by polling every
  :attr:`ReplicaSetMonitor.heartbeat_s`. Errors the caller gets from a member are reported with
  :meth:`ReplicaSetMonitor.update_host_with_status` (``ShardRemote::updateReplSetMonitor``):
  a NotPrimaryError marks the member not primary, a network error unreachable (its pool is
  dropped), a shutdown error the same; every mark asks for an immediate check.
  :meth:`ReplicaSetMonitor.get_host` selects a member for a read preference at once when it can,
  else waits for the topology to change up to ``defaultFindReplicaSetHostTimeoutMS`` (15 s,
  ``StreamableReplicaSetMonitor::getHostsOrRefresh``) and then fails with
  FailedToSatisfyReadPreference (133) "Could not find host matching read preference
  { mode: "primary" } for set shard0".

Not built: ``maxStalenessSeconds`` (parsed, not applied), hedged reads, round-trip-time
measurement by ``ping`` (the ``hello`` round trip is the member's latency, and the 15 ms
``localThresholdMS`` window is applied on it).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from bson.int64 import Int64

from shardsim.core.client import Connection, Pool, parse_address
from shardsim.core.error_codes import codes_in_category
from shardsim.core.errors import MongoError

log = logging.getLogger("shardsim.rsm")

#: ``defaultFindReplicaSetHostTimeoutMS`` (server parameter, 15000 ms): how long a host
#: selection waits for a suitable member (``RemoteCommandTargeterRS::findHost``).
DEFAULT_FIND_HOST_TIMEOUT_MS = 15000
#: How often a member without ``topologyVersion`` is polled with ``hello`` (s). mongos'
#: ``heartbeatFrequencyMS`` is 10 s with streaming; shardsim polls more often because its
#: one-member shards answer ``hello`` without ``topologyVersion`` (no streaming).
DEFAULT_HEARTBEAT_S = 0.5
#: ``maxAwaitTimeMS`` of the awaitable ``hello`` (mongos' ``kDefaultHeartbeatFrequency``).
DEFAULT_AWAIT_MS = 10000
#: ``connectTimeoutMS`` of a check (s).
CHECK_TIMEOUT_S = 10.0
#: ``localThresholdMS``: members within this much of the nearest are equally eligible (s).
LOCAL_THRESHOLD_S = 0.015

NOT_PRIMARY_CODES = codes_in_category("NotPrimaryError")  # 189 10107 11602 13435 13436
NETWORK_CODES = codes_in_category("NetworkError")  # 6 7 89 9001 ...
SHUTDOWN_CODES = codes_in_category("ShutdownError")  # 91 11600 ...

READ_PREFERENCE_MODES = ("primary", "primaryPreferred", "secondary", "secondaryPreferred",
                         "nearest")

# SDAM server types (sdam/sdam_datatypes.h ServerType)
PRIMARY, SECONDARY, OTHER, STANDALONE, UNKNOWN = (
    "RSPrimary", "RSSecondary", "RSOther", "Standalone", "Unknown")


# -- connection strings ---------------------------------------------------------------------
@dataclass(frozen=True)
class ConnectionString:
    """``set_name`` (None for a plain host) and ``hosts`` (``host:port`` strings, in order).

    ``str()`` gives the form ``config.shards.host`` stores: ``setName/h1,h2`` or ``h1``."""

    set_name: str | None
    hosts: tuple[str, ...]

    @classmethod
    def parse(cls, text: Any) -> "ConnectionString":
        """``"set/h1:p1,h2:p2"`` or ``"h1:p1"`` (port 27017 when left out). BadValue (2)
        "Invalid connection string" for a non-string or empty one (``ShardingCatalogManager::
        addShard``), FailedToParse (9) for a bad host (``HostAndPort::parse``)."""
        if not isinstance(text, str) or not text.strip():
            raise MongoError(2, "Invalid connection string")
        set_name: str | None = None
        rest = text
        if "/" in text:
            set_name, rest = text.split("/", 1)
            if not set_name:
                raise MongoError(9, f"invalid url [{text}]")
        hosts = []
        for part in rest.split(","):
            hosts.append(normalize_host(part))
        return cls(set_name, tuple(dict.fromkeys(hosts)))

    @classmethod
    def for_replica_set(cls, set_name: str, hosts: Iterable[str]) -> "ConnectionString":
        """``ConnectionString::forReplicaSet``."""
        return cls(set_name, tuple(dict.fromkeys(hosts)))

    def __str__(self) -> str:
        joined = ",".join(self.hosts)
        return f"{self.set_name}/{joined}" if self.set_name else joined


def normalize_host(part: str) -> str:
    """``host[:port]`` -> ``host:port``; FailedToParse (9) as ``HostAndPort::parse`` words it."""
    part = part.strip()
    if not part:
        raise MongoError(9, f'Empty host component parsing HostAndPort from "{part}"')
    host, _, port = part.rpartition(":")
    if not host:
        return f"{part}:27017"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise MongoError(9, f'Port number {port} out of range parsing HostAndPort from "{part}"')
    return f"{host}:{int(port)}"


# -- read preference --------------------------------------------------------------------------
@dataclass(frozen=True)
class ReadPreference:
    """A read preference: ``mode`` and ``tags`` (a tuple of tag-set dicts; ``({},)`` matches
    any member). Built by :meth:`parse` from a ``$readPreference`` document."""

    mode: str = "primary"
    tags: tuple[tuple[tuple[str, Any], ...], ...] = ()
    max_staleness_s: int | None = None

    @classmethod
    def parse(cls, doc: Any) -> "ReadPreference":
        """From ``{mode, tags?, maxStalenessSeconds?}`` (``ReadPreferenceSetting::
        fromInnerBSON``): FailedToParse (9) for an unknown mode, BadValue (2) for tags or
        ``maxStalenessSeconds`` with ``primary``, TypeMismatch (14) for a non-document."""
        if doc is None:
            return PRIMARY_ONLY
        if not isinstance(doc, dict):
            raise MongoError(14, "$readPreference must be an object")
        mode = doc.get("mode", "primary")
        if mode not in READ_PREFERENCE_MODES:
            raise MongoError(9, f"Could not parse $readPreference mode '{mode}'. Only the modes "
                                "'primary', 'primaryPreferred', 'secondary', "
                                "'secondaryPreferred', and 'nearest' are supported.")
        raw_tags = doc.get("tags")
        tags: tuple = ()
        if raw_tags is not None:
            if not isinstance(raw_tags, list) or not all(isinstance(t, dict) for t in raw_tags):
                raise MongoError(14, "$readPreference tags must be an array of objects")
            tags = tuple(tuple(sorted(t.items())) for t in raw_tags)
        if mode == "primary" and tags and tags != ((),):
            raise MongoError(2, "Only empty tags are allowed with primary read preference")
        staleness = doc.get("maxStalenessSeconds")
        if staleness is not None and mode == "primary":
            raise MongoError(2, "mode primary does not allow for any maxStalenessSeconds")
        return cls(mode, tags, int(staleness) if staleness is not None else None)

    def describe(self) -> str:
        """As the server prints it in errmsg: ``{ mode: "primary" }``,
        ``{ mode: "secondary", tags: [ { dc: "ny" } ] }``."""
        out = f'{{ mode: "{self.mode}"'
        if self.tags and self.tags != ((),):
            sets = ", ".join("{ " + ", ".join(f"{k}: {_js(v)}" for k, v in t) + " }"
                             if t else "{}" for t in self.tags)
            out += f", tags: [ {sets} ]"
        if self.max_staleness_s is not None:
            out += f", maxStalenessSeconds: {self.max_staleness_s}"
        return out + " }"

    def tag_sets(self) -> list[dict[str, Any]]:
        """The tag sets in order; ``[{}]`` (any member) when none were given."""
        return [dict(t) for t in self.tags] or [{}]


def _js(v: Any) -> str:
    return f'"{v}"' if isinstance(v, str) else str(v)


PRIMARY_ONLY = ReadPreference()


# -- the members --------------------------------------------------------------------------------
@dataclass
class MemberDescription:
    """What the monitor knows of one member (SDAM ``ServerDescription``)."""

    host: str
    pool: Any
    kind: str = UNKNOWN
    tags: dict[str, Any] = field(default_factory=dict)
    rtt_s: float | None = None
    topology_version: dict[str, Any] | None = None
    election_id: Any = None
    set_version: int | None = None
    last_error: str | None = None


def _tv_key(tv: Any) -> tuple[Any, int] | None:
    if not isinstance(tv, dict) or "processId" not in tv:
        return None
    return tv["processId"], int(tv.get("counter", 0))


def is_stale_topology_version(known: Any, received: Any) -> bool:
    """SDAM "stale" rule: ``received`` (a reply's or error's ``topologyVersion``) is older than
    or equal to ``known`` for the same ``processId``. Absent on either side: not stale."""
    k, r = _tv_key(known), _tv_key(received)
    if k is None or r is None or k[0] != r[0]:
        return False
    return r[1] < k[1]


class ReplicaSetMonitor:
    """Monitor of one replica set, see the module docstring.

    ``conn`` -- the seed :class:`ConnectionString` (or its text); ``pool_factory(host, port)``
    builds a member's pool (:class:`shardsim.core.client.Pool`), ``check_factory(host, port)``
    the connection a member's check uses (:class:`shardsim.core.client.Connection`; tests pass
    fakes); ``heartbeat_s`` -- polling interval; ``find_host_timeout_ms`` -- a callable giving
    ``defaultFindReplicaSetHostTimeoutMS`` at the time of a selection; ``seed`` -- for the
    random choice among equally near members."""

    def __init__(self, conn: ConnectionString | str, *,
                 pool_factory: Callable[[str, int], Any] = Pool,
                 check_factory: Callable[[str, int], Any] = Connection,
                 heartbeat_s: float = DEFAULT_HEARTBEAT_S, await_ms: int = DEFAULT_AWAIT_MS,
                 find_host_timeout_ms: Callable[[], int] = lambda: DEFAULT_FIND_HOST_TIMEOUT_MS,
                 seed: int | None = None) -> None:
        if not isinstance(conn, ConnectionString):
            conn = ConnectionString.parse(conn)
        self.seed_string = conn
        self.set_name = conn.set_name
        self._pool_factory = pool_factory
        self._check_factory = check_factory
        self.heartbeat_s = heartbeat_s
        self.await_ms = await_ms
        self.find_host_timeout_ms = find_host_timeout_ms
        self.members: dict[str, MemberDescription] = {}
        self.primary: str | None = None
        self._primary_pool: Any = None
        self._max_election: tuple[Any, Any] | None = None
        self._changed: asyncio.Event | None = None
        self._wake: dict[str, asyncio.Event] = {}
        self._tasks: dict[str, asyncio.Task] = {}
        self._check_conns: dict[str, Any] = {}
        self._rng = random.Random(seed)
        self.closed = False
        self.generation = 0  # bumped on every topology change
        for h in conn.hosts:
            self._add_member(h)

    # -- what callers read ------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The set's name (the seed string for a plain host not checked yet)."""
        return self.set_name or str(self.seed_string)

    def connection_string(self) -> ConnectionString:
        """The set's current connection string: the name and every known member, as
        ``RemoteCommandTargeterRS::connectionString`` (what ``addShard`` stores)."""
        if not self.set_name:
            return self.seed_string
        return ConnectionString.for_replica_set(self.set_name, self.members)

    def primary_pool(self) -> Any:
        """The known primary's pool, or None (no await: the hot path)."""
        return self._primary_pool

    def pool(self, host: str) -> Any:
        """The pool of member ``host`` (one is made for a host not, or no longer, a member:
        a cursor pinned to it still reaches it)."""
        m = self.members.get(host)
        if m is not None:
            return m.pool
        h, p = parse_address(host)
        return self._pool_factory(h, p)

    def select(self, rp: ReadPreference = PRIMARY_ONLY, exclude: Iterable[str] = ()) -> str | None:
        """A member for ``rp`` now, or None (``SdamServerSelector::selectServers``)."""
        excluded = set(exclude)
        primary = self.primary if self.primary not in excluded else None
        if rp.mode == "primary":
            return primary
        if rp.mode == "primaryPreferred" and primary is not None:
            return primary
        kinds = (SECONDARY, PRIMARY) if rp.mode == "nearest" else (SECONDARY,)
        pick = self._pick([m for m in self.members.values()
                           if m.kind in kinds and m.host not in excluded], rp)
        if pick is None and rp.mode == "secondaryPreferred":
            return primary
        return pick

    def _pick(self, candidates: list[MemberDescription], rp: ReadPreference) -> str | None:
        """The first tag set matching any candidate, then a random one within
        ``localThresholdMS`` of the nearest."""
        for tag_set in rp.tag_sets():
            matching = [m for m in candidates
                        if all(m.tags.get(k) == v for k, v in tag_set.items())]
            if matching:
                best = min(m.rtt_s or 0.0 for m in matching)
                near = [m for m in matching if (m.rtt_s or 0.0) <= best + LOCAL_THRESHOLD_S]
                return self._rng.choice(sorted(near, key=lambda m: m.host)).host
        return None

    async def get_host(self, rp: ReadPreference = PRIMARY_ONLY, *,
                       timeout_s: float | None = None, exclude: Iterable[str] = ()) -> str:
        """A member matching ``rp``: at once when one is known, else after asking every member
        for a check and waiting for the topology to change, up to ``timeout_s`` (default
        ``defaultFindReplicaSetHostTimeoutMS``); then FailedToSatisfyReadPreference (133)
        ``Could not find host matching read preference { mode: "primary" } for set <name>``
        (``StreamableReplicaSetMonitor::getHostsOrRefresh``)."""
        host = self.select(rp, exclude)
        if host is not None:
            return host
        self.start()
        if timeout_s is None:
            timeout_s = self.find_host_timeout_ms() / 1000.0
        deadline = time.monotonic() + timeout_s
        self.request_check()
        if self._changed is None:  # closed before it ever started: fails below at once
            self._changed = asyncio.Event()
        while True:
            host = self.select(rp, exclude)
            if host is not None:
                return host
            left = deadline - time.monotonic()
            if left <= 0 or self.closed:
                raise MongoError(133, f"Could not find host matching read preference "
                                      f"{rp.describe()} for set {self.name}")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except asyncio.TimeoutError:
                pass

    # -- errors told by callers -------------------------------------------------------------
    def update_host_with_status(self, host: str, exc: BaseException) -> None:
        """What a command's failure on ``host`` says about it (``ShardRemote::
        updateReplSetMonitor``, 8.0): NotPrimaryError -> :meth:`mark_not_primary`, a network
        error or NetworkInterfaceExceededTimeLimit (202) or a shutdown error ->
        :meth:`mark_unreachable`; other errors say nothing."""
        code = getattr(exc, "code", None)
        if code is None:
            return
        tv = None
        extra = getattr(exc, "extra", None)
        if isinstance(extra, dict):
            tv = extra.get("topologyVersion")
        if code in NOT_PRIMARY_CODES:
            self.mark_not_primary(host, tv)
        elif code in NETWORK_CODES or code == 202 or code in SHUTDOWN_CODES:
            self.mark_unreachable(host, str(exc))

    def mark_not_primary(self, host: str, topology_version: Any = None) -> None:
        """``markHostNotPrimary``: ``host`` is no longer taken as primary (its type becomes
        Unknown) unless the error's ``topologyVersion`` is older than what the monitor knows
        (a stale error, SDAM); every member is checked at once."""
        m = self.members.get(host)
        if m is None or is_stale_topology_version(m.topology_version, topology_version):
            return
        if topology_version is not None and _tv_key(topology_version) is not None:
            m.topology_version = topology_version
        self._set_unknown(m, "not primary")
        self._restart_check(host)
        self.request_check()

    def mark_unreachable(self, host: str, reason: str = "unreachable") -> None:
        """``markHostUnreachable``: ``host`` becomes Unknown and its pool is dropped
        (``dropConnections``); every member is checked at once."""
        m = self.members.get(host)
        if m is None:
            return
        self._set_unknown(m, reason)
        m.pool.close()
        self._restart_check(host)
        self.request_check()

    def _set_unknown(self, m: MemberDescription, reason: str) -> None:
        m.kind = UNKNOWN
        m.last_error = reason
        if self.primary == m.host:
            self._set_primary(None)
        self._bump()

    # -- checks -----------------------------------------------------------------------------
    def start(self) -> None:
        """Start a check task per member (needs a running loop; idempotent)."""
        if self.closed:
            return
        if self._changed is None:
            self._changed = asyncio.Event()
        for host in list(self.members):
            self._start_member(host)

    def request_check(self, host: str | None = None) -> None:
        """Check ``host`` (every member when None) now instead of at its next poll."""
        for h, ev in list(self._wake.items()):
            if host is None or h == host:
                ev.set()

    async def check_now(self) -> None:
        """Run one ``hello`` on every member and apply the replies (tests, addShard)."""
        await asyncio.gather(*(self._check(h, awaitable=False) for h in list(self.members)),
                             return_exceptions=True)

    def _restart_check(self, host: str) -> None:
        """Cancel ``host``'s check in flight (an awaitable hello would answer only on its next
        change) and start a fresh one now (SDAM: a marked server is checked at once)."""
        task = self._tasks.pop(host, None)
        if task is None or task is _current_task():
            if task is not None:
                self._tasks[host] = task
            return
        task.cancel()
        conn = self._check_conns.pop(host, None)
        if conn is not None and hasattr(conn, "close"):
            conn.close()
        self._wake.pop(host, None)
        self._start_member(host)

    def _start_member(self, host: str) -> None:
        if self._changed is None or host in self._tasks or self.closed:
            return
        self._wake[host] = asyncio.Event()
        self._tasks[host] = asyncio.get_running_loop().create_task(self._monitor(host))

    async def _monitor(self, host: str) -> None:
        """A member's check loop: an awaitable hello once the member gives a
        ``topologyVersion`` (the reply comes on a change), else a poll every ``heartbeat_s``
        or at once when woken (``ServerDiscoveryMonitor``)."""
        streaming = False
        while not self.closed and host in self.members:
            m = self.members.get(host)
            sent = m.topology_version if m is not None else None
            started = time.monotonic()
            ok = await self._check(host, awaitable=streaming)
            m = self.members.get(host)
            # streaming from the second reply with a topologyVersion on: the next hello waits
            was_streaming = streaming
            streaming = bool(ok and m is not None and m.topology_version is not None)
            if streaming and was_streaming and m is not None and m.topology_version == sent \
                    and time.monotonic() - started < self.await_ms / 2000.0:
                # an unchanged reply well before maxAwaitTimeMS: the member does not wait
                # (no awaitable hello); poll it instead of asking again at once
                streaming = False
            if streaming:
                continue
            wake = self._wake.get(host)
            if wake is None:
                return
            try:
                await asyncio.wait_for(wake.wait(), self.heartbeat_s)
            except asyncio.TimeoutError:
                pass
            wake.clear()

    async def _check(self, host: str, *, awaitable: bool) -> bool:
        """One ``hello`` to ``host`` on its check connection; applies the reply (or the
        failure: the member becomes Unknown). Returns True on a reply."""
        m = self.members.get(host)
        if m is None:
            return False
        cmd: dict[str, Any] = {"hello": 1}
        timeout = CHECK_TIMEOUT_S
        if awaitable and m.topology_version is not None:
            cmd["topologyVersion"] = m.topology_version
            cmd["maxAwaitTimeMS"] = Int64(self.await_ms)
            timeout += self.await_ms / 1000.0
        conn = self._check_conns.get(host)
        if conn is None or getattr(conn, "broken", False):
            h, p = parse_address(host)
            conn = self._check_conns[host] = self._check_factory(h, p)
        started = time.monotonic()
        try:
            reply = await conn.command("admin", cmd, timeout=timeout)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # MongoError (network or the member's refusal) and others
            self._check_conns.pop(host, None)
            if hasattr(conn, "close"):
                conn.close()
            if host in self.members and self.members[host].kind != UNKNOWN:
                log.info("replica set %s: check of %s failed: %s", self.name, host, exc)
            m = self.members.get(host)
            if m is not None:
                self._set_unknown(m, str(exc))
                if getattr(exc, "code", None) in NETWORK_CODES:
                    m.pool.close()
            return False
        rtt = time.monotonic() - started
        self.apply_hello(host, reply, None if awaitable else rtt)
        return True

    # -- topology updates (SDAM) -------------------------------------------------------------
    def apply_hello(self, host: str, reply: dict[str, Any], rtt_s: float | None = None) -> None:
        """Apply ``host``'s ``hello`` reply (``TopologyStateMachine::onServerDescription``):
        a reply older than the member's ``topologyVersion`` is ignored; a member of another
        set (or a mongos) leaves the set; a primary whose ``(electionId, setVersion)`` is older
        than one already seen is taken as Unknown; a primary's ``hosts``/``passives``/
        ``arbiters`` become the membership; a secondary's add members while no primary is
        known."""
        m = self.members.get(host)
        if m is None:
            return
        tv = reply.get("topologyVersion")
        if is_stale_topology_version(m.topology_version, tv):
            return
        m.topology_version = tv if _tv_key(tv) is not None else None
        if rtt_s is not None:
            m.rtt_s = rtt_s if m.rtt_s is None else 0.8 * m.rtt_s + 0.2 * rtt_s
        m.last_error = None
        set_name = reply.get("setName")
        if reply.get("msg") == "isdbgrid" or (self.set_name and set_name != self.set_name):
            log.warning("replica set %s: %s is not a member (setName %r)", self.name, host,
                        set_name)
            self._remove_member(host)
            return self._bump()
        if set_name is None:  # a standalone reached by a plain host:port
            m.kind = STANDALONE
            self._set_primary(host)
            return self._bump()
        if self.set_name is None:
            self.set_name = set_name
        m.tags = dict(reply.get("tags") or {})
        m.election_id = reply.get("electionId")
        m.set_version = reply.get("setVersion")
        if reply.get("isWritablePrimary") or reply.get("ismaster"):
            self._from_primary(m, reply)
        else:
            m.kind = SECONDARY if reply.get("secondary") else OTHER
            if self.primary == host:
                self._set_primary(None)
            if self.primary is None:
                for h in _member_list(reply):
                    self._add_member(h)
            claimed = reply.get("primary")
            if isinstance(claimed, str) and claimed not in self.members and self.primary is None:
                self._add_member(claimed)
        self._bump()

    def _from_primary(self, m: MemberDescription, reply: dict[str, Any]) -> None:
        """SDAM ``updateRSFromPrimary``: the stale-primary check, the old primary demoted, the
        membership taken from the primary."""
        election = (m.election_id, m.set_version)
        if m.election_id is not None and self._max_election is not None:
            if _election_key(election) < _election_key(self._max_election):
                m.kind = UNKNOWN
                m.last_error = "stale primary"
                return
        if m.election_id is not None:
            self._max_election = election
        old = self.primary
        if old is not None and old != m.host and old in self.members:
            self.members[old].kind = UNKNOWN
        m.kind = PRIMARY
        self._set_primary(m.host)
        listed = _member_list(reply)
        if listed:
            for h in listed:
                self._add_member(h)
            for h in [h for h in self.members if h not in listed]:
                self._remove_member(h)

    def _set_primary(self, host: str | None) -> None:
        self.primary = host
        self._primary_pool = self.members[host].pool if host in self.members else None

    def _add_member(self, host: str) -> None:
        if host in self.members:
            return
        h, p = parse_address(host)
        self.members[host] = MemberDescription(host, self._pool_factory(h, p))
        self._start_member(host)

    def _remove_member(self, host: str) -> None:
        m = self.members.pop(host, None)
        if m is None:
            return
        if self.primary == host:
            self._set_primary(None)
        task = self._tasks.pop(host, None)
        if task is not None and task is not _current_task():
            task.cancel()
        self._wake.pop(host, None)
        conn = self._check_conns.pop(host, None)
        if conn is not None and hasattr(conn, "close"):
            conn.close()
        m.pool.close()

    def _bump(self) -> None:
        self.generation += 1
        if self._changed is not None:
            self._changed.set()

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every check and close every pool (``ReplicaSetMonitor::drop``); waiters of
        :meth:`get_host` fail with 133."""
        self.closed = True
        for task in self._tasks.values():
            if task is not _current_task():
                task.cancel()
        self._tasks.clear()
        for conn in self._check_conns.values():
            if hasattr(conn, "close"):
                conn.close()
        self._check_conns.clear()
        for m in self.members.values():
            m.pool.close()
        self._bump()

    def describe(self) -> dict[str, Any]:
        """``connPoolStats.replicaSets.<name>``-like view: ``{hosts: [{addr, ok, ismaster,
        hidden, secondary, pingTimeMillis, tags?}]}`` (``StreamableReplicaSetMonitor::
        appendInfo``)."""
        hosts = []
        for m in self.members.values():
            entry: dict[str, Any] = {
                "addr": m.host, "ok": m.kind in (PRIMARY, SECONDARY, STANDALONE),
                "ismaster": m.kind in (PRIMARY, STANDALONE), "hidden": False,
                "secondary": m.kind == SECONDARY,
                "pingTimeMillis": int((m.rtt_s or 0.0) * 1000)}
            if m.tags:
                entry["tags"] = dict(m.tags)
            hosts.append(entry)
        return {"hosts": hosts}


def _member_list(reply: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key in ("hosts", "passives", "arbiters"):
        for h in reply.get(key) or []:
            if isinstance(h, str) and h not in out:
                out.append(h)
    return out


def _election_key(pair: tuple[Any, Any]) -> tuple[bytes, int]:
    eid, sv = pair
    raw = eid.binary if hasattr(eid, "binary") else b""
    return raw, int(sv or 0)


def _current_task() -> asyncio.Task | None:
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None
