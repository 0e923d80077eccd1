"""Shared pieces of the storm tests (issue 16): writers through several routers (inserts and
``$inc`` updates, retryable), a watcher with ``updateLookup``, and the end checks (every
acknowledged write in the data once, in the stream exactly once, tokens strictly increasing,
no ``null`` post-image for a document that exists)."""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Callable

import pymongo


class Watcher:
    """A thread reading ``coll.watch(full_document="updateLookup")`` into ``events`` until
    :meth:`stop`; :meth:`start` returns once the stream is open."""

    def __init__(self, coll: Any) -> None:
        self.coll = coll
        self.events: list[dict[str, Any]] = []
        self.errors: list[BaseException] = []
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with self.coll.watch(full_document="updateLookup", max_await_time_ms=200) as stream:
                self._ready.set()
                while not self._stop.is_set():
                    ev = stream.try_next()
                    if ev is not None:
                        self.events.append(ev)
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)
            self._ready.set()

    def start(self) -> "Watcher":
        self._thread.start()
        assert self._ready.wait(20)
        assert not self.errors, self.errors
        return self

    def wait_for(self, n: int, timeout: float = 30.0) -> None:
        """Wait until ``n`` events arrived (or ``timeout``), then a little more (so anything
        doubled arrives too), then stop."""
        until = time.monotonic() + timeout
        while len(self.events) < n and time.monotonic() < until and not self.errors:
            time.sleep(0.1)
        time.sleep(0.5)
        self._stop.set()
        self._thread.join(30)
        assert not self.errors, self.errors


class Writers:
    """``n`` writer threads, writer ``w`` through ``colls[w % len(colls)]``: each inserts
    ``{_id, w, v: 0, pad}`` with ``_id = i * n + w`` (so the ids grow: the top chunk is the hot
    one) and, with probability 1/2 (seeded), ``$inc``s ``v`` of one of its documents. Runs
    until :meth:`stop` or ``max_inserts`` each. ``acked_inserts``/``acked_updates`` hold what
    was acknowledged."""

    def __init__(self, colls: list[Any], n: int, seed: int, pad: int = 0,
                 max_inserts: int = 10 ** 9) -> None:
        self.colls, self.n, self.seed, self.pad = colls, n, seed, "x" * pad
        self.max_inserts = max_inserts
        self.acked_inserts: dict[int, int] = {}
        self.acked_updates: dict[int, int] = {}
        self.failures: list[BaseException] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(w,), daemon=True)
                         for w in range(n)]

    def _run(self, w: int) -> None:
        coll = self.colls[w % len(self.colls)]
        rnd = random.Random(self.seed * 100 + w)
        mine: list[int] = []
        try:
            for i in range(self.max_inserts):
                if self._stop.is_set():
                    break
                _id = i * self.n + w
                coll.insert_one({"_id": _id, "w": w, "v": 0, "pad": self.pad})
                with self._lock:
                    self.acked_inserts[_id] = 1
                mine.append(_id)
                if rnd.random() < 0.5:
                    target = rnd.choice(mine)
                    res = coll.update_one({"_id": target}, {"$inc": {"v": 1}})
                    assert res.matched_count == 1, target
                    with self._lock:
                        self.acked_updates[target] = self.acked_updates.get(target, 0) + 1
        except BaseException as exc:  # reported below
            self.failures.append(exc)

    def start(self) -> "Writers":
        for t in self._threads:
            t.start()
        return self

    def alive(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)
        assert not self.failures, self.failures[:3]

    @property
    def expected_events(self) -> int:
        return len(self.acked_inserts) + sum(self.acked_updates.values())


def run_until(pred: Callable[[], bool], deadline: float, step: float = 0.2) -> bool:
    """Poll ``pred`` until it holds or ``deadline`` (monotonic) passes; its last value."""
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()


def check_data(coll: Any, writers: Writers) -> dict[Any, dict[str, Any]]:
    """Every acknowledged insert once in ``coll`` (through a router), with every acknowledged
    ``$inc``; nothing else. Returns the documents by ``_id``."""
    docs = {d["_id"]: d for d in coll.find({}, {"pad": 0})}
    assert set(docs) == set(writers.acked_inserts), (
        sorted(set(writers.acked_inserts) - set(docs))[:10],
        sorted(set(docs) - set(writers.acked_inserts))[:10])
    for _id, n in writers.acked_updates.items():
        assert docs[_id]["v"] == n, (_id, docs[_id]["v"], n)
    assert coll.count_documents({}) == len(writers.acked_inserts)
    return docs


def check_stream(events: list[dict[str, Any]], writers: Writers,
                 extra_types: frozenset[str] = frozenset()) -> int:
    """Each acknowledged write exactly once in ``events`` (no migration event), tokens strictly
    increasing, every update's post-image present (nothing is deleted). Returns the number of
    update events."""
    kinds = {e["operationType"] for e in events}
    assert kinds <= {"insert", "update"} | extra_types, kinds
    inserts = [e["documentKey"]["_id"] for e in events if e["operationType"] == "insert"]
    assert sorted(inserts) == sorted(writers.acked_inserts), (
        len(inserts), len(writers.acked_inserts))
    updates = [e for e in events if e["operationType"] == "update"]
    per_doc: dict[int, int] = {}
    for e in updates:
        per_doc[e["documentKey"]["_id"]] = per_doc.get(e["documentKey"]["_id"], 0) + 1
    assert per_doc == writers.acked_updates
    tokens = [e["_id"]["_data"] for e in events]
    assert all(a < b for a, b in zip(tokens, tokens[1:]))
    nulls = [e["documentKey"]["_id"] for e in updates if e.get("fullDocument") is None]
    assert nulls == [], nulls[:10]
    for e in updates:
        assert e["fullDocument"]["_id"] == e["documentKey"]["_id"]
    return len(updates)


def clients_for(uris: list[str]) -> list[pymongo.MongoClient]:
    """One retryable-writes client per router URI."""
    return [pymongo.MongoClient(u, serverSelectionTimeoutMS=10000, retryWrites=True)
            for u in uris]
