"""The user's stages after ``$changeStream``, compiled once per stream.

Allowed stages (``DocumentSourceChangeStream::checkValidUserStage``): ``$match``, ``$project``,
``$addFields``/``$set``, ``$unset``, ``$replaceRoot``/``$replaceWith``, ``$redact`` and
``$changeStreamSplitLargeEvent`` (last). Each is a function ``event dict -> event dict | None``;
:class:`UserStages` runs them as one stage of the pipeline.
Matching and expression evaluation use the project's mongomock-based query layer
(:mod:`shard.query`); ``$redact`` is evaluated here on top of mongomock's expression parser.
After the stages the event's ``_id`` must still be the resume token
(``PlanExecutorPipeline::_validateChangeStreamsResumeToken``): else ChangeStreamFatalError (280).
"""

from __future__ import annotations

from typing import Any, Callable

import mongomock.aggregate as mm
from bson.decimal128 import Decimal128
from mongomock.aggregate import _Parser  # expression evaluator

from shardsim.core.commands import bson_type_name
from shardsim.core.errors import MongoError
from shardsim.core import query as q

StageFn = Callable[[dict[str, Any]], "dict[str, Any] | None"]

_SAMPLE_EVENT: dict[str, Any] = {"_id": {"_data": "00"}, "operationType": "insert",
                                 "ns": {"db": "d", "coll": "c"}, "documentKey": {"_id": 0},
                                 "fullDocument": {"_id": 0}}


def _pipeline_stage(stage: dict[str, Any]) -> StageFn:

    def run(doc: dict[str, Any]) -> dict[str, Any] | None:
        out = q.run_pipeline([doc], [stage], None)
        return out[0] if out else None
    return run


def compile_match(arg: Any) -> StageFn:
    """``$match``: keep events that satisfy the query."""
    if not isinstance(arg, dict):
        raise MongoError(15959, "the match filter must be an expression in an object")
    q.matches(arg, dict(_SAMPLE_EVENT))  # surfaces unknown operators at open time

    def run(doc: dict[str, Any]) -> dict[str, Any] | None:
        return doc if q.matches(arg, doc) else None
    return run


def compile_redact(arg: Any) -> StageFn:
    """``$redact``: ``$$DESCEND``/``$$PRUNE``/``$$KEEP`` evaluated per (sub)document."""

    def mark(expr: Any) -> Any:
        # mongomock knows no $$KEEP/$$PRUNE/$$DESCEND: evaluate them as literals.
        if isinstance(expr, str) and expr in _REDACT_VARS:
            return {"$literal": expr}
        if isinstance(expr, dict):
            return {k: mark(v) for k, v in expr.items()}
        if isinstance(expr, list):
            return [mark(v) for v in expr]
        return expr

    marked = mark(arg)

    def decide(doc: dict[str, Any]) -> Any:
        if isinstance(marked, dict) and set(marked) == {"$literal"}:
            return marked["$literal"]
        try:
            return _Parser(doc).parse(marked)
        except Exception as exc:
            raise MongoError(17053, f"$redact's expression should not return anything aside from the "
                                    f"variables $$KEEP, $$DESCEND, and $$PRUNE, but returned {exc}") from None

    def redact(doc: dict[str, Any]) -> dict[str, Any] | None:
        result = decide(doc)
        if result == "$$KEEP" or result == "KEEP":
            return doc
        if result == "$$PRUNE" or result == "PRUNE":
            return None
        if result in ("$$DESCEND", "DESCEND"):
            out: dict[str, Any] = {}
            for k, v in doc.items():
                if isinstance(v, dict):
                    sub = redact(v)
                    if sub is not None:
                        out[k] = sub
                elif isinstance(v, list):
                    out[k] = [x for x in ((redact(i) if isinstance(i, dict) else i) for i in v)
                              if x is not None]
                else:
                    out[k] = v
            return out
        raise MongoError(17053, "$redact's expression should not return anything aside from the "
                                f"variables $$KEEP, $$DESCEND, and $$PRUNE, but returned {result!r}")
    return redact


