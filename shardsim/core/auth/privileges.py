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
Every command a role registers must be in :data:`TABLE` (tests/unit/test_auth.py checks it).
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


def _on_coll(*actions: str) -> Callable[[Request], Needed]:
    return lambda req: [(_coll_ns(req), list(actions))]


def _on_db(*actions: str) -> Callable[[Request], Needed]:
    return lambda req: [(("db", req.db), list(actions))]


def _on_cluster(*actions: str) -> Callable[[Request], Needed]:
    return lambda req: [(("cluster",), list(actions))]


def _on_full_ns(*actions: str) -> Callable[[Request], Needed]:
    return lambda req: [(_full_ns(req.arg, req), list(actions))]


def _with_bypass(req: Request, actions: list[str]) -> list[str]:
    if req.body.get("bypassDocumentValidation"):
        actions = actions + ["bypassDocumentValidation"]
    return actions


def _update(req: Request) -> Needed:
    actions = ["update"]
    if any(isinstance(u, dict) and u.get("upsert") for u in req.body.get("updates") or []):
        actions.append("insert")
    return [(_coll_ns(req), _with_bypass(req, actions))]


def _insert(req: Request) -> Needed:
    return [(_coll_ns(req), _with_bypass(req, ["insert"]))]


def _bulk_write(req: Request) -> Needed:
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


def _find_and_modify(req: Request) -> Needed:
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


def _aggregate(req: Request) -> Needed:
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


def _rename(req: Request) -> Needed:
    src, dst = _full_ns(req.arg, req), _full_ns(req.body.get("to"), req)
    if src[0] == "ns" and dst[0] == "ns" and src[1] == dst[1]:
        return [(src, ["renameCollectionSameDB"]), (dst, ["renameCollectionSameDB"])]
    return [(src, ["find", "dropCollection"]),
            (dst, ["insert", "createIndex", "createCollection"])]


def _list_collections(req: Request) -> Needed | str:
    if req.body.get("authorizedCollections") and req.body.get("nameOnly"):
        return AUTH_ONLY
    return [(("db", req.db), ["listCollections"])]


INTERNAL = _on_cluster("internal")

