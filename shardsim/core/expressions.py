"""Aggregation-expression additions to mongomock's evaluator (``mongomock.aggregate._Parser``):
``let`` variables and the field-name operators of mongod 5.0+.

* **``let`` / ``$$name``**: a command's ``let`` document (find, aggregate, update, delete,
  findAndModify, bulkWrite) and an update statement's ``c`` constants define variables every
  expression of that command can read as ``$$name`` (``$expr`` in filters, pipeline stages,
  pipeline-style updates). mongod evaluates each ``let`` value once, without a document
  (``Variables::seedVariablesWithLetParameters``, ``src/mongo/db/pipeline/variables.cpp``).
  :func:`let_scope` binds them for the duration of one command (a ``contextvars`` variable, so
  concurrent commands on one event loop do not see each other's variables); names must start
  with a lowercase letter (FailedToParse 9 otherwise, ``variableValidation::validateName``).
* **``$getField``** ``{field, input}`` (or a field name string, input ``$$CURRENT``) and
  **``$setField``** ``{field, input, value}`` (``value: "$$REMOVE"`` removes the field), the
  operators that read and write field names with dots and dollars
  (``src/mongo/db/pipeline/expression.cpp``, ``ExpressionGetField``/``ExpressionSetField``).
  ``field`` must be a constant string (or ``$literal``): 3041704 / 4161106 otherwise.
* **``$type``** (the BSON type alias, ``"missing"`` for a missing value), **``$mergeObjects``**
  (later documents win; null and missing inputs are skipped; 40400 for a non-object) and
  **``$bsonSize``** (the encoded size of a document, null for null/missing; 31393 for a
  non-object), which mongomock lacks (``ExpressionType``, ``ExpressionMergeObjects``,
  ``ExpressionBsonSize`` in ``expression.cpp``); CDC connectors use them (Airbyte's schema
  discovery, stream pipelines measuring events).

:func:`install` patches mongomock once (at import of :mod:`shardsim.core.query`).
"""

from __future__ import annotations

import contextlib
import contextvars
import random
import re
from typing import Any, Iterator

import bson
from mongomock import aggregate as mm_aggregate

from shardsim.core.commands import bson_type_name
from shardsim.core.errors import MongoError

LET_VARS: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("shardsim_let",
                                                                         default={})
_NAME = re.compile(r"^[a-z\x80-\xff][A-Za-z0-9_\x80-\xff]*$")
_installed = False
# Variables every expression may read (Variables::kBuiltin... in variables.cpp).
_SYSTEM_VARS = frozenset({"ROOT", "CURRENT", "REMOVE", "NOW", "CLUSTER_TIME", "DESCEND",
                          "PRUNE", "KEEP", "SEARCH_META", "USER_ROLES"})


def evaluate_let(let: Any) -> dict[str, Any]:
    """The variables of a ``let`` document: each value evaluated as an expression without a
    document (``{$literal: x}`` -> x, ``{$add: [1, 2]}`` -> 3, a constant stays). TypeMismatch
    (14) when ``let`` is not a document, FailedToParse (9) for a bad variable name."""
    if let is None:
        return {}
    if not isinstance(let, dict):
        raise MongoError(14, f"BSON field 'let' is the wrong type '{bson_type_name(let)}', "
                             f"expected type 'object'")
    out: dict[str, Any] = {}
    for name, value in let.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise MongoError(9, f"'{name}' starts with an invalid character for a user "
                                f"variable name")
        try:
            out[name] = mm_aggregate._Parser({}, dict(LET_VARS.get(), **out)).parse(value)
        except MongoError:
            raise
        except KeyError:
            continue  # a missing value: the variable is unset
        except Exception as exc:  # mongomock's own errors
            from shardsim.core.query import translate_error
            raise translate_error(exc) from None
    return out


@contextlib.contextmanager
def let_scope(let: Any) -> Iterator[dict[str, Any]]:
    """Bind the variables of ``let`` (see :func:`evaluate_let`) on top of those already bound,
    for the ``with`` block; yields the merged variables."""
    merged = dict(LET_VARS.get(), **evaluate_let(let))
    token = LET_VARS.set(merged)
    try:
        yield merged
    finally:
        LET_VARS.reset(token)


def _field_arg(op: str, spec: Any) -> str:
    field = spec.get("field") if isinstance(spec, dict) else spec
    if isinstance(field, dict) and list(field) == ["$literal"]:
        field = field["$literal"]
    if not isinstance(field, str):
        code = 3041704 if op == "$getField" else 4161106
        raise MongoError(code, f"{op} requires 'field' to evaluate to type String, but got "
                               f"{bson_type_name(field)}")
    if field.startswith("$") and not (isinstance(spec, dict) and
                                      isinstance(spec.get("field"), dict)):
        code = 5654602 if op == "$getField" else 4161108
        raise MongoError(code, f"{op} requires 'field' to be a constant string; a field path "
                               f"must be wrapped in $literal")
    return field