def compile_stage(name: str, arg: Any) -> StageFn | None:
    """A function for one stage; None for ``$changeStreamSplitLargeEvent`` (handled by the cursor).

    ``$project``, ``$unset`` and ``$addFields``/``$set`` are parsed and applied by
    :class:`Projection` (MongoDB's rules); ``$replaceRoot``/``$replaceWith`` run on mongomock."""
    if name == "$match":
        return compile_match(arg)
    if name == "$redact":
        return compile_redact(arg)
    if name == "$changeStreamSplitLargeEvent":
        return None
    if name == "$project":
        if not isinstance(arg, dict):
            raise MongoError(15969, "$project specification must be an object")
        return Projection(arg, "$project").apply
    if name == "$unset":
        fields = [arg] if isinstance(arg, str) else arg
        if not isinstance(fields, list):
            raise MongoError(31002, "$unset specification must be a string or an array")
        if not fields:
            raise MongoError(31119, "$unset specification must be a string or an array with at least "
                                    "one field")
        if not all(isinstance(f, str) for f in fields):
            raise MongoError(31120, "$unset specification must be a string or an array containing "
                                    "only string values")
        return Projection({f: 0 for f in fields}, "$unset").apply
    if name in ("$addFields", "$set"):
        if not isinstance(arg, dict):
            raise MongoError(40272, f"{name} specification stage must be an object, got "
                                    f"{bson_type_name(arg)}")
        return Projection(arg, name, add_fields=True).apply
    fn = _pipeline_stage({name: arg})
    if name in ("$replaceRoot", "$replaceWith"):
        # Parsed, not evaluated: the new root may name a field the sample event lacks (e.g.
        # Debezium re-roots to "$event" after wrapping the event under "event"); a value
        # that is not a document fails per event, as on the server.
        new_root = arg.get("newRoot") if name == "$replaceRoot" and isinstance(arg, dict) \
            else arg
        if name == "$replaceRoot" and (not isinstance(arg, dict) or "newRoot" not in arg):
            raise MongoError(40231, "no newRoot specified for the $replaceRoot stage")
        _check_operand(new_root)
        return fn
    fn(dict(_SAMPLE_EVENT))  # validate the specification now, like the server's parse
    return fn


# -- $project / $unset / $addFields ------------------------------------------------------------
# Parsing follows src/mongo/db/query/projection_parser.cpp (parseAndAnalyze: inclusion,
# exclusion, literals, sub-objects, path collisions, _id defaults); applying follows
# src/mongo/db/exec/projection_node.cpp and inclusion/exclusion_projection_executor.cpp
# (input field order kept, computed fields set afterwards in spec order, arrays on a dotted path
# handled element by element, a non-document met by a computed sub-path replaced by a document).

_INCLUSION, _EXCLUSION, _ADDITION = "inclusion", "exclusion", "addition"


class _Expr:
    """A computed value: an expression object or a literal operand (``"$path"``, constant)."""

    __slots__ = ("expr",)

    def __init__(self, expr: Any) -> None:
        self.expr = expr


class _PathNode:
    """An inner node of the projection tree: field name -> True/False (include/exclude),
    :class:`_Expr` or another :class:`_PathNode`, in the order they were added."""

    __slots__ = ("fields",)

    def __init__(self) -> None:
        self.fields: dict[str, Any] = {}

    def computed(self) -> bool:
        return any(isinstance(v, _Expr) or (isinstance(v, _PathNode) and v.computed())
                   for v in self.fields.values())


