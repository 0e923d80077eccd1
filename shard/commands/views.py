"""View definitions: the documents of ``<db>.system.views`` that ``create``, ``collMod`` and
``drop`` write for a view (``create_collection.cpp`` _createView, ``views_for_database.cpp``
_upsertIntoCatalog/remove).

Like mongod, there is no oplog command entry for a view: creating a database's first view logs
``{create: "system.views"}``, then each view is an insert, update or delete on
``system.views``, which change streams turn into create/modify/drop events. Reads through a
view are in :func:`shard.commands.helpers.view_docs`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardsim.core.commands import Request, bson_type_name
from shardsim.core.errors import MongoError
from shardsim.shard.commands.helpers import ddl_context
from shardsim.shard.storage import VIEWS_COLL, Collection, validate_collection_name
from shardsim.shard.write_context import WriteContext

if TYPE_CHECKING:
    from shardsim.shard.node import ShardNode

# Options a view accepts besides viewOn/pipeline (create_collection.cpp refuses the others).
_VIEW_OPTIONS = frozenset({"viewOn", "pipeline", "collation"})


def _view_spec(cmd: str, options: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """Validate ``viewOn``/``pipeline`` of a create or collMod (IDL types, then
    ``CollectionOptions::parse``/``view_catalog_helpers`` rules); returns them. Errors:
    BadValue (2), TypeMismatch (14), OptionNotSupportedOnView (167)."""
    view_on = options.get("viewOn")
    if "viewOn" not in options:
        raise MongoError(2, "'pipeline' requires 'viewOn' to also be specified")
    if not isinstance(view_on, str):
        raise MongoError(14, f"BSON field '{cmd}.viewOn' is the wrong type "
                             f"'{bson_type_name(view_on)}', expected type 'string'")
    if not view_on:
        raise MongoError(2, "'viewOn' cannot be empty")
    pipeline = options.get("pipeline", [])
    if not isinstance(pipeline, list):
        raise MongoError(14, f"BSON field '{cmd}.pipeline' is the wrong type "
                             f"'{bson_type_name(pipeline)}', expected type 'array'")
    for stage in pipeline:
        if not isinstance(stage, dict):
            raise MongoError(14, f"BSON field '{cmd}.pipeline' is the wrong type, expected type "
                                 f"'array' of objects")
        name = next(iter(stage), "")
        if name in ("$out", "$merge", "$changeStream"):  # OptionNotSupportedOnView
            raise MongoError(167, f"{name} cannot be used in a view definition")
    return view_on, pipeline


def views_collection(node: ShardNode, db: str, ctx: WriteContext) -> Collection:
    """``<db>.system.views``, created (and logged) on first use."""
    storage = node.storage
    views = storage.get(db, VIEWS_COLL)
    if views is None:  # Database::createSystemDotViewsIfNecessary
        views = node.create_collection(db, VIEWS_COLL, ctx=ctx)
    return views


def check_no_cycle(node: ShardNode, db: str, name: str, view_on: str) -> None:
    """GraphContainsCycle (93) when ``name`` on ``view_on`` would close a cycle; 14 past the
    depth limit of 20 (``view_graph.cpp``)."""
    storage = node.storage
    chain = [f"{db}.{name}"]
    cur: str | None = view_on
    while cur is not None:
        chain.append(f"{db}.{cur}")
        if cur == name:
            raise MongoError(93, "View cycle detected: [ " + ", ".join(chain) + " ]")
        doc = storage.view_def(db, cur)
        cur = doc["viewOn"] if doc is not None else None
        if len(chain) > 21:
            raise MongoError(
                14, "View depth too deep or view cycle detected. Maximum depth is 20")


def create_view(node: ShardNode, req: Request, name: str,
                options: dict[str, Any]) -> dict[str, Any]:
    """``create: <view>, viewOn, pipeline[, collation]``: insert ``{_id: "<db>.<view>", viewOn,
    pipeline[, collation]}`` into ``system.views``; ``{}``. An identical view is a no-op.
    Errors: 72 (option not for views), 73 (``system.`` name), 14, 48 (namespace exists),
    93 (cycle), 13297 (database name differs in case), 167 (stage not allowed).
    """
    storage = node.storage
    ns = f"{req.db}.{name}"
    view_on, pipeline = _view_spec("create", options)
    for k in options:
        if k not in _VIEW_OPTIONS:
            cs = options[k]
            if k == "changeStreamPreAndPostImages" and not (isinstance(cs, dict)
                                                            and cs.get("enabled")):
                continue
            raise MongoError(72, f"option not supported on a view: {k}")
    if name.startswith("system."):
        raise MongoError(73, "View name cannot start with 'system.', which is reserved for "
                             "system namespaces")
    collation = options.get("collation")
    if collation is not None and not isinstance(collation, dict):
        raise MongoError(14, f"BSON field 'create.collation' is the wrong type "
                             f"'{bson_type_name(collation)}', expected type 'object'")
    if collation is not None and collation.get("locale") == "simple":
        collation = None  # the simple collation is stored as no collation
    if storage.get(req.db, name) is not None:
        raise MongoError(48, f"namespace '{ns}' already exists, but is a collection rather "
                             f"than a view")
    existing = storage.view_def(req.db, name)
    if existing is not None:  # checkExistingViewIsCompatible: identical = no-op
        if existing["viewOn"] != view_on:
            raise MongoError(48, f"namespace '{ns}' already exists, but is a view on "
                                 f"'{req.db}.{existing['viewOn']}' rather than "
                                 f"'{req.db}.{view_on}'")
        if existing.get("pipeline") != pipeline:
            raise MongoError(48, f"namespace '{ns}' already exists, but with pipeline "
                                 f"{existing.get('pipeline')} rather than {pipeline}")
        if existing.get("collation") != collation:
            raise MongoError(48, f"namespace '{ns}' already exists, but with collation: "
                                 f"{existing.get('collation') or {}} rather than "
                                 f"{collation or {}}")
        return {}
    check_no_cycle(node, req.db, name, view_on)
    validate_collection_name(req.db, view_on)
    if req.db not in storage.dbs:
        for other in storage.dbs:
            if other.lower() == req.db.lower():
                raise MongoError(13297, f"db already exists with different case already "
                                        f"have: [{other}] trying to create [{req.db}]")
    ctx = ddl_context(req)
    views = views_collection(node, req.db, ctx)
    doc: dict[str, Any] = {"_id": ns, "viewOn": view_on, "pipeline": pipeline}
    if collation:
        doc["collation"] = collation
    k = views.insert(doc)
    storage.note_doc(views, k, doc)
    node.log_op("i", views, doc, {"_id": ns}, ctx=ctx)
    return {}


def drop_view(node: ShardNode, db: str, name: str, ctx: WriteContext) -> None:
    """Remove the view ``db.name`` from ``system.views`` (nothing when there is none)."""
    storage = node.storage
    views = storage.get(db, VIEWS_COLL)
    ns = f"{db}.{name}"
    if views is None or ns not in views.docs:
        return
    views.delete(ns)
    storage.note_doc(views, ns, None)
    node.log_op("d", views, {"_id": ns}, ctx=ctx)


def mod_view(node: ShardNode, req: Request, name: str, changes: dict[str, Any]) -> dict[str, Any]:
    """collMod of a view: viewOn and/or pipeline, nothing else (coll_mod.cpp; 72 otherwise);
    logged as a replacement of the system.views document (the change stream's ``modify``)."""
    storage = node.storage
    for k in changes:
        if k not in ("viewOn", "pipeline"):
            raise MongoError(72, f"option not supported on a view: {k}")
    views = storage.get(req.db, VIEWS_COLL)
    assert views is not None
    ns = f"{req.db}.{name}"
    old = views.docs[ns]
    # Without auth either field may be omitted and keeps its current value.
    view_on, pipeline = _view_spec("collMod", {"viewOn": old["viewOn"],
                                               "pipeline": old.get("pipeline", []), **changes})
    check_no_cycle(node, req.db, name, view_on)
    doc: dict[str, Any] = {"_id": ns, "viewOn": view_on, "pipeline": pipeline}
    if old.get("collation"):
        doc["collation"] = old["collation"]
    views.replace(ns, doc)
    storage.note_doc(views, ns, doc)
    node.log_op("u", views, doc, {"_id": ns}, ctx=ddl_context(req), pre_image=old)
    return {}
