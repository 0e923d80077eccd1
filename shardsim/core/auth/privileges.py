"""Which privileges each command needs: the ``addRequiredPrivileges`` /
``checkAuthForOperation`` / ``doCheckAuthorization`` of every command in mongod and mongos
(``src/mongo/db/commands/*.cpp``, ``src/mongo/s/commands/cluster_*_cmd.cpp``), as a table.

:func:`required` returns :data:`NO_AUTH` (the command runs without authentication:
``requiresAuth() == false`` in the server: hello, isMaster, buildInfo, ping, saslStart,
saslContinue, authenticate, logout, connectionStatus, and the test-only configureFailPoint), :data:`AUTH_ONLY` (any authenticated
user), or a list of ``(target, actions)`` where target is ``("ns", db, coll)``, ``("db", db)``,
``("anyNormal",)`` or ``("cluster",)``. Change streams follow
``LiteParsedDocumentSourceChangeStream::requiredPrivileges``
(``document_source_change_stream.h``): ``changeStream`` and ``find`` on the collection, on the
database (``aggregate: 1``) or on any normal resource (``aggregate: 1`` on ``admin`` with
``allChangesForCluster``); ``fullDocument: "updateLookup"`` and pre-images need nothing more.
Every command a role registers declares its rule where it is defined
(``@commands.handler(name, privileges=priv.on_coll("find"))``); tests/unit/test_auth.py checks
that none is missing.
"""

from __future__ import annotations

from typing import Any, Callable

from shardsim.core.commands import Request

NO_AUTH = "noAuth"
AUTH_ONLY = "authOnly"

Needed = list[tuple[tuple, list[str]]]


def _coll_ns(req: Request) -> tuple:
    arg = req.arg
    return ("ns", req.db, arg if isinstance(arg, str) else "")


def _full_ns(value: Any, req: Request) -> tuple:
    """A ``"db.coll"`` argument (shardCollection, dataSize, renameCollection, ...)."""
    if isinstance(value, str) and "." in value:
        db, coll = value.split(".", 1)
        return ("ns", db, coll)
    return ("db", value if isinstance(value, str) else req.db)


def on_coll(*actions: str) -> Callable[[Request], Needed]:
    return lambda req: [(_coll_ns(req), list(actions))]


def on_db(*actions: str) -> Callable[[Request], Needed]:
    return lambda req: [(("db", req.db), list(actions))]


def on_cluster(*actions: str) -> Callable[[Request], Needed]:
    return lambda req: [(("cluster",), list(actions))]


def on_full_ns(*actions: str) -> Callable[[Request], Needed]:
    return lambda req: [(_full_ns(req.arg, req), list(actions))]


def _with_bypass(req: Request, actions: list[str]) -> list[str]:
    if req.body.get("bypassDocumentValidation"):
        actions = actions + ["bypassDocumentValidation"]
    return actions


def update_privileges(req: Request) -> Needed:
    actions = ["update"]
    if any(isinstance(u, dict) and u.get("upsert") for u in req.body.get("updates") or []):
        actions.append("insert")
    return [(_coll_ns(req), _with_bypass(req, actions))]


def insert_privileges(req: Request) -> Needed:
    return [(_coll_ns(req), _with_bypass(req, ["insert"]))]


def bulk_write_privileges(req: Request) -> Needed:
    """bulkWrite (``bulk_write.cpp`` ``checkAuthForOperation``): per ``nsInfo`` namespace the
    actions of the ops naming it (insert; update, plus insert for an upsert; remove), plus
    bypassDocumentValidation when asked."""
    info = req.get("nsInfo")
    ops = req.get("ops")
    namespaces = [e.get("ns") if isinstance(e, dict) else None
                  for e in (info if isinstance(info, list) else [])]
    actions: dict[int, set[str]] = {}
    for op in ops if isinstance(ops, list) else []:
        if not isinstance(op, dict):
            continue
        for kind, action in (("insert", "insert"), ("update", "update"), ("delete", "remove")):
            i = op.get(kind)
            if isinstance(i, int) and not isinstance(i, bool):
                acts = actions.setdefault(i, set())
                acts.add(action)
                if kind == "update" and op.get("upsert"):
                    acts.add("insert")
    out: Needed = []
    for i, acts in sorted(actions.items()):
        if 0 <= i < len(namespaces) and isinstance(namespaces[i], str):
            db, _, coll = namespaces[i].partition(".")
            out.append((("ns", db, coll), _with_bypass(req, sorted(acts))))
    return out