def _field_path(path: str) -> list[str]:
    """Split a field path, with FieldPath's errors (field_path.cpp)."""
    if path == "":
        raise MongoError(40352, "FieldPath cannot be constructed with empty string")
    parts = path.split(".")
    for part in parts:
        if part == "":
            raise MongoError(15998, "FieldPath field names may not be empty strings.")
        if part.startswith("$"):
            raise MongoError(16410, "FieldPath field names may not start with '$'. Consider using "
                                    "$getField or $setField.")
        if "\0" in part:
            raise MongoError(16411, "FieldPath field names may not contain '\0'.")
    return parts


def _add_node_at_path(parent: _PathNode, path: str, child: Any) -> None:
    """Place ``child`` at the dotted ``path`` below ``parent`` (31250/31249 on a collision)."""
    parts = _field_path(path)
    node = parent
    for i, part in enumerate(parts):
        existing = node.fields.get(part)
        if i == len(parts) - 1:
            if existing is not None:
                raise MongoError(31250, f"Path collision at {path}")
            node.fields[part] = child
            return
        if existing is None:
            existing = node.fields[part] = _PathNode()
        elif not isinstance(existing, _PathNode):
            raise MongoError(31249, f"Path collision at {path} remaining portion {'.'.join(parts[1:])}")
        node = existing


def _inner_node(parent: _PathNode, path: str) -> _PathNode:
    """The inner node at ``path`` below ``parent``, created when missing."""
    parts = _field_path(path)
    node: Any = parent
    for part in parts:
        node = node.fields.get(part) if isinstance(node, _PathNode) else None
        if node is None:
            break
    if isinstance(node, _PathNode):
        return node
    fresh = _PathNode()
    _add_node_at_path(parent, path, fresh)
    return fresh


def _render(v: Any) -> str:
    if isinstance(v, str):
        return '"' + v + '"'
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k}: {_render(x)}" for k, x in v.items()) + " }" if v else "{}"
    if isinstance(v, list):
        return "[ " + ", ".join(_render(x) for x in v) + " ]" if v else "[]"
    return str(v)