def _get_field(parser: Any, spec: Any) -> Any:
    if not isinstance(spec, dict) or list(spec) == ["$literal"]:
        spec = {"field": spec}  # the shorthand {$getField: <name>}
    field = _field_arg("$getField", spec)
    if isinstance(spec, dict):
        unknown = set(spec) - {"field", "input"}
        if unknown:
            raise MongoError(3041701, f"$getField found an unknown argument: {sorted(unknown)[0]}")
        source = parser.parse(spec["input"]) if "input" in spec else parser._doc_dict
    else:
        source = parser._doc_dict
    if not isinstance(source, dict):
        if source is None:
            return None
        raise MongoError(3041705, "$getField requires 'input' to evaluate to type Object")
    if field not in source:
        raise KeyError(field)  # missing: mongomock's "no value"
    return source[field]


def _set_field(parser: Any, spec: Any) -> Any:
    if not isinstance(spec, dict):
        raise MongoError(4161100, "$setField only supports an object as its argument")
    for required in ("field", "input", "value"):
        if required not in spec:
            raise MongoError(4161102, f"$setField requires '{required}' to be specified")
    field = _field_arg("$setField", spec)
    source = parser.parse(spec["input"])
    if source is None:
        return None
    if not isinstance(source, dict):
        raise MongoError(4161105, "$setField requires 'input' to evaluate to type Object")
    out = dict(source)
    if spec["value"] == "$$REMOVE":
        out.pop(field, None)
        return out
    try:
        value = parser.parse(spec["value"])
    except KeyError:
        out.pop(field, None)
        return out
    out[field] = value
    return out


def _operand(parser: Any, spec: Any) -> Any:
    """The single operand of a one-argument operator (``[x]`` or ``x``); missing -> KeyError."""
    if isinstance(spec, list):
        if len(spec) != 1:
            raise MongoError(16020, f"Expression takes exactly 1 arguments. {len(spec)} were "
                                    f"passed in.")
        spec = spec[0]
    return parser.parse(spec)


def _type_of(parser: Any, spec: Any) -> str:
    try:
        value = _operand(parser, spec)
    except KeyError:
        return "missing"
    return bson_type_name(value)


def _merge_objects(parser: Any, spec: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in (spec if isinstance(spec, list) else [spec]):
        try:
            value = parser.parse(item)
        except KeyError:
            continue
        if value is None:
            continue
        if not isinstance(value, dict):
            raise MongoError(40400, f"$mergeObjects requires object inputs, but input "
                                    f"{value!r} is of type {bson_type_name(value)}")
        out.update(value)
    return out


def _bson_size(parser: Any, spec: Any) -> Any:
    try:
        value = _operand(parser, spec)
    except KeyError:
        return None
    if value is None:
        return None
    if not isinstance(value, dict):
        raise MongoError(31393, f"$bsonSize requires a document input, found: "
                                f"{bson_type_name(value)}")
    return len(bson.encode(value))


def _function(parser: Any, spec: Any) -> Any:
    """``$function``: JavaScript (:func:`shardsim.core.javascript.function_expression`), in
    the context of the command's database."""
    from shardsim.core import javascript
    from shardsim.core.commands import CURRENT_REQUEST
    req = CURRENT_REQUEST.get()
    return javascript.function_expression(req.db if req is not None else "test", parser, spec)


_OPERATORS = {"$type": _type_of, "$mergeObjects": _merge_objects, "$bsonSize": _bson_size,
              "$function": _function}


def install() -> None:
    """Patch mongomock's expression parser (idempotent): ``let`` variables visible to every
    ``_Parser``, ``$getField``/``$setField`` evaluated here."""
    global _installed
    if _installed:
        return
    _installed = True
    parser_cls = mm_aggregate._Parser
    orig_init = parser_cls.__init__
    orig_parse = parser_cls.parse

    def __init__(self: Any, doc_dict: Any, user_vars: Any = None,
                 ignore_missing_keys: bool = False) -> None:
        bound = LET_VARS.get()
        if bound:
            user_vars = dict(bound, **(user_vars or {}))
        orig_init(self, doc_dict, user_vars, ignore_missing_keys)

    def parse(self: Any, expression: Any) -> Any:
        if isinstance(expression, dict) and len(expression) == 1:
            op = next(iter(expression))
            if op == "$getField":
                return _get_field(self, expression[op])
            if op == "$setField":
                return _set_field(self, expression[op])
            if op in _OPERATORS:
                return _OPERATORS[op](self, expression[op])
            if op == "$rand":
                if expression[op] != {}:
                    raise MongoError(3040501, "$rand does not currently accept arguments")
                return random.random()
        elif isinstance(expression, str) and expression.startswith("$$"):
            name = expression[2:].split(".", 1)[0]
            if name not in self._user_vars and name not in _SYSTEM_VARS:
                raise MongoError(17276, f"Use of undefined variable: {name}")
        return orig_parse(self, expression)

    parser_cls.__init__ = __init__
    parser_cls.parse = parse


install()  # importing this module (every node does) patches mongomock once
