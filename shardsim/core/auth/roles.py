"""Built-in roles, privileges and resource matching, as mongod's authorization manager has them.

The built-in roles and their action sets follow ``src/mongo/db/auth/builtin_roles.yml`` (8.0;
the ``__system`` role is special-cased there: every action on every resource). Resource
matching follows ``ResourcePattern`` and ``buildResourceSearchList``
(``src/mongo/db/auth/authorization_session_impl.cpp``): a collection ``db.coll`` is matched by
the exact namespace, the database (normal collections only), the collection name in any
database, "any normal resource" (normal collections outside ``local`` and ``config``) and "any
resource"; a database by the database, any normal resource, any resource; the cluster by the
cluster and any resource.

Shapes used here:

* a *pattern* is a tuple: ``("exact", db, coll)``, ``("db", db)``, ``("coll", coll)``,
  ``("anyNormal",)``, ``("cluster",)``, ``("any",)``;
* a *target* (what a command needs) is ``("ns", db, coll)``, ``("db", db)``, ``("anyNormal",)``
  (a whole-cluster change stream) or ``("cluster",)``;
* privileges are ``dict[pattern, set[action]]``; the action ``"*"`` stands for every action
  (``__system``).
"""

from __future__ import annotations

from typing import Any, Iterable

from shardsim.core.errors import MongoError

Pattern = tuple
Privileges = dict[Pattern, set[str]]

READ = ("changeStream collStats dbHash dbStats find killCursors listCollections listIndexes "
        "listSearchIndexes planCacheRead").split()
READ_WRITE = READ + ("cleanupStructuredEncryptionData compactStructuredEncryptionData "
                     "convertToCapped createCollection createIndex createSearchIndexes "
                     "dropCollection dropIndex dropSearchIndex insert remove "
                     "renameCollectionSameDB update updateSearchIndex").split()
USER_ADMIN = ("changeCustomData changePassword createUser createRole dropUser dropRole grantRole "
              "revokeRole setAuthenticationRestriction viewUser viewRole").split()
DB_ADMIN = ("analyze bypassDocumentValidation collMod collStats compact convertToCapped "
            "createCollection dbStats dropCollection dropDatabase dropIndex dropSearchIndex "
            "createIndex createSearchIndexes enableProfiler listCollections listIndexes "
            "listSearchIndexes updateSearchIndex planCacheIndexFilter planCacheRead "
            "planCacheWrite reIndex renameCollectionSameDB storageDetails validate "
            "configureQueryAnalyzer").split()
CLUSTER_MONITOR = ("connPoolStats getCmdLineOpts getDefaultRWConcern getLog getParameter "
                   "getShardMap hostInfo listDatabases listSampledQueries listSessions listShards "
                   "netstat operationMetrics replSetGetConfig replSetGetStatus serverStatus top "
                   "useUUID inprog shardingState allCollectionStats "
                   "shardedDataDistribution").split()
CLUSTER_MONITOR_DB = "collStats dbStats getDatabaseVersion getShardVersion indexStats".split()
HOST_MANAGER = ("applicationMessage auditConfigure connPoolSync dropConnections logRotate oidReset "
                "setParameter shutdown touch unlock flushRouterConfig fsync invalidateUserCache "
                "killAnyCursor killAnySession killop replSetResizeOplog resync trafficRecord "
                "rotateCertificates").split()
CLUSTER_MANAGER = ("appendOplogNote applicationMessage replSetConfigure replSetGetConfig "
                   "replSetGetStatus replSetStateChange resync addShard removeShard listSessions "
                   "listShards flushRouterConfig cleanupOrphaned getDefaultRWConcern "
                   "setDefaultRWConcern setFeatureCompatibilityVersion setClusterParameter "
                   "getClusterParameter setChangeStreamState getChangeStreamState querySettings "
                   "checkMetadataConsistency").split()
CLUSTER_MANAGER_DB = ("analyzeShardKey configureQueryAnalyzer clearJumboFlag splitChunk moveChunk "
                      "moveCollection enableSharding splitVector refineCollectionShardKey "
                      "reshardCollection unshardCollection setAllowMigrations").split()