class Projection:
    """A parsed ``$project`` / ``$unset`` / ``$addFields`` (``add_fields=True``) applied to one
    event at a time.

    Raises MongoError at construction like mongod's parse, with the stage's context
    ("Invalid $project :: caused by :: ..."): 51272 empty ``$project``, 51270 empty
    sub-projection, 31253/31254 inclusion and exclusion mixed, 31310/31252 a computed field in an
    exclusion projection, 31250/31249 path collisions, 31324/31394 positional paths, 31325 an
    unknown ``$``-operator, 15998/16410/40352 bad field paths.
    """

    def __init__(self, spec: dict[str, Any], stage: str, *, add_fields: bool = False) -> None:
        self.stage = stage
        self.root = _PathNode()
        self.kind: str | None = _ADDITION if add_fields else None
        self.has_meta = False
        try:
            self._parse(spec)
        except MongoError as exc:
            raise MongoError(exc.code, f"Invalid {stage} :: caused by :: {exc.errmsg}") from None
        self.has_computed = self.root.computed()

    # -- parse ---------------------------------------------------------------------------------
    def _parse(self, spec: dict[str, Any]) -> None:
        if self.kind != _ADDITION and not spec:
            raise MongoError(51272, "projection specification must have at least one field")
        id_specified = id_included = False
        for key, value in spec.items():
            if key == "_id" or key.startswith("_id."):
                id_specified = True
            if key == "_id" and self.kind != _ADDITION and \
                    isinstance(value, (bool, int, float, Decimal128)):
                id_included = _truthy(value)
            self._element(key, value, self.root, top=True)
        if self.kind is None:  # computeProjectionType: only $meta and/or _id mentioned
            self.kind = _INCLUSION if self.has_meta or id_included else _EXCLUSION
        if not id_specified and self.kind == _INCLUSION:
            _add_node_at_path(self.root, "_id", True)
        if self.kind == _EXCLUSION and self.root.fields.get("_id") is True:
            del self.root.fields["_id"]  # {_id: 1} in an exclusion projection is a no-op

    def _element(self, key: str, value: Any, parent: _PathNode, top: bool = False) -> None:
        if key.endswith(".$") or key == "$":
            raise MongoError(31324, "Cannot use positional projection in aggregation projection")
        if ".$." in key:
            raise MongoError(31394, "As of 4.4, it's illegal to specify positional operator in the "
                                    "middle of a path.Positional projection may only be used at the "
                                    "end, for example: a.b.$. If the query previously used a form "
                                    "like a.b.$.d, remove the parts following the '$' and the "
                                    "results will be equivalent.")
        if isinstance(value, dict):
            if self.kind == _ADDITION and not value:
                self._literal(key, value, parent)
            else:
                self._sub_object(key, value, parent)
        elif self.kind != _ADDITION and isinstance(value, (bool, int, float, Decimal128)):
            if _truthy(value):
                _add_node_at_path(parent, key, True)
                if not (top and key == "_id"):
                    if self.kind == _EXCLUSION:
                        raise MongoError(31253, f"Cannot do inclusion on field {key} in exclusion "
                                                f"projection")
                    self.kind = _INCLUSION
            else:
                _add_node_at_path(parent, key, False)
                if not (top and key == "_id"):
                    if self.kind == _INCLUSION:
                        raise MongoError(31254, f"Cannot do exclusion on field {key} in inclusion "
                                                f"projection")
                    self.kind = _EXCLUSION
        else:
            self._literal(key, value, parent)

    def _literal(self, key: str, value: Any, parent: _PathNode) -> None:
        _check_operand(value)
        _add_node_at_path(parent, key, _Expr({"$literal": value} if isinstance(value, dict) else value))
        if self.kind != _ADDITION:
            if self.kind == _EXCLUSION:
                raise MongoError(31310, f"Cannot use an expression {key}: {_render(value)} in an "
                                        f"exclusion projection")
            self.kind = _INCLUSION

    def _sub_object(self, key: str, obj: dict[str, Any], parent: _PathNode) -> None:
        if not obj:
            raise MongoError(51270, f"Invalid empty sub-projection: {key}")
        first = next(iter(obj))
        if len(obj) == 1 and first.startswith("$"):
            if first not in _EXPRESSIONS:
                raise MongoError(31325, f"Unknown expression {first}")
            _check_operand(obj)
            is_meta = first == "$meta"
            if self.kind == _EXCLUSION and not is_meta:
                raise MongoError(31252, "Cannot use expression other than $meta in exclusion projection")
            _add_node_at_path(parent, key, _Expr(obj))
            if is_meta:
                self.has_meta = True
            elif self.kind is None:
                self.kind = _INCLUSION
            return
        node = _inner_node(parent, key)
        for k, v in obj.items():
            self._element(k, v, node)

    # -- apply ---------------------------------------------------------------------------------
    def apply(self, doc: dict[str, Any]) -> dict[str, Any]:
        """The projected event (a new dict; ``doc`` is not modified)."""
        if self.kind == _EXCLUSION:
            return _exclude_fields(self.root, doc)
        out = _include_fields(self.root, doc) if self.kind == _INCLUSION else dict(doc)
        if self.has_computed:
            _apply_expressions(self.root, doc, out)
        return out


def _truthy(v: Any) -> bool:
    if isinstance(v, Decimal128):
        return v.to_decimal() != 0
    return bool(v)


