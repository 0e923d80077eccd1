"""One checker per invariant of a fault trial. Each takes the :class:`Observed` outcome of a
trial and returns a list of violations (strings; empty when the invariant holds).

A trial's first writer runs, one after the other, for each op ``i``: ``insert {_id: i, seq:
i}`` then ``update {_id: i} {$inc: {n: 1}}`` (or the same in ``bulkWrite`` batches). The other
writers of the mixed workload (:mod:`.workload`) run at the same time on their own ``_id``
ranges: one inserts documents and deletes every other one, one commits small transactions that
insert two documents (on two shards as the hashed ``_id`` falls). Each write is *acknowledged*
(the driver returned a result; an ``$inc`` or a delete that matched no document, because its
insert was not applied, is noted apart), or *ambiguous* (the driver raised: it may or may not
have been applied; a retryable write is never applied twice either way).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from shardsim.testing import invariants


@dataclass
class Observed:
    """What a trial saw: the writer's outcomes, the final documents, the stream's events."""

    acked_inserts: set[int] = field(default_factory=set)
    ambiguous_inserts: set[int] = field(default_factory=set)
    acked_incs: set[int] = field(default_factory=set)  # acknowledged, matched its document
    acked_noop_incs: set[int] = field(default_factory=set)  # acknowledged, matched nothing
    ambiguous_incs: set[int] = field(default_factory=set)
    acked_deletes: set[int] = field(default_factory=set)  # acknowledged, deleted one document
    acked_noop_deletes: set[int] = field(default_factory=set)  # acknowledged, matched nothing
    ambiguous_deletes: set[int] = field(default_factory=set)
    # the transactions' inserted pairs: committed (acknowledged) or ambiguous
    acked_txns: list[tuple[int, int]] = field(default_factory=list)
    ambiguous_txns: list[tuple[int, int]] = field(default_factory=list)
    docs: dict[int, dict[str, Any]] = field(default_factory=dict)  # _id -> final document
    events: list[dict[str, Any]] = field(default_factory=list)  # in stream order
    batch: int = 0  # writer 0's batch (router-bulkwrite: its inserts, then its $incs); 0: none


def _deleted(o: Observed) -> set[int]:
    """The documents a delete removed: gone, their delete acknowledged as deleting one, or
    ambiguous after an acknowledged insert (nothing else removes a document)."""
    gone = (o.acked_deletes | (o.ambiguous_deletes & o.acked_inserts)) - set(o.docs)
    return gone


def _applied(o: Observed) -> dict[tuple[str, int], int]:
    """How many times each write took effect, read off the final documents: the insert of
    ``i`` once if its document is there (or it was deleted since), its ``$inc`` ``n`` times,
    its delete once if the document is gone after a delete that took effect."""
    out = {("insert", i): 1 for i in o.docs}
    out.update({("update", i): d.get("n", 0) for i, d in o.docs.items()})
    for i in _deleted(o):
        out[("insert", i)] = out[("delete", i)] = 1
    return out


def _writes(inserts: set[int], incs: set[int], deletes: set[int] = frozenset()  # type: ignore
            ) -> list[tuple[str, int]]:
    return [("insert", i) for i in sorted(inserts)] + [("update", i) for i in sorted(incs)] + \
        [("delete", i) for i in sorted(deletes)]


def no_lost_acknowledged_write(o: Observed) -> list[str]:
    """Every acknowledged insert is there (unless a delete of it took effect); every
    acknowledged $inc is reflected; every acknowledged delete is (the document is gone, no
    stale copy came back) (:func:`invariants.lost_writes`)."""
    out = []
    maybe_deleted = o.acked_deletes | o.ambiguous_deletes
    applied = _applied(o)
    inserts = o.acked_inserts - (maybe_deleted - set(o.docs))
    for op, i in invariants.lost_writes(_writes(inserts, o.acked_incs), applied):
        out.append(f"acknowledged insert {i} lost" if op == "insert" else
                   f"acknowledged $inc of {i} lost (n={o.docs.get(i, {}).get('n', 0)})")
    out += [f"acknowledged delete of {i} lost: the document is back" for i in
            sorted(o.acked_deletes & set(o.docs))]
    return out


def no_doubled_write(o: Observed) -> list[str]:
    """No $inc applied twice, none applied that was acknowledged as matching nothing; no
    document that nobody inserted (:func:`invariants.doubled_writes`)."""
    possible = set(_writes(o.acked_inserts | o.ambiguous_inserts,
                           o.acked_incs | o.ambiguous_incs,
                           o.acked_deletes | o.ambiguous_deletes))
    out = []
    for (op, i), n in sorted(invariants.doubled_writes(_applied(o), possible)):
        if op == "insert":
            out.append(f"document {i} was never written")
        elif op == "delete":
            out.append(f"document {i} deleted by nobody")
        elif n > 1:
            out.append(f"$inc of {i} applied {n} times")
        else:
            out.append(f"$inc of {i} acknowledged as matching nothing but applied")
    return out


def no_torn_transaction(o: Observed) -> list[str]:
    """A transaction's two inserts both there or neither (a committed one: both; none of its
    documents is ever deleted)."""
    out = [f"committed transaction {a},{b} missing {[i for i in (a, b) if i not in o.docs]}"
           for a, b in o.acked_txns if a not in o.docs or b not in o.docs]
    out += [f"transaction {a},{b} half applied" for a, b in o.ambiguous_txns
            if (a in o.docs) != (b in o.docs)]
    return out


def _key(ev: dict[str, Any]) -> tuple[str, Any]:
    return ev["operationType"], ev["documentKey"]["_id"]


def no_lost_event(o: Observed) -> list[str]:
    """Every write that took effect (seen in the final documents) has its event
    (:func:`invariants.lost_events`)."""
    took_effect = sorted(w for w, n in _applied(o).items() if n >= 1)
    return [f"{op} event of {i} missing"
            for op, i in invariants.lost_events(took_effect, map(_key, o.events))]


def no_duplicated_event(o: Observed) -> list[str]:
    """Each event once: resume tokens unique, one event per (operation, document)
    (:func:`invariants.duplicate_events`)."""
    tokens = [e["_id"]["_data"] for e in o.events]
    keys = [_key(e) for e in o.events]
    out = [f"event {tokens[i]} delivered twice" for i, _ in invariants.duplicate_events(tokens)]
    out += [f"{keys[i][0]} event of {keys[i][1]} delivered twice"
            for i, _ in invariants.duplicate_events(keys)]
    return out


_KIND = {"insert": 0, "update": 1, "delete": 2}
WRITER_SPAN = 1_000_000  # writer k of the mixed workload writes _id k * WRITER_SPAN + i


def no_reordered_event(o: Observed) -> list[str]:
    """Events in resume-token order, and each writer's acknowledged writes in its write order:
    op ``i``'s insert before its update or delete, and ``i`` before ``i + 1``
    (:func:`invariants.unordered_events`; writers run concurrently, so there is no order
    between two writers' writes). An ambiguous write has no
    place in that order: when its shard died after applying it but before replying, the
    router never learned its cluster time, so a later write on another shard may get an
    earlier one (no causal order without an acknowledgement; mongod behaves the same)."""
    tokens = [e["_id"]["_data"] for e in o.events]
    out = [f"event {tokens[i]} after {tokens[i - 1]}"
           for i in invariants.unordered_events(tokens, strict=False)]
    acked = {(i, 0) for i in o.acked_inserts} | {(i, 1) for i in o.acked_incs} | \
        {(i, 2) for i in o.acked_deletes}
    order = [(e["documentKey"]["_id"], _KIND[e["operationType"]])
             for e in o.events if e["operationType"] in _KIND]
    order = [k for k in order if k in acked]
    for w in sorted({k[0] // WRITER_SPAN for k in order}):
        mine = [k for k in order if k[0] // WRITER_SPAN == w]
        if w == 0 and o.batch:  # a batch's inserts, then its $incs, then the next batch
            mine = [(i // o.batch, kind, i) for i, kind in mine]
        if w == 2:  # one transaction's writes commit at one time: no order between them
            mine = [(i // 2, 0, 0) for i, _ in mine]
        out += [f"write {mine[i]} streamed after {mine[i - 1]}"
                for i in invariants.unordered_events(mine, strict=False)]
    return out


CHECKERS: dict[str, Callable[[Observed], list[str]]] = {
    "lost_write": no_lost_acknowledged_write,
    "doubled_write": no_doubled_write,
    "lost_event": no_lost_event,
    "duplicated_event": no_duplicated_event,
    "reordered_event": no_reordered_event,
    "torn_txn": no_torn_transaction,
}


def check(o: Observed) -> dict[str, list[str]]:
    """``{invariant: violations}`` for every checker."""
    return {name: fn(o) for name, fn in CHECKERS.items()}



# -- failover trials (tests/faults/failover.py): replica-set shards fail over ---------------
@dataclass
class FailoverObserved:
    """What a failover trial saw beside :class:`Observed`: the ``_id``\\ s the ``w: 1``
    writer sent to a primary about to be cut off (``w1_sent``) and those it got an answer for
    (``w1_acked``), those not in the final documents (``rolled_back``: the rollback undid
    them, or they never applied), the stream's events, the members whose own documents
    differ from their primary's after the set settled (``diverged``, one line each), and the
    fault that could not complete (``stuck``: no new primary in time, a timeout)."""

    w1_sent: set[int] = field(default_factory=set)
    w1_acked: set[int] = field(default_factory=set)
    rolled_back: set[int] = field(default_factory=set)
    events: list[dict[str, Any]] = field(default_factory=list)
    diverged: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)


def no_rolled_back_event(o: FailoverObserved) -> list[str]:
    """No event of a write the cluster rolled back: a change stream returns majority-committed
    events only (:func:`invariants.rolled_back_events`)."""
    keys = [e["documentKey"]["_id"] for e in o.events]
    return [f"{o.events[i]['operationType']} event of rolled-back {keys[i]}"
            for i in invariants.rolled_back_events(keys, o.rolled_back)]


def members_agree(o: FailoverObserved) -> list[str]:
    """Every live member of every shard holds exactly its primary's documents."""
    return list(o.diverged)


def failover_completes(o: FailoverObserved) -> list[str]:
    """The fault's failover completed: a new primary within the kit's deadline (15 s)."""
    return list(o.stuck)


FAILOVER_CHECKERS: dict[str, Callable[[FailoverObserved], list[str]]] = {
    "rolled_back_event": no_rolled_back_event,
    "member_diverged": members_agree,
    "no_primary": failover_completes,
}


def check_failover(o: FailoverObserved) -> dict[str, list[str]]:
    """``{invariant: violations}`` for every failover checker."""
    return {name: fn(o) for name, fn in FAILOVER_CHECKERS.items()}

# -- the ``txn`` trial (tests/faults/txn_trial.py): the coordinator killed, a delayed retry ------
_PYTHON_TEXT = re.compile(r"\b(Traceback|KeyError|TypeError|AttributeError|ValueError|"
                          r"IndexError|AssertionError|RuntimeError)\b")
# the transaction's writes: the documents it $inc's and those it inserts, in the same shard
# order (x < 0 on the coordinator, x > 0 on the other shard)
TXN_UPDATED = (-1, 1)
TXN_INSERTED = (-2, 2)


@dataclass
class TxnObserved:
    """What a ``txn`` trial saw: the client's answers to its first and its retried
    ``commitTransaction`` (``{ok}`` or ``{ok: False, code, labels, errmsg, type}``), what
    :func:`read_shard` read on every shard, and the plain writes that failed afterwards."""

    retry: dict[str, Any]
    first: dict[str, Any]
    shards: dict[str, dict[str, Any]]
    blocked: list[str] = field(default_factory=list)

    def committed(self) -> dict[str, bool]:
        """Per shard: whether the transaction's writes are there."""
        out = {}
        for name, st in self.shards.items():
            docs = st["docs"]
            out[name] = any(docs.get(i, {}).get("v", 0) >= 1 for i in TXN_UPDATED) or \
                any(i in docs for i in TXN_INSERTED)
        return out


def read_shard(proc: Any, db: str, coll: str) -> dict[str, Any]:
    """Read one shard process directly (not through the router): ``{docs: {_id: doc}, prepared:
    [its config.transactions records with state "prepared"], undecided: [ts of oplog prepare
    entries without a commit/abort entry naming them]}``."""
    import pymongo
    with pymongo.MongoClient(proc.host, proc.port, directConnection=True,
                             serverSelectionTimeoutMS=20000, socketTimeoutMS=20000) as c:
        docs = {d["_id"]: d for d in c[db][coll].find({})}
        prepared = list(c.config.transactions.find({"state": "prepared"}))
        oplog = c.local["oplog.rs"]
        decided = {e["prevOpTime"]["ts"] for e in oplog.find(
            {"$or": [{"o.commitTransaction": 1}, {"o.abortTransaction": 1}]})}
        undecided = [e["ts"] for e in oplog.find({"o.prepare": True}) if e["ts"] not in decided]
    return {"docs": docs, "prepared": prepared, "undecided": undecided}


def txn_all_or_nothing(o: TxnObserved) -> list[str]:
    """The transaction is on every shard or on none, and whole on each."""
    out = []
    committed = o.committed()
    if len(set(committed.values())) > 1:
        out.append(f"committed on some shards only: {committed}")
    for name, st in o.shards.items():
        docs = st["docs"]
        for upd, ins in zip(TXN_UPDATED, TXN_INSERTED):  # the same shard's two writes
            if upd in docs and (docs[upd].get("v", 0) >= 1) != (ins in docs):
                out.append(f"half of the transaction on {name}: {sorted(docs)}")
    return out


def txn_applied_once(o: TxnObserved) -> list[str]:
    """No write of the transaction applied twice: ``v`` at most 1, each inserted ``_id`` on
    one shard at most."""
    out = []
    for name, st in o.shards.items():
        for i in TXN_UPDATED:
            v = st["docs"].get(i, {}).get("v", 0)
            if v > 1:
                out.append(f"$inc of {i} applied {v} times on {name}")
    for i in TXN_INSERTED:
        holders = [n for n, st in o.shards.items() if i in st["docs"]]
        if len(holders) > 1:
            out.append(f"insert of {i} on {holders}")
    return out


def txn_answer_matches(o: TxnObserved) -> list[str]:
    """The client was told the truth: a commit answered ok is committed; NoSuchTransaction or
    TransientTransactionError (run it again) only for a transaction committed nowhere; never
    InternalError or Python exception text."""
    out = []
    committed = any(o.committed().values())
    for which, a in (("first commit", o.first), ("retried commit", o.retry)):
        if a.get("ok") and not committed:
            out.append(f"{which} answered ok but nothing committed")
        if not a.get("ok"):
            if committed and (a.get("code") == 251 or
                              "TransientTransactionError" in a.get("labels", [])):
                out.append(f"{which} told to re-run a committed transaction: {a}")
            if a.get("code") == 1 or _PYTHON_TEXT.search(a.get("errmsg", "")):
                out.append(f"{which} answered an internal error: {a}")
    return out


def txn_nothing_prepared(o: TxnObserved) -> list[str]:
    """No shard holds a prepared transaction afterwards (config.transactions, oplog)."""
    out = []
    for name, st in o.shards.items():
        if st["prepared"]:
            out.append(f"{name}: config.transactions has prepared {st['prepared']}")
        if st["undecided"]:
            out.append(f"{name}: prepare entries without a decision {st['undecided']}")
    return out


def txn_writers_not_blocked(o: TxnObserved) -> list[str]:
    """Plain writes of the transaction's documents go through afterwards."""
    return list(o.blocked)


TXN_CHECKERS: dict[str, Callable[[TxnObserved], list[str]]] = {
    "txn_all_or_nothing": txn_all_or_nothing,
    "txn_applied_once": txn_applied_once,
    "txn_answer": txn_answer_matches,
    "txn_prepared_left": txn_nothing_prepared,
    "txn_writer_blocked": txn_writers_not_blocked,
}


def check_txn(o: TxnObserved) -> dict[str, list[str]]:
    """``{invariant: violations}`` for every ``txn`` checker."""
    return {name: fn(o) for name, fn in TXN_CHECKERS.items()}
# -- interrupted migrations and reshardings (tests/faults/migration.py) -----------------------
@dataclass
class ShardState:
    """Every shard's own documents of a trial's collection (read directly from each shard),
    the owner of a document by ``config.chunks`` (``owner``), what was left of the migration
    machinery (``leftovers``: coordinator documents, range-deletion tasks, temporary
    collections, resharding state), the writer's ``$inc``s per ``_id`` (``acked``,
    ``ambiguous``), the ``_id``s that must exist, and the stream's events."""

    docs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # shard -> documents
    owner: Callable[[dict[str, Any]], Any] = lambda doc: None
    leftovers: list[str] = field(default_factory=list)
    acked: dict[Any, int] = field(default_factory=dict)
    ambiguous: dict[Any, int] = field(default_factory=dict)
    ids: set[Any] = field(default_factory=set)
    events: list[dict[str, Any]] = field(default_factory=list)
    pattern: Any = None
    chunks: list[Any] = field(default_factory=list)
    router_docs: dict[Any, dict[str, Any]] | None = None  # the router's view, when read


def no_orphan(st: ShardState) -> list[str]:
    """No shard keeps a document of a chunk it does not own."""
    return [f"{shard} keeps {d['_id']} of {st.owner(d)}'s chunk"
            for shard, docs in sorted(st.docs.items()) for d in docs if st.owner(d) != shard]


def no_duplicate_copy(st: ShardState) -> list[str]:
    """Each document on one shard only, and every document there."""
    where: dict[Any, list[str]] = {}
    for shard, docs in st.docs.items():
        for d in docs:
            where.setdefault(d["_id"], []).append(shard)
    out = [f"{i} on {w}" for i, w in sorted(where.items(), key=repr) if len(w) > 1]
    out += [f"document {i} lost" for i in sorted(st.ids - set(where), key=repr)]
    return out


def _n(st: ShardState) -> dict[Any, int]:
    """The final ``n`` of each ``_id`` (the owner's copy when there are several)."""
    out: dict[Any, int] = {}
    for shard, docs in st.docs.items():
        for d in docs:
            if st.owner(d) == shard or d["_id"] not in out:
                out[d["_id"]] = int(d.get("n", 0))
    return out


def no_lost_inc(st: ShardState) -> list[str]:
    """Every acknowledged ``$inc`` is in the document (no stale copy won)."""
    n = _n(st)
    return [f"{i}: n={n.get(i, 0)} < {k} acknowledged $inc" for i, k in sorted(st.acked.items())
            if n.get(i, 0) < k]


def no_doubled_inc(st: ShardState) -> list[str]:
    """No ``$inc`` applied twice: ``n`` at most acknowledged + ambiguous."""
    n = _n(st)
    return [f"{i}: n={v} > {st.acked.get(i, 0)} acknowledged + {st.ambiguous.get(i, 0)} "
            f"ambiguous" for i, v in sorted(n.items(), key=repr)
            if v > st.acked.get(i, 0) + st.ambiguous.get(i, 0)]


def no_stale_copy(st: ShardState) -> list[str]:
    """The router shows exactly the owners' copies (when the trial read the router's view):
    no owner's document missing or different there, none there that no owner has."""
    if st.router_docs is None:
        return []
    owned = {d["_id"]: d for shard, docs in st.docs.items() for d in docs
             if st.owner(d) == shard}
    out = [f"{i}: the router shows {st.router_docs.get(i)}, its owner has {d}"
           for i, d in sorted(owned.items(), key=repr) if st.router_docs.get(i) != d]
    out += [f"{i}: the router shows a document no owner has"
            for i in sorted(set(st.router_docs) - set(owned), key=repr)]
    return out


def nothing_left(st: ShardState) -> list[str]:
    """No coordinator document, range-deletion task, temporary collection or resharding
    state left after the recovery."""
    return list(st.leftovers)


def no_cleanup_event(st: ShardState) -> list[str]:
    """The stream shows the ``$inc``s, one event each, and nothing of the clone, the range
    deletions or the drops (all ``fromMigrate``)."""
    kinds = [e["operationType"] for e in st.events]
    out = [f"{k} event of {e.get('documentKey')}" for k, e in zip(kinds, st.events)
           if k != "update"]
    applied = sum(_n(st).values())
    if kinds.count("update") != applied:
        out.append(f"{kinds.count('update')} update events for {applied} applied $inc")
    return out


SHARD_CHECKERS: dict[str, Callable[[ShardState], list[str]]] = {
    "orphan": no_orphan,
    "duplicate_copy": no_duplicate_copy,
    "lost_inc": no_lost_inc,
    "doubled_inc": no_doubled_inc,
    "leftover": nothing_left,
    "cleanup_event": no_cleanup_event,
    "stale_copy": no_stale_copy,
}
# the shard checkers of the kill trials (tests/faults/harness.py): their writers insert and
# delete, so the $inc accounting of the migration scenarios is judged by CHECKERS instead
KILL_SHARD_CHECKERS = ("orphan", "duplicate_copy", "leftover", "stale_copy")


def check_shards(st: ShardState) -> dict[str, list[str]]:
    """``{invariant: violations}`` for every shard checker."""
    return {name: fn(st) for name, fn in SHARD_CHECKERS.items()}


# -- DDL interrupted by a shard kill (tests/faults/ddl_trial.py) -------------------------------
@dataclass
class DdlObserved:
    """What a DDL scenario saw after the restart and the client's retries: the retried
    command's last error (None: it succeeded), ``checkMetadataConsistency``'s inconsistencies
    (through the router), per shard the index keys (``((field, direction), ...)``) it lists
    for the trial collection (read directly), the shards owning chunks by ``config.chunks``,
    the keys the client created, and where the dropped database was still found (the config
    server's catalog, a shard's ``listDatabases``, the router's)."""

    error: str | None = None
    inconsistencies: list[dict[str, Any]] = field(default_factory=list)
    indexes: dict[str, list[tuple[Any, ...]]] = field(default_factory=dict)
    owners: set[str] = field(default_factory=set)
    wanted: list[tuple[Any, ...]] = field(default_factory=list)
    left: list[str] = field(default_factory=list)


def ddl_retry_succeeds(o: DdlObserved) -> list[str]:
    """The client's retry of the interrupted command succeeds (within its deadline)."""
    return [f"the retried command failed: {o.error}"] if o.error else []


def metadata_consistent(o: DdlObserved) -> list[str]:
    """``checkMetadataConsistency`` finds nothing."""
    return [f"{i.get('type')}: {i.get('details')}" for i in o.inconsistencies]


def index_on_every_owner(o: DdlObserved) -> list[str]:
    """Every shard owning chunks of the collection has every index the client created."""
    return [f"{shard} owns chunks but lacks index {dict(key)}"
            for shard in sorted(o.owners) for key in o.wanted
            if key not in o.indexes.get(shard, [])]


def database_gone(o: DdlObserved) -> list[str]:
    """The dropped database is in no catalog and on no shard."""
    return list(o.left)


DDL_CHECKERS: dict[str, Callable[[DdlObserved], list[str]]] = {
    "ddl_retry": ddl_retry_succeeds,
    "metadata": metadata_consistent,
    "index_missing": index_on_every_owner,
    "db_left": database_gone,
}


def check_ddl(o: DdlObserved) -> dict[str, list[str]]:
    """``{invariant: violations}`` for every DDL checker."""
    return {name: fn(o) for name, fn in DDL_CHECKERS.items()}
