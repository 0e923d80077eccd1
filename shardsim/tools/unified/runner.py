"""A unified-test-format runner (schema 1.x) using pymongo as the driver.

Follows ``unified-test-format.md`` §Test Runner Implementation: an internal MongoClient sets up
``initialData`` (majority write concern) and reads ``outcome``; each test gets a fresh
:class:`~shardsim.tools.unified.entities.EntityMap`; operations run through
:mod:`shardsim.tools.unified.operations`; fail points are disabled after the operations on the same
client; then ``expectEvents`` and ``outcome`` are asserted. Every test yields a
:class:`TestResult` (``passed``/``failed``/``skipped`` with the reason).

Speed knob (allowed by the format, "Executing a Test"): while a :class:`Runner` is open,
``pymongo.common.MIN_HEARTBEAT_INTERVAL`` is lowered to 50 ms so a client whose server was marked
Unknown after a network error (``closeConnection: true`` fail points) rediscovers it at once
instead of after 500 ms. Heartbeat frequency itself is left alone.
"""

from __future__ import annotations

import importlib.util
import shutil
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import pymongo
import pymongo.common
from pymongo import MongoClient
from pymongo.errors import OperationFailure, PyMongoError
from pymongo.uri_parser import parse_uri
from pymongo.write_concern import WriteConcern

from . import operations as ops
from . import operations_extra as ops_extra
from .entities import ClientEntity, EntityMap
from .entity_setup import SERVER_SELECTION_TIMEOUT_MS, EntitySetup, SkipTest, session_options
from .expectations import Expectations, _first_line, _short, describe_event, exact_equal
from .files import discover, load_test_file
from .gridfs_ops import bucket_op
from .matcher import MatchError, Matcher, RunnerError
from .requirements import ServerInfo, check_schema_version, parse_version, skip_reason
from .uris import _hosts_of, _single_host_uri, host_uri

# Re-exported: the spec CLI and tests import these from the runner.
__all__ = ["DEFAULT_ITERATE_TIMEOUT", "Runner", "SkipTest", "TestContext", "TestResult",
           "describe_event", "exact_equal", "session_options", "SERVER_SELECTION_TIMEOUT_MS"]

# Test files are Extended JSON (relaxed or canonical); keep documents as plain dicts.
DEFAULT_ITERATE_TIMEOUT = 10.0  # s; bound on iterateUntilDocumentOrError (pymongo's next() has none)


@dataclass
class TestResult:
    """Outcome of one test: ``status`` is ``passed``, ``failed`` or ``skipped``.

    ``reason``: the skip reason or the one-line failure; ``detail``: the full failure text
    (events observed, traceback) for ``--verbose``; ``duration``: seconds.
    """

    __test__ = False  # not a pytest test class despite the name

    file: str
    description: str
    status: str
    reason: str = ""
    detail: str = ""
    duration: float = 0.0

    @property
    def name(self) -> str:
        return f"{self.file}: {self.description}"


@dataclass
class TestContext:
    """State of one running test (never shared between tests)."""

    runner: "Runner"
    entities: EntityMap
    matcher: Matcher
    iterate_timeout: float
    clients: list[ClientEntity] = field(default_factory=list)
    failpoints: list[tuple[ClientEntity, str]] = field(default_factory=list)
    targeted_failpoints: list[tuple[tuple[str, int], str]] = field(default_factory=list)
    # change streams/cursors created without saveResultAsEntity (closed at clean-up too)
    unnamed: list[tuple[str, Any]] = field(default_factory=list)
    started_transaction: bool = False

    def close_client(self, ce: ClientEntity) -> None:
        if not ce.closed:
            ce.closed = True
            try:
                ce.client.close()
            except Exception:
                pass


