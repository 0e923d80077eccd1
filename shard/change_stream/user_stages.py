"""The user's stages after ``$changeStream``, compiled once per stream.

Allowed stages (``DocumentSourceChangeStream::checkValidUserStage``): ``$match``, ``$project``,
``$addFields``/``$set``, ``$unset``, ``$replaceRoot``/``$replaceWith``, ``$redact`` and
``$changeStreamSplitLargeEvent`` (last). Each is a function ``event dict -> event dict | None``.
Matching and expression evaluation use the project's mongomock-based query layer
(:mod:`shard.query`); ``$redact`` is evaluated here on top of mongomock's expression parser.
After the stages the event's ``_id`` must still be the resume token
(``PlanExecutorPipeline::_validateChangeStreamsResumeToken``): else ChangeStreamFatalError (280).
"""

from __future__ import annotations

from typing import Any, Callable

from shardsim.errors import MongoError

StageFn = Callable[[dict[str, Any]], "dict[str, Any] | None"]

_SAMPLE_EVENT: dict[str, Any] = {"_id": {"_data": "00"}, "operationType": "insert",
                                 "ns": {"db": "d", "coll": "c"}, "documentKey": {"_id": 0},
                                 "fullDocument": {"_id": 0}}


def _pipeline_stage(stage: dict[str, Any]) -> StageFn:
    from shard import query as q

    def run(doc: dict[str, Any]) -> dict[str, Any] | None:
        out = q.run_pipeline([doc], [stage], None)
        return out[0] if out else None
    return run


def compile_match(arg: Any) -> StageFn:
    """``$match``: keep events that satisfy the query."""
    if not isinstance(arg, dict):
        raise MongoError(15959, "the match filter must be an expression in an object")
    from shard import query as q
    q.matches(arg, dict(_SAMPLE_EVENT))  # surfaces unknown operators at open time

    def run(doc: dict[str, Any]) -> dict[str, Any] | None:
        return doc if q.matches(arg, doc) else None
    return run


def compile_redact(arg: Any) -> StageFn:
    """``$redact``: ``$$DESCEND``/``$$PRUNE``/``$$KEEP`` evaluated per (sub)document."""
    from mongomock.aggregate import _Parser  # expression evaluator

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
    """A function for one stage; None for ``$changeStreamSplitLargeEvent`` (handled by the cursor)."""
    if name == "$match":
        return compile_match(arg)
    if name == "$redact":
        return compile_redact(arg)
    if name == "$changeStreamSplitLargeEvent":
        return None
    if name == "$unset":
        fields = [arg] if isinstance(arg, str) else arg
        if not isinstance(fields, list) or not fields or not all(isinstance(f, str) for f in fields):
            raise MongoError(31002, "$unset specification must be a string or an array containing at "
                                    "least one field")
    if name in ("$project",) and (not isinstance(arg, dict) or not arg):
        raise MongoError(51272, "$project specification must be an object" if not isinstance(arg, dict)
                         else "projection specification must have at least one field")
    if name in ("$addFields", "$set") and not isinstance(arg, dict):
        raise MongoError(40272, f"{name} specification stage must be an object, got "
                                f"{type(arg).__name__}")
    if name == "$project":
        arg = _nest_computed_paths(arg)
    fn = _pipeline_stage({name: arg})
    fn(dict(_SAMPLE_EVENT))  # validate the specification now, like the server's parse
    return fn


def _nest_computed_paths(spec: dict[str, Any]) -> dict[str, Any]:
    """``{"a.b": <expr>}`` -> ``{"a": {"b": <expr>}}`` in a ``$project`` (same meaning on the
    server; mongomock would create a field literally named "a.b"). Inclusions/exclusions stay
    dotted, which mongomock handles."""
    out: dict[str, Any] = {}
    for key, value in spec.items():
        if "." in key and not (isinstance(value, (bool, int, float)) and value in (0, 1)):
            head, *rest = key.split(".")
            node = out.setdefault(head, {})
            if not isinstance(node, dict):
                out[key] = value
                continue
            for part in rest[:-1]:
                node = node.setdefault(part, {})
            node[rest[-1]] = value
        else:
            out[key] = value
    return out


def compile_stages(stages: list[tuple[str, Any]]) -> list[StageFn]:
    """Compile the user's stages in order (split stage excluded)."""
    out = []
    for name, arg in stages:
        fn = compile_stage(name, arg)
        if fn is not None:
            out.append(fn)
    return out


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