# name -> (adminOnly, [(inherited role, db or None = same db)],
#          [(matchType, db or None = the role's db, collection, actions)])
_DB, _EXACT, _ANY_NORMAL, _CLUSTER, _COLL, _ANY = "db", "exact", "anyNormal", "cluster", "coll", "any"
BUILTIN_ROLES: dict[str, tuple[bool, list[tuple[str, str | None]], list[tuple[Any, ...]]]] = {
    "read": (False, [], [(_DB, None, None, READ), (_EXACT, None, "system.js", READ)]),
    "readWrite": (False, [], [(_DB, None, None, READ_WRITE),
                              (_EXACT, None, "system.js", READ_WRITE)]),
    "userAdmin": (False, [], [(_DB, None, None, USER_ADMIN)]),
    "dbAdmin": (False, [], [(_DB, None, None, DB_ADMIN),
                            (_EXACT, None, "system.profile",
                             READ + ["convertToCapped", "createCollection", "dropCollection"])]),
    "dbOwner": (False, [("readWrite", None), ("dbAdmin", None), ("userAdmin", None)], []),
    "enableSharding": (False, [], [(_ANY_NORMAL, None, None,
                                    ["analyzeShardKey", "enableSharding", "moveCollection",
                                     "refineCollectionShardKey", "reshardCollection"])]),
    "readAnyDatabase": (True, [], [(_ANY_NORMAL, None, None, READ),
                                   (_CLUSTER, None, None, ["listDatabases"]),
                                   (_COLL, None, "system.js", READ)]),
    "readWriteAnyDatabase": (True, [("readAnyDatabase", None)],
                             [(_ANY_NORMAL, None, None, READ_WRITE),
                              (_COLL, None, "system.js", READ_WRITE)]),
    "userAdminAnyDatabase": (True, [], [
        (_ANY_NORMAL, None, None, USER_ADMIN + ["listCachedAndActiveUsers"]),
        (_DB, "local", None, USER_ADMIN), (_DB, "config", None, USER_ADMIN),
        (_CLUSTER, None, None, ["listDatabases", "authSchemaUpgrade", "invalidateUserCache",
                                "viewUser"]),
        (_EXACT, "admin", "system.users", READ + ["createIndex", "dropIndex"]),
        (_EXACT, "admin", "system.roles", READ + ["createIndex", "dropIndex"]),
        (_COLL, None, "system.users", READ)]),
    "dbAdminAnyDatabase": (True, [], [(_CLUSTER, None, None, ["listDatabases", "applyOps"]),
                                      (_ANY_NORMAL, None, None, DB_ADMIN)]),
    "clusterMonitor": (True, [("read", "config"), ("read", "local")], [
        (_CLUSTER, None, None, CLUSTER_MONITOR), (_ANY_NORMAL, None, None, CLUSTER_MONITOR_DB),
        (_DB, "config", None, CLUSTER_MONITOR_DB), (_DB, "local", None, CLUSTER_MONITOR_DB)]),
    "hostManager": (True, [], [(_CLUSTER, None, None, HOST_MANAGER),
                               (_ANY_NORMAL, None, None, ["killCursors"])]),
    "clusterManager": (True, [("read", "config")], [
        (_CLUSTER, None, None, CLUSTER_MANAGER), (_ANY_NORMAL, None, None, CLUSTER_MANAGER_DB),
        (_DB, "config", None, CLUSTER_MANAGER_DB + ["insert", "update", "remove"]),
        (_DB, "local", None, CLUSTER_MANAGER_DB + ["insert", "update", "remove"])]),
    "clusterAdmin": (True, [("clusterMonitor", None), ("hostManager", None),
                            ("clusterManager", None)],
                     [(_ANY_NORMAL, None, None, ["dropDatabase"]),
                      (_ANY, None, None, ["importCollection", "exportCollection"])]),
    "backup": (True, [], [(_ANY_NORMAL, None, None, ["find"]),
                          (_CLUSTER, None, None, ["getParameter", "listDatabases", "useUUID",
                                                  "appendOplogNote", "serverStatus"]),
                          (_DB, "config", None, ["find"]), (_DB, "local", None, ["find"])]),
    "restore": (True, [], [(_ANY_NORMAL, None, None,
                            ["bypassDocumentValidation", "collMod", "convertToCapped",
                             "createCollection", "createIndex", "dropCollection", "insert"]
                            + USER_ADMIN),
                           (_ANY, None, None, ["listCollections"])]),
    "directShardOperations": (True, [], [(_CLUSTER, None, None, ["issueDirectShardOperations"])]),
    "root": (True, [("clusterAdmin", None), ("userAdminAnyDatabase", None),
                    ("dbAdminAnyDatabase", None), ("readWriteAnyDatabase", None), ("backup", None),
                    ("restore", None), ("directShardOperations", None)],
             [(_ANY, None, None, ["validate"]),
              (_EXACT, "config", "system.preimages", ["find", "remove"])]),
    "__system": (True, [], [(_ANY, None, None, ["*"])]),
}