def find_and_modify_privileges(req: Request) -> Needed:
    b = req.body
    actions = ["find", "remove"] if b.get("remove") else ["find", "update"]
    if b.get("upsert"):
        actions.append("insert")
    return [(_coll_ns(req), _with_bypass(req, actions))]


def _stage_target(value: Any, db: str) -> tuple:
    if isinstance(value, dict):
        return ("ns", value.get("db", db), value.get("coll", ""))
    return ("ns", db, value if isinstance(value, str) else "")


def pipeline_privileges(pipeline: Any, db: str, out: Needed) -> None:
    """The privileges the stages of ``pipeline`` add (``$lookup``/``$graphLookup``/
    ``$unionWith``: find on the foreign collection, nested pipelines included; ``$out``: insert
    and remove; ``$merge``: insert and update; ``$collStats``/``$indexStats``; ``$currentOp``:
    inprog on the cluster)."""
    for stage in pipeline if isinstance(pipeline, list) else []:
        if not isinstance(stage, dict) or not stage:
            continue
        name, spec = next(iter(stage.items()))
        if name in ("$lookup", "$graphLookup"):
            if isinstance(spec, dict):
                if isinstance(spec.get("from"), (str, dict)):
                    out.append((_stage_target(spec["from"], db), ["find"]))
                pipeline_privileges(spec.get("pipeline"), db, out)
        elif name == "$unionWith":
            coll = spec.get("coll") if isinstance(spec, dict) else spec
            if isinstance(coll, str):
                out.append((("ns", db, coll), ["find"]))
            if isinstance(spec, dict):
                pipeline_privileges(spec.get("pipeline"), db, out)
        elif name == "$facet" and isinstance(spec, dict):
            for sub in spec.values():
                pipeline_privileges(sub, db, out)
        elif name == "$out":
            out.append((_stage_target(spec, db), ["insert", "remove"]))
        elif name == "$merge":
            into = spec.get("into") if isinstance(spec, dict) else spec
            out.append((_stage_target(into, db), ["insert", "update"]))
        elif name == "$currentOp":
            out.append((("cluster",), ["inprog"]))


def _list_sessions(spec: Any, req: Request) -> Needed:
    """``$listLocalSessions`` / ``$listSessions`` (``listSessionsRequiredPrivileges``,
    ``src/mongo/db/pipeline/document_source_list_sessions.cpp``): ``listSessions`` on the
    cluster for ``allUsers: true`` or a ``users`` list naming anyone but the caller; nothing
    for the caller's own sessions."""
    if not isinstance(spec, dict):
        return []
    mine = list(getattr(req.conn.auth, "users", None) or [])
    users = spec.get("users")
    others = isinstance(users, list) and any(
        not isinstance(u, dict) or (u.get("user"), u.get("db")) not in mine for u in users)
    if spec.get("allUsers") is True or others:
        return [(("cluster",), ["listSessions"])]
    return []