class Runner(EntitySetup, Expectations):
    """Runs unified test files against the deployment at ``uri``.

    ``iterate_timeout`` (s) bounds ``iterateUntilDocumentOrError``; ``serverless`` says whether
    the deployment is Atlas Serverless (never, for shardsim). Use as a context manager, or call
    :meth:`close`. Raises pymongo's ServerSelectionTimeoutError if nothing answers at ``uri``.
    """

    def __init__(self, uri: str, *, iterate_timeout: float = DEFAULT_ITERATE_TIMEOUT,
                 serverless: bool = False) -> None:
        self.uri = uri
        self.iterate_timeout = iterate_timeout
        self._saved_min_hb = pymongo.common.MIN_HEARTBEAT_INTERVAL
        pymongo.common.MIN_HEARTBEAT_INTERVAL = 0.05
        # one mongos for setup and outcome checks, as for a client without useMultipleMongoses
        self.internal = MongoClient(_single_host_uri(uri),
                                    serverSelectionTimeoutMS=SERVER_SELECTION_TIMEOUT_MS)
        self._per_mongos: dict[tuple[str, int], MongoClient] = {}
        self.info = self._server_info(serverless)
        self._kill_all_sessions()

    # -- set-up ---------------------------------------------------------------------------------
    def _server_info(self, serverless: bool) -> ServerInfo:
        admin = self.internal.admin
        hello = admin.command("hello")
        build = admin.command("buildInfo")
        if "versionArray" in build:
            version = parse_version(build["versionArray"])
        else:
            version = parse_version(build["version"])
        if self.internal.options.load_balanced:
            topology = "load-balanced"
        elif hello.get("msg") == "isdbgrid":
            topology = "sharded"
        elif hello.get("setName"):
            topology = "replicaset"
        else:
            topology = "single"
        rs_shards = True
        if topology == "sharded":
            try:
                shards = list(self.internal.config.shards.find({}, {"host": 1}))
                rs_shards = bool(shards) and all("/" in s.get("host", "") for s in shards)
            except PyMongoError:
                rs_shards = False
        # auth: the runner (and every client entity) authenticates with the URI's credentials,
        # so authentication is on exactly when the URI has a user; the mechanisms are what the
        # server offers that user (hello's saslSupportedMechs), as drivers' runners ask
        parsed = parse_uri(self.uri, validate=False, warn=True)
        user = parsed.get("username")
        auth = user is not None
        mechanisms: list[str] = []
        if auth:
            source = parsed["options"].get("authsource") or parsed.get("database") or "admin"
            reply = admin.command("hello", saslSupportedMechs=f"{source}.{user}")
            mechanisms = list(reply.get("saslSupportedMechs") or [])
        csfle = importlib.util.find_spec("pymongocrypt") is not None and (
            shutil.which("mongocryptd") is not None)

        def get_parameter(name: str) -> Any:
            reply = self.internal.admin.command({"getParameter": 1, name: 1})
            if name not in reply:
                raise LookupError(name)
            return reply[name]

        return ServerInfo(version=version, topology=topology, serverless=serverless, auth=auth,
                          auth_mechanisms=mechanisms, csfle=csfle, shards_are_replica_sets=rs_shards,
                          get_parameter=get_parameter)

    def command_on(self, address: tuple[str, int], cmd: Mapping[str, Any]) -> Any:
        # pinned mongos etc.; with the deployment's credentials, if any
        return ops_extra.direct_command(self._per_mongos, address, cmd,
                                        uri=host_uri(self.uri, address))
    def _kill_all_sessions(self) -> None:
        """Terminate open transactions (format §Terminating Open Transactions) on every mongos.
        Interrupted (11601), Unauthorized (13) and CommandNotFound (59, a server without the
        command) are ignored.
        """
        hosts = _hosts_of(self.uri) if self.info.topology == "sharded" else []
        for run in [lambda c, a=a: self.command_on(a, c) for a in hosts] or [self.internal.admin.command]:
            try:
                run({"killAllSessions": []})
            except OperationFailure as exc:
                if exc.code not in (11601, 13, 59):
                    raise

    def close(self) -> None:
        try:
            self.internal.close()
            [client.close() for client in self._per_mongos.values()]
        finally:
            pymongo.common.MIN_HEARTBEAT_INTERVAL = self._saved_min_hb

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- running --------------------------------------------------------------------------------
    def run_paths(self, paths: Iterable[str | Path], name_filter: str | None = None,
                  progress: Any = None) -> list[TestResult]:
        """Run every test file under ``paths``; ``name_filter`` is a case-insensitive substring
        of ``"<file>: <test description>"``. ``progress(result)`` is called after each test."""
        results: list[TestResult] = []
        for path in discover(paths):
            results.extend(self.run_file(path, name_filter, progress))
        return results

    def run_file(self, path: str | Path, name_filter: str | None = None,
                 progress: Any = None) -> list[TestResult]:
        """Run one test file; a file that cannot be loaded yields one failed result per test."""
        path = Path(path)
        fname = path.stem
        try:
            doc = load_test_file(path)
            check_schema_version(str(doc.get("schemaVersion", "")))
            tests = doc["tests"]
        except Exception as exc:
            result = TestResult(fname, "(file)", "failed", f"cannot load test file: {exc}")
            if progress:
                progress(result)
            return [result]
        results = []
        for test in tests:
            name = f"{fname}: {test.get('description', '')}"
            if name_filter and name_filter.lower() not in name.lower():
                continue
            result = self.run_test(doc, test, fname)
            results.append(result)
            if progress:
                progress(result)
        return results

    def run_test(self, file_doc: Mapping, test: Mapping, fname: str = "") -> TestResult:
        """Run (or skip) one test of a loaded file."""
        desc = test.get("description", "")
        reason = skip_reason(file_doc.get("runOnRequirements"), self.info)
        if reason is None:
            reason = skip_reason(test.get("runOnRequirements"), self.info)
        if reason is None and test.get("skipReason"):
            reason = f"skipReason: {test['skipReason']}"
        if reason is None:
            reason = unsupported_feature(test)
        if reason is not None:
            return TestResult(fname, desc, "skipped", reason)
        started = time.monotonic()
        entities = EntityMap()
        ctx = TestContext(self, entities, Matcher(entities.for_matcher), self.iterate_timeout)
        status, why, detail = "passed", "", ""
        try:
            self._initial_data(file_doc.get("initialData") or [])
            for ent in file_doc.get("createEntities") or []:
                self._create_entity(ctx, ent)
            for i, op in enumerate(test["operations"]):
                self._run_op(ctx, op, f"operation {i} ({op.get('name')} on {op.get('object')})")
            self._stop_listening(ctx)
            self._disable_failpoints(ctx)
            for i, expected in enumerate(test.get("expectEvents") or []):
                self._check_events(ctx, expected)
            for cd in test.get("outcome") or []:
                self._check_outcome(cd)
        except SkipTest as exc:
            status, why = "skipped", str(exc)
        except (MatchError, AssertionError) as exc:
            status, why = "failed", _first_line(str(exc)) or type(exc).__name__
            detail = str(exc)
            if exc.__cause__ is not None:
                detail += "\n" + "".join(traceback.format_exception(exc.__cause__))
        except RunnerError as exc:
            status, why, detail = "failed", f"runner: {exc}", traceback.format_exc()
        except Exception as exc:  # an unexpected driver/server error fails the test
            status = "failed"
            why = f"unexpected error: {type(exc).__name__}: {exc}".splitlines()[0]
            detail = traceback.format_exc()
        finally:
            self._cleanup(ctx, failed=(status == "failed"))
        return TestResult(fname, desc, status, why, detail, time.monotonic() - started)

    # -- initialData / outcome ------------------------------------------------------------------
    def _initial_data(self, data: list) -> None:
        for cd in data:
            db = self.internal.get_database(cd["databaseName"],
                                            write_concern=WriteConcern(w="majority"))
            name = cd["collectionName"]
            for coll in (name, f"enxcol_.{name}.esc", f"enxcol_.{name}.ecoc"):
                db.drop_collection(coll)
            create_opts = cd.get("createOptions")
            docs = cd.get("documents") or []
            if create_opts is not None or not docs:
                db.command({"create": name, **(create_opts or {}),
                            "writeConcern": {"w": "majority"}})
            if docs:
                db.get_collection(name).insert_many(docs)

    # -- entities -------------------------------------------------------------------------------
    # -- operations -----------------------------------------------------------------------------
    def _run_op(self, ctx: TestContext, op: Mapping, label: str) -> None:
        try:
            self._run_op_inner(ctx, op)
        except SkipTest:
            raise
        except MatchError as exc:
            raise MatchError(f"{label}: {exc}") from None
        except RunnerError as exc:
            raise RunnerError(f"{label}: {exc}") from None
        except AssertionError as exc:
            raise AssertionError(f"{label}: {exc}") from None
        except Exception as exc:
            raise AssertionError(f"{label}: unexpected error {type(exc).__name__}: {exc}") from exc

    def _run_op_inner(self, ctx: TestContext, op: Mapping, *, in_callback: bool = False) -> None:
        """Run one operation, check its expectations; ``in_callback`` (withTransaction): errors
        still propagate after their checks (unified test format, "withTransaction")."""
        name, obj = op["name"], op["object"]
        args = op.get("arguments") or {}
        if obj == "testRunner":
            self._special(ctx, name, args)
            return
        kind = ctx.entities.kind(obj)
        target = ctx.entities.get(obj)
        if "rawData" in args and self.info.version < (8, 2):
            # the rawData option (8.2+): drivers omit it for older servers
            args = {k: v for k, v in args.items() if k != "rawData"}
        a = ops.Args(name, args, ctx)
        result: ops.OpResult | None = None
        error: BaseException | None = None
        try:
            if kind == "client":
                result = ops.client_op(ctx, obj, name, a)
            elif kind == "database":
                result = ops.database_op(ctx, target, name, a)
            elif kind == "collection":
                result = ops.collection_op(ctx, target, name, a)
            elif kind == "session":
                result = ops.session_op(ctx, target, name, a,
                                        lambda nested: [self._run_op_inner(ctx, o, in_callback=True)
                                                         for o in nested])
            elif kind == "bucket":
                result = bucket_op(target, name, a)
            elif kind in ("changeStream", "findCursor", "commandCursor"):
                a.done()
                if name == "iterateUntilDocumentOrError":
                    result = ops.iterate_until_document_or_error(ctx, target, kind)
                elif name == "iterateOnce":
                    result = ops.iterate_once(ctx, target, kind)
                elif name == "close":
                    ops.close_cursor(target, kind)
                    result = ops.OpResult()
                else:
                    raise RunnerError(f"unsupported {kind} operation {name!r}")
            else:
                raise RunnerError(f"entity {obj!r} ({kind}) has no operations")
        except (RunnerError, SkipTest, AssertionError):
            raise
        except Exception as exc:
            error = exc
        if op.get("ignoreResultAndError"):
            if in_callback and error is not None:
                raise error
            return
        if "expectError" in op:
            if error is None:
                value = result.value if result else None
                raise MatchError(f"expected an error, the operation succeeded "
                                 f"(result {_short(value)})")
            self._check_error(ctx, op["expectError"], error)
            if in_callback:
                raise error
            return
        if error is not None:
            raise error
        assert result is not None
        if "expectResult" in op:
            try:
                self._check_result(ctx, op["expectResult"], result)
            except MatchError as exc:
                raise MatchError(f"{exc}\nexpected: {_short(op['expectResult'], 4000)}\n"
                                 f"actual:   {_short(result.value, 4000)}") from None
        if result.kind in ("changeStream", "findCursor", "commandCursor") \
                and "saveResultAsEntity" not in op:
            ctx.unnamed.append((result.kind, result.value))
        if "saveResultAsEntity" in op:
            name_ = op["saveResultAsEntity"]
            if result.kind is not None:
                ctx.entities.add(name_, result.kind, result.value)
            elif result.value is None:
                raise RunnerError(f"saveResultAsEntity {name_!r}: the operation returned nothing")
            else:
                ctx.entities.add(name_, "bson", result.value)

    # -- special operations ---------------------------------------------------------------------
    def _special(self, ctx: TestContext, name: str, args: Mapping) -> None:
        if name == "failPoint":
            ce = ctx.entities.get(args["client"], "client")
            fp = dict(args["failPoint"])
            ce.client.admin.command(fp)
            ctx.failpoints.append((ce, fp["configureFailPoint"]))
        elif name == "createEntities":
            for ent in args["entities"]:
                self._create_entity(ctx, ent)
        elif name in ("assertCollectionExists", "assertCollectionNotExists"):
            names = self.internal.get_database(args["databaseName"]).list_collection_names()
            exists = args["collectionName"] in names
            if exists != (name == "assertCollectionExists"):
                raise AssertionError(f"{name}: {args['databaseName']}.{args['collectionName']} "
                                     f"{'does not exist' if not exists else 'exists'}")
        elif name in ("assertIndexExists", "assertIndexNotExists"):
            coll = self.internal[args["databaseName"]][args["collectionName"]]
            names = [ix["name"] for ix in coll.list_indexes()]
            exists = args["indexName"] in names
            if exists != (name == "assertIndexExists"):
                raise AssertionError(f"{name}: index {args['indexName']} "
                                     f"{'missing' if not exists else 'present'}")
        elif name == "wait":
            time.sleep(float(args["ms"]) / 1000.0)
        elif name == "assertSessionTransactionState":
            session = ctx.entities.get(args["session"], "session")
            state = session._transaction.state  # pymongo keeps it private; no public getter
            names = {1: "none", 2: "starting", 3: "in_progress", 4: "committed",
                     5: "committed", 6: "aborted"}
            got = names.get(int(state), str(state))
            if got != args["state"]:
                raise AssertionError(f"session transaction state {got}, expected {args['state']}")
        elif not ops_extra.special_extra(ctx, name, args):
            raise RunnerError(f"unsupported special operation {name!r}")

    # -- events ---------------------------------------------------------------------------------
    def _stop_listening(self, ctx: TestContext) -> None:
        for ce in ctx.clients:
            if ce.recorder is not None:
                ce.recorder.enabled = False
            if ce.cmap is not None:
                ce.cmap.enabled = False

    def _disable_failpoints(self, ctx: TestContext) -> None:
        errors = []
        while ctx.failpoints:
            ce, name = ctx.failpoints.pop()
            try:
                client = ce.client if not ce.closed else self.internal
                client.admin.command({"configureFailPoint": name, "mode": "off"})
            except Exception as exc:  # keep disabling the others
                errors.append(f"{name}: {exc}")
        for address, name in reversed(ctx.targeted_failpoints):  # on the mongos they were set on
            try:
                self.command_on(address, {"configureFailPoint": name, "mode": "off"})
            except Exception as exc:
                errors.append(f"{name} on {address}: {exc}")
        ctx.targeted_failpoints.clear()
        if errors:
            raise RunnerError(f"could not disable fail point(s): {errors}")

    # -- clean-up -------------------------------------------------------------------------------
    def _cleanup(self, ctx: TestContext, failed: bool) -> None:
        self._stop_listening(ctx)
        try:
            self._disable_failpoints(ctx)
        except RunnerError:
            pass
        for kind, obj in ctx.unnamed:
            ops.close_cursor(obj, kind)
        for _name, kind, obj in ctx.entities.items():
            if kind in ("changeStream", "findCursor", "commandCursor"):
                ops.close_cursor(obj, kind)
            elif kind == "session":
                try:
                    obj.end_session()
                except Exception:
                    pass
        for ce in ctx.clients:
            ctx.close_client(ce)
        if ctx.started_transaction and failed:
            try:
                self._kill_all_sessions()
            except PyMongoError:
                pass


# Operations whose server feature shardsim does not have (docs/spec-tests.md, "Not supported"):
# the tests using them are skipped with this reason rather than failed.
UNSUPPORTED_OPERATIONS: dict[str, str] = {}  # mapReduce runs since issue 31 (core/javascript.py)


def unsupported_feature(test: Mapping) -> str | None:
    """The skip reason for a test using an operation of :data:`UNSUPPORTED_OPERATIONS`."""
    for op in test.get("operations") or []:
        reason = UNSUPPORTED_OPERATIONS.get(op.get("name"))
        if reason is not None:
            return f"not supported: {reason}"
    return None