def is_builtin(role: str, db: str) -> bool:
    """True for a built-in role name in a database where it exists (admin-only roles in
    ``admin`` only)."""
    spec = BUILTIN_ROLES.get(role)
    return spec is not None and (not spec[0] or db == "admin")


def builtin_roles_of(db: str) -> list[str]:
    """The built-in role names that exist in ``db`` (rolesInfo ``showBuiltinRoles``)."""
    return sorted(r for r, spec in BUILTIN_ROLES.items() if (not spec[0] or db == "admin")
                  and not r.startswith("__"))


def _pattern(match: str, db: str | None, coll: str | None, role_db: str) -> Pattern:
    if match == _DB:
        return ("db", db or role_db)
    if match == _EXACT:
        return ("exact", db or role_db, coll)
    if match == _COLL:
        return ("coll", coll)
    return (match,)


def add_privilege(privs: Privileges, pattern: Pattern, actions: Iterable[str]) -> None:
    """Merge ``actions`` on ``pattern`` into ``privs``."""
    privs.setdefault(pattern, set()).update(actions)


def builtin_privileges(role: str, db: str, privs: Privileges,
                       inherited: list[tuple[str, str]]) -> None:
    """Add the privileges of built-in ``role@db`` (and its sub-roles) to ``privs``; the
    sub-roles go to ``inherited``."""
    admin_only, subroles, privileges = BUILTIN_ROLES[role]
    for match, pdb, coll, actions in privileges:
        add_privilege(privs, _pattern(match, pdb, coll, db), actions)
    for sub, sub_db in subroles:
        key = (sub, sub_db or db)
        if key not in inherited:
            inherited.append(key)
            builtin_privileges(sub, sub_db or db, privs, inherited)


def pattern_from_resource(resource: Any) -> Pattern:
    """A privilege document's ``resource`` -> pattern (``{db, collection}``, ``{cluster: true}``,
    ``{anyResource: true}``); BadValue (2) for anything else."""
    if not isinstance(resource, dict):
        raise MongoError(2, "resource must be an object")
    if resource.get("cluster") is True:
        return ("cluster",)
    if resource.get("anyResource") is True:
        return ("any",)
    db, coll = resource.get("db"), resource.get("collection")
    if not isinstance(db, str) or not isinstance(coll, str):
        raise MongoError(2, "resource pattern must contain 'db' and 'collection' fields")
    if db and coll:
        return ("exact", db, coll)
    if db:
        return ("db", db)
    if coll:
        return ("coll", coll)
    return ("anyNormal",)


def resource_from_pattern(pattern: Pattern) -> dict[str, Any]:
    """The inverse of :func:`pattern_from_resource` (showPrivileges output)."""
    kind = pattern[0]
    if kind == "cluster":
        return {"cluster": True}
    if kind == "any":
        return {"anyResource": True}
    if kind == "exact":
        return {"db": pattern[1], "collection": pattern[2]}
    if kind == "db":
        return {"db": pattern[1], "collection": ""}
    if kind == "coll":
        return {"db": "", "collection": pattern[1]}
    return {"db": "", "collection": ""}


def privilege_docs(privs: Privileges) -> list[dict[str, Any]]:
    """``[{resource, actions: [sorted]}]`` as usersInfo/rolesInfo/connectionStatus show them."""
    return [{"resource": resource_from_pattern(p), "actions": sorted(a)}
            for p, a in privs.items() if a]


def _is_normal(coll: str) -> bool:
    return not coll.startswith("system.")


def search_list(target: tuple) -> tuple[Pattern, ...]:
    """The patterns that grant privileges on ``target`` (``buildResourceSearchList``)."""
    kind = target[0]
    if kind == "cluster":
        return (("cluster",), ("any",))
    if kind == "anyNormal":
        return (("anyNormal",), ("any",))
    if kind == "db":
        db = target[1]
        if db in ("local", "config"):
            return (("db", db), ("any",))
        return (("db", db), ("anyNormal",), ("any",))
    db, coll = target[1], target[2]
    out: list[Pattern] = [("exact", db, coll), ("coll", coll)]
    if _is_normal(coll):
        out.append(("db", db))
        if db not in ("local", "config"):
            out.append(("anyNormal",))
    out.append(("any",))
    return tuple(out)


def authorized(privs: Privileges, target: tuple, actions: Iterable[str]) -> bool:
    """True when ``privs`` grant every action of ``actions`` on ``target``."""
    needed = set(actions)
    for pattern in search_list(target):
        have = privs.get(pattern)
        if have:
            if "*" in have:
                return True
            needed -= have
            if not needed:
                return True
    return not needed