def aggregate_privileges(req: Request) -> Needed:
    pipeline = req.body.get("pipeline")
    first = pipeline[0] if isinstance(pipeline, list) and pipeline else None
    collectionless = not isinstance(req.arg, str)
    out: Needed = []
    if isinstance(first, dict) and ("$listLocalSessions" in first or "$listSessions" in first):
        out.extend(_list_sessions(next(iter(first.values())), req))
        pipeline = pipeline[1:]
    elif isinstance(first, dict) and "$changeStream" in first:
        spec = first["$changeStream"] if isinstance(first["$changeStream"], dict) else {}
        actions = ["changeStream", "find"]
        if collectionless and req.db == "admin" and spec.get("allChangesForCluster"):
            out.append((("anyNormal",), actions))
        elif collectionless:
            out.append((("db", req.db), actions))
        else:
            out.append((_coll_ns(req), actions))
        pipeline = pipeline[1:]
    elif isinstance(first, dict) and ("$collStats" in first or "$indexStats" in first):
        out.append((_coll_ns(req), ["collStats" if "$collStats" in first else "indexStats"]))
        pipeline = pipeline[1:]
    elif not collectionless:
        out.append((_coll_ns(req), ["find"]))
    pipeline_privileges(pipeline, req.db, out)
    if req.body.get("bypassDocumentValidation"):
        out = [(t, a + ["bypassDocumentValidation"]) if "insert" in a else (t, a) for t, a in out]
    return out


def rename_privileges(req: Request) -> Needed:
    src, dst = _full_ns(req.arg, req), _full_ns(req.body.get("to"), req)
    if src[0] == "ns" and dst[0] == "ns" and src[1] == dst[1]:
        return [(src, ["renameCollectionSameDB"]), (dst, ["renameCollectionSameDB"])]
    return [(src, ["find", "dropCollection"]),
            (dst, ["insert", "createIndex", "createCollection"])]


def list_collections_privileges(req: Request) -> Needed | str:
    if req.body.get("authorizedCollections") and req.body.get("nameOnly"):
        return AUTH_ONLY
    return [(("db", req.db), ["listCollections"])]


INTERNAL = on_cluster("internal")

# The rules above and below are what commands declare (``CommandFamily.handler(...,
# privileges=...)``): the command's own module says what it needs, as each server command's
# ``checkAuthForOperation`` does; nothing here lists commands.


def on_config_settings(action: str) -> Callable[[Request], Needed]:
    """``action`` on ``config.settings`` (the balancer commands: ``balancerStart``/``Stop``
    update it, ``balancerStatus`` finds, ``cluster_balancer_control_cmd.cpp``)."""
    return lambda req: [(("ns", "config", "settings"), [action])]


class Checked:
    """A command whose authorization is more than a privilege list (the user and role
    management commands, ``checkMetadataConsistency``): ``check(req, privileges, session)`` in
    :mod:`shardsim.core.auth.checks` raises Unauthorized (13) with mongod's message."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def checked(name: str) -> Checked:
    """The declaration of a command checked by :mod:`shardsim.core.auth.checks` under ``name``."""
    return Checked(name)


# explain needs what the explained command needs (resolved by :func:`required`).
EXPLAIN = "explain"


def required(spec_of: Callable[[str], Any], name: str, req: Request) -> Needed | str | Checked:
    """What ``req`` (canonical command ``name``) needs, from the command's own declaration
    (``spec_of(name).privileges``, the node's :meth:`CommandTable.spec`): :data:`NO_AUTH`,
    :data:`AUTH_ONLY`, a :class:`Checked` command, or a list of ``(target, actions)``. A command
    that declares nothing needs the ``internal`` cluster action, which only ``__system`` has
    (``tests/unit/test_auth.py`` checks that every registered command declares). ``explain``
    needs the explained command's privileges (explain_cmd.cpp; ``find`` on the namespace for a
    malformed or unknown one, which the command then refuses)."""
    rule = spec_of(name).privileges
    if rule is None:
        return INTERNAL(req)
    if rule == EXPLAIN:
        inner = req.body.get("explain")
        if not isinstance(inner, dict) or not inner:
            return []
        inner_name = next(iter(inner))
        inner_rule = spec_of(inner_name).privileges
        if inner_rule is None or isinstance(inner_rule, (str, Checked)) or inner_rule == EXPLAIN:
            return [(_coll_ns(req), ["find"])]
        return inner_rule(Request(inner_name, req.db, inner, req.conn))
    if isinstance(rule, (str, Checked)):
        return rule
    return rule(req)