def _include_fields(node: _PathNode, doc: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    fields = node.fields
    for k, v in doc.items():
        spec = fields.get(k)
        if spec is True:
            out[k] = v
        elif isinstance(spec, _PathNode):
            r = _include_value(spec, v)
            if r is not _MISSING:
                out[k] = r
    return out


def _include_value(node: _PathNode, v: Any) -> Any:
    if isinstance(v, dict):
        return _include_fields(node, v)
    if isinstance(v, list):
        return [r for r in (_include_value(node, x) for x in v) if r is not _MISSING]
    return _MISSING  # a scalar where the projection expects a document is left out


def _exclude_fields(node: _PathNode, doc: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    fields = node.fields
    for k, v in doc.items():
        spec = fields.get(k)
        if spec is False:
            continue
        out[k] = _exclude_value(spec, v) if isinstance(spec, _PathNode) else v
    return out


def _exclude_value(node: _PathNode, v: Any) -> Any:
    if isinstance(v, dict):
        return _exclude_fields(node, v)
    if isinstance(v, list):
        return [_exclude_value(node, x) for x in v]
    return v


def _apply_expressions(node: _PathNode, root: dict[str, Any], out: dict[str, Any]) -> None:
    for k, spec in node.fields.items():
        if isinstance(spec, _Expr):
            value = evaluate(spec.expr, root)
            if value is _MISSING:
                out.pop(k, None)
            else:
                out[k] = value
        elif isinstance(spec, _PathNode) and spec.computed():
            out[k] = _expressions_on_value(spec, root, out.get(k, _MISSING))


def _expressions_on_value(node: _PathNode, root: dict[str, Any], v: Any) -> Any:
    if isinstance(v, dict):
        d = dict(v)
        _apply_expressions(node, root, d)
        return d
    if isinstance(v, list):
        return [_expressions_on_value(node, root, x) for x in v]
    d = {}  # {"a.b": <expr>} on {a: 1} gives {a: {b: ...}}
    _apply_expressions(node, root, d)
    return d


def _get_path(value: Any, parts: list[str]) -> Any:
    """``$a.b`` on ``value``: arrays on the way map over their elements (missing ones dropped)."""
    for i, part in enumerate(parts):
        if isinstance(value, dict):
            value = value.get(part, _MISSING)
            if value is _MISSING:
                return _MISSING
        elif isinstance(value, list):
            rest = parts[i:]
            out = []
            for x in value:
                r = _get_path(x, rest) if isinstance(x, (dict, list)) else _MISSING
                if r is not _MISSING:
                    out.append(r)
            return out
        else:
            return _MISSING
    return value


def evaluate(expr: Any, root: dict[str, Any]) -> Any:
    """Evaluate an aggregation operand against ``root`` (the event); ``_MISSING`` for a missing
    field path or ``$$REMOVE``. Operators run on mongomock's expression parser."""
    if isinstance(expr, str):
        if expr.startswith("$$"):
            name, _, rest = expr[2:].partition(".")
            if name == "REMOVE":
                return _MISSING
            if name in ("ROOT", "CURRENT"):
                return _get_path(root, rest.split(".")) if rest else root
        elif expr.startswith("$"):
            return _get_path(root, expr[1:].split("."))
        else:
            return expr
    elif isinstance(expr, list):
        return [None if r is _MISSING else r for r in (evaluate(x, root) for x in expr)]
    elif isinstance(expr, dict):
        if not expr:
            return {}
        first = next(iter(expr))
        if first == "$literal":
            return expr[first]
        if not first.startswith("$"):
            out = {}
            for k, v in expr.items():
                r = evaluate(v, root)
                if r is not _MISSING:
                    out[k] = r
            return out
    else:
        return expr
    try:
        return _Parser(root).parse(expr)
    except KeyError:
        return None  # an operator over a missing field: null, as most server operators give
    except MongoError:
        raise
    except NotImplementedError as exc:
        raise MongoError(238, str(exc).split(".")[0]) from None
    except Exception as exc:
        raise q.translate_error(exc) from None


def _check_operand(value: Any) -> None:
    """Unknown ``$``-operators inside an operand are errors at parse time (31325-style 168)."""
    if isinstance(value, list):
        for x in value:
            _check_operand(x)
    elif isinstance(value, dict):
        for k, v in value.items():
            if k == "$literal":
                continue
            if k.startswith("$") and k not in _EXPRESSIONS:
                raise MongoError(168, f"Unrecognized expression '{k}'")
            _check_operand(v)


def _known_expressions() -> frozenset[str]:
    names: set[str] = set()
    for attr in dir(mm):
        if attr.endswith("_operators"):
            val = getattr(mm, attr)
            if isinstance(val, (list, tuple, set, frozenset, dict)):
                names.update(n for n in val if isinstance(n, str))
    # Server expressions mongomock lacks: accepted here, "not supported" if ever evaluated.
    names.update(_SERVER_ONLY_EXPRESSIONS)
    return frozenset(names)


_SERVER_ONLY_EXPRESSIONS = (
    "$getField", "$setField", "$unsetField", "$toBool", "$toDate", "$toDouble", "$toObjectId",
    "$type", "$binarySize", "$bsonSize", "$replaceOne", "$replaceAll", "$ltrim", "$rtrim",
    "$regexFind", "$regexFindAll", "$dateAdd", "$dateSubtract", "$dateDiff", "$dateTrunc",
    "$dateToParts", "$firstN", "$lastN", "$maxN", "$minN", "$sortArray", "$tsSecond",
    "$tsIncrement", "$rand", "$round", "$sin", "$cos", "$tan", "$median", "$percentile",
)


def compile_stages(stages: list[tuple[str, Any]]) -> list[StageFn]:
    """Compile the user's stages in order (split stage excluded)."""
    out = []
    for name, arg in stages:
        fn = compile_stage(name, arg)
        if fn is not None:
            out.append(fn)
    return out


class UserStages:
    """The user's stages after ``$changeStream`` as one stage of the shard pipeline
    (:mod:`.pipeline`), ``$changeStreamSplitLargeEvent`` excluded (:mod:`.split_large_event`).

    ``stages``: ``StreamSpec.user_stages``, ``[(name, argument), ...]``; compiling them raises
    the server's parse errors (e.g. 15969, 31002, 40272, or mongomock's for ``$match``).
    ``process(ev)`` runs them in order on ``ev.doc`` and returns ``ev`` with the resulting
    document, or None when one of them filtered the event out. Raises ChangeStreamFatalError
    (280) when they removed or changed ``_id`` (``PlanExecutorPipeline``).
    """

    __slots__ = ("name", "fns")

    def __init__(self, stages: list[tuple[str, Any]]) -> None:
        self.name = ", ".join(n for n, _ in stages if n != "$changeStreamSplitLargeEvent")
        self.fns = tuple(compile_stages(stages))

    def process(self, ev: Any) -> Any:
        """``ev`` with its document through the user's stages, or None if filtered out."""
        doc = ev.doc
        for fn in self.fns:
            doc = fn(doc)
            if doc is None:
                return None
        token = ev.token
        if doc.get("_id", _MISSING) != token:
            check_id_unchanged(doc, token)  # raises, naming what it found
        ev.doc = doc
        return ev


def _token_repr(v: Any) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f'{k}: "{x}"' if isinstance(x, str) else f"{k}: {x!r}"
                               for k, x in v.items()) + "}"
    return repr(v)


def check_id_unchanged(doc: dict[str, Any], token: dict[str, Any]) -> None:
    """ChangeStreamFatalError (280) if the stages removed or changed ``_id``."""
    found = doc.get("_id", _MISSING)
    if found is _MISSING or found != token:
        shown = "missing" if found is _MISSING else _token_repr(found)
        raise MongoError(280, "Encountered an event whose _id field, which contains the resume token, "
                              "was modified by the pipeline. Modifying the _id field of an event makes "
                              "it impossible to resume the stream from that point. Only transformations "
                              "that retain the unmodified _id field are allowed. Expected: "
                              f"{_token_repr(token)} but found: {shown}")


_MISSING = object()
_REDACT_VARS = ("$$KEEP", "$$PRUNE", "$$DESCEND")
_EXPRESSIONS = _known_expressions()