TABLE: dict[str, Any] = {
    # no authentication needed (requiresAuth() == false)
    **{n: NO_AUTH for n in ("hello", "isMaster", "buildInfo", "ping", "saslStart",
                            "saslContinue", "authenticate", "logout", "connectionStatus")},
    # mongos' replSetGetStatus only says it is not supported, to anyone
    # (cluster_repl_set_get_status_cmd.cpp checkAuthForCommand: OK); no shardsim mongod has it
    "replSetGetStatus": NO_AUTH,
    # any authenticated user
    **{n: AUTH_ONLY for n in ("getMore", "killCursors", "startSession", "endSessions",
                              "refreshSessions", "killSessions", "commitTransaction",
                              "abortTransaction", "listCommands", "whatsmyuri", "isdbgrid",
                              "listDatabases")},
    # fail_point_cmd.cpp: requiresAuth() false and no privilege ("it only works when enabled
    # via command line"): the command exists only with enableTestCommands=1, off by default
    "configureFailPoint": NO_AUTH,
    "killAllSessions": _on_cluster("killAnySession"),
    # two-phase commit between router and shards (txn_two_phase_commit_cmds.cpp: internal)
    "prepareTransaction": INTERNAL, "coordinateCommitTransaction": INTERNAL,
    # reads
    "find": _on_coll("find"), "count": _on_coll("find"), "distinct": _on_coll("find"),
    "aggregate": _aggregate, "listIndexes": _on_coll("listIndexes"),
    "listCollections": _list_collections, "collStats": _on_coll("collStats"),
    "dataSize": _on_full_ns("find"), "dbStats": _on_db("dbStats"),
    "validate": _on_coll("validate"),
    # writes
    "insert": _insert, "update": _update, "delete": _on_coll("remove"),
    "findAndModify": _find_and_modify, "bulkWrite": _bulk_write,
    # DDL
    "create": _on_coll("createCollection"), "drop": _on_coll("dropCollection"),
    "dropDatabase": _on_db("dropDatabase"), "createIndexes": _on_coll("createIndex"),
    "dropIndexes": _on_coll("dropIndex"), "collMod": _on_coll("collMod"),
    "renameCollection": _rename,
    # search_index_commands.cpp: the action named like the command, on the collection
    "createSearchIndexes": _on_coll("createSearchIndexes"),
    "updateSearchIndex": _on_coll("updateSearchIndex"),
    "dropSearchIndex": _on_coll("dropSearchIndex"),
    # cluster_check_metadata_consistency_cmd.cpp: the cluster, or the db / ns (checks.py)
    "checkMetadataConsistency": AUTH_ONLY,
    # sharding
    "addShard": _on_cluster("addShard"), "removeShard": _on_cluster("removeShard"),
    "listShards": _on_cluster("listShards"), "enableSharding": _on_full_ns("enableSharding"),
    "shardCollection": _on_full_ns("enableSharding"), "split": _on_full_ns("splitChunk"),
    "moveChunk": _on_full_ns("moveChunk"), "movePrimary": _on_full_ns("moveChunk"),
    "flushRouterConfig": _on_cluster("flushRouterConfig"),
    "balancerStart": lambda req: [(("ns", "config", "settings"), ["update"])],
    "balancerStop": lambda req: [(("ns", "config", "settings"), ["update"])],
    "balancerStatus": lambda req: [(("ns", "config", "settings"), ["find"])],
    "balancerCollectionStatus": _on_full_ns("enableSharding"),
    # the 8.0 sharding DDL (cluster_*_cmd.cpp' checkAuthForOperation)
    "reshardCollection": _on_full_ns("reshardCollection"),
    "moveCollection": _on_full_ns("moveCollection"),
    "unshardCollection": _on_full_ns("unshardCollection"),
    "refineCollectionShardKey": _on_full_ns("refineCollectionShardKey"),
    "mergeChunks": _on_full_ns("splitChunk"),
    "setAllowMigrations": _on_full_ns("setAllowMigrations"),
    # auto_split_vector_command.cpp: splitVector on the namespace
    "autoSplitVector": _on_coll("splitVector"),
    # split_vector.cpp: splitVector on the namespace its argument names
    "splitVector": _on_full_ns("splitVector"),
    # server administration
    "serverStatus": _on_cluster("serverStatus"), "getParameter": _on_cluster("getParameter"),
    "setParameter": _on_cluster("setParameter"), "getCmdLineOpts": _on_cluster("getCmdLineOpts"),
    "getLog": _on_cluster("getLog"), "hostInfo": _on_cluster("hostInfo"),
    # resize_oplog.cpp: the replSetResizeOplog action on the cluster resource
    "replSetResizeOplog": _on_cluster("replSetResizeOplog"),
    # users and roles: any authenticated user here; the precise rules of each
    # (user_management_commands_common.cpp) are shardsim.core.auth.checks.CHECKS
    **{n: AUTH_ONLY for n in ("createUser", "updateUser", "dropUser", "dropAllUsersFromDatabase",
                              "usersInfo", "createRole", "updateRole", "dropRole",
                              "dropAllRolesFromDatabase", "grantRolesToUser",
                              "revokeRolesFromUser", "grantRolesToRole", "revokeRolesFromRole",
                              "grantPrivilegesToRole", "revokePrivilegesFromRole", "rolesInfo")},
    "invalidateUserCache": _on_cluster("invalidateUserCache"),
}


def _explain(req: Request) -> Needed:
    """explain_cmd.cpp: the explained command's privileges (none checked here for a
    malformed request, which the command refuses)."""
    inner = req.body.get("explain")
    if not isinstance(inner, dict) or not inner:
        return []
    name = next(iter(inner))
    entry = TABLE.get(name)
    if entry is None or isinstance(entry, str) or name == "explain":
        return [(_coll_ns(req), ["find"])]
    return entry(Request(name, req.db, inner, req.conn))


TABLE["explain"] = _explain


def required(name: str, req: Request) -> Needed | str:
    """What ``req`` (canonical command ``name``) needs: NO_AUTH, AUTH_ONLY or a list of
    ``(target, actions)``. Internal commands (``_configsvr*``, ``_shardsim*``) and any command
    missing from the table need the ``internal`` cluster action, which only ``__system`` has."""
    entry = TABLE.get(name)
    if entry is None:
        return INTERNAL(req)
    if isinstance(entry, str):
        return entry
    return entry(req)
