"""Collection validators: whether a document passes, and the ``errInfo.details`` mongod 8.0
reports when it does not (``doc_validation_error.cpp``, ``json_schema_parser.cpp``).

:func:`failure_details` returns None for a passing document, else the details object:

* a query-operator validator reports its failing operator: ``{operatorName: "$type",
  specifiedAs: {x: {$type: "string"}}, reason: "type did not match", consideredValue: 1,
  consideredType: "int"}`` (``reason: "field was missing"`` for an absent path); several
  top-level fields are an implicit ``$and`` and report ``{operatorName: "$and",
  clausesNotSatisfied: [{index, details}]}``; ``$or``/``$nor``/``$not``/``$expr`` as the
  server builds them;
* ``$jsonSchema`` reports ``{operatorName: "$jsonSchema", schemaRulesNotSatisfied: [...]}``
  with one entry per failing keyword (``required`` with ``missingProperties``, ``properties``
  with ``propertiesNotSatisfied: [{propertyName, details: [...]}]``, ``bsonType``/``type``,
  ``minimum``/``maximum``, ``enum``, ``minLength``/``maxLength``, ``pattern``,
  ``additionalProperties``, ``items``, ``minItems``/``maxItems``, ``uniqueItems``,
  ``allOf``/``anyOf``/``oneOf``/``not``). Keywords that apply to one type only (``minimum``
  to numbers, ``minLength`` to strings, ...) report nothing for values of another type, as
  the server's ``isJsonSchemaKeyword`` checks do; ``title``/``description`` are copied.

:func:`check_schema` refuses a malformed ``$jsonSchema`` as mongod does when the validator
is set: FailedToParse (9) for an unknown keyword, TypeMismatch (14) for a wrongly typed one,
BadValue (2) for an unknown ``bsonType``.
"""

from __future__ import annotations

import re
from typing import Any

from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.regex import Regex

from shardsim.core.commands import bson_type_name
from shardsim.core.errors import MongoError

_NUMERIC = {"int", "long", "double", "decimal"}
_JSON_TYPES = {"object": {"object"}, "array": {"array"}, "number": _NUMERIC,
               "boolean": {"bool"}, "string": {"string"}, "null": {"null"}}
_BSON_TYPES = {"double", "string", "object", "array", "binData", "undefined", "objectId",
               "bool", "date", "null", "regex", "dbPointer", "javascript", "symbol",
               "javascriptWithScope", "int", "timestamp", "long", "decimal", "minKey",
               "maxKey", "number"}
_KEYWORDS = {"type", "bsonType", "properties", "required", "additionalProperties",
             "patternProperties", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
             "minLength", "maxLength", "pattern", "enum", "items", "additionalItems",
             "minItems", "maxItems", "uniqueItems", "minProperties", "maxProperties",
             "allOf", "anyOf", "oneOf", "not", "title", "description", "multipleOf",
             "dependencies", "encrypt"}
# The order json_schema_parser.cpp adds the keywords' expressions (so their errors): scalar,
# array, object (properties before required), then logical keywords.
_ORDER = {k: i for i, k in enumerate((
    "minimum", "maximum", "minLength", "maxLength", "pattern", "multipleOf",
    "minItems", "maxItems", "uniqueItems", "items",
    "properties", "required", "minProperties", "maxProperties", "additionalProperties"))}


# -- $jsonSchema ---------------------------------------------------------------------------
def check_schema(schema: Any, path: str = "$jsonSchema") -> None:
    """Refuse a malformed schema: 14 (not an object / wrong keyword type), 9 (unknown
    keyword), 2 (unknown type name)."""
    if not isinstance(schema, dict):
        raise MongoError(14, f"{path} must be an object")
    for k, v in schema.items():
        if k not in _KEYWORDS:
            raise MongoError(9, f"Unknown $jsonSchema keyword: {k}")
        if k in ("type", "bsonType"):
            names = v if isinstance(v, list) else [v]
            allowed = _JSON_TYPES if k == "type" else _BSON_TYPES
            for n in names:
                if not isinstance(n, str):
                    raise MongoError(14, f"$jsonSchema keyword '{k}' must be either a string "
                                         f"or an array of strings")
                if n not in allowed:
                    raise MongoError(2, f"Unknown type name alias: {n}" if k == "bsonType"
                                     else f"Unknown $jsonSchema type: {n}")
        elif k == "properties" or k == "patternProperties":
            if not isinstance(v, dict):
                raise MongoError(14, f"$jsonSchema keyword '{k}' must be an object")
            for name, sub in v.items():
                check_schema(sub, f"{path}.{k}.{name}")
        elif k == "required":
            if not isinstance(v, list) or not v or not all(isinstance(x, str) for x in v):
                raise MongoError(14 if not isinstance(v, list) else 2,
                                 "$jsonSchema keyword 'required' must be a nonempty array "
                                 "of strings")
        elif k in ("allOf", "anyOf", "oneOf"):
            if not isinstance(v, list) or not v:
                raise MongoError(14, f"$jsonSchema keyword '{k}' must be an array")
            for sub in v:
                check_schema(sub, f"{path}.{k}")
        elif k in ("not", "additionalProperties", "items", "additionalItems"):
            if isinstance(v, dict):
                check_schema(v, f"{path}.{k}")
            elif isinstance(v, list) and k == "items":
                for sub in v:
                    check_schema(sub, f"{path}.{k}")
            elif not isinstance(v, bool) or k in ("not",):
                raise MongoError(14, f"$jsonSchema keyword '{k}' must be an object")
        elif k == "enum" and (not isinstance(v, list) or not v):
            raise MongoError(14 if not isinstance(v, list) else 2,
                             "$jsonSchema keyword 'enum' must be a nonempty array")


def _type_ok(value: Any, schema: dict[str, Any]) -> tuple[bool, str | None]:
    """Whether ``value`` satisfies the schema's ``bsonType``/``type`` (and which keyword
    failed)."""
    tname = bson_type_name(value)
    for kw in ("bsonType", "type"):
        if kw in schema:
            names = schema[kw] if isinstance(schema[kw], list) else [schema[kw]]
            ok = set()
            for n in names:
                ok |= _JSON_TYPES.get(n, {n}) if kw == "type" else \
                    (_NUMERIC if n == "number" else {n})
            if tname not in ok:
                return False, kw
    return True, None


def _num(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float, Int64)):
        return float(v)
    if isinstance(v, Decimal128):
        return float(v.to_decimal())
    return None


def _leaf(op: str, spec: Any, reason: str, value: Any) -> dict[str, Any]:
    return {"operatorName": op, "specifiedAs": {op: spec}, "reason": reason,
            "consideredValue": value}


def _value_rules(schema: dict[str, Any], value: Any) -> list[dict[str, Any]]:
    """The failing keywords of ``schema`` for a present ``value`` (property or item)."""
    out: list[dict[str, Any]] = []
    ok, kw = _type_ok(value, schema)
    if not ok:
        out.append({"operatorName": kw, "specifiedAs": {kw: schema[kw]},
                    "reason": "type did not match", "consideredValue": value,
                    "consideredType": bson_type_name(value)})
    n = _num(value)
    for k, spec in sorted(schema.items(), key=lambda kv: _ORDER.get(kv[0], 99)):
        if k == "minimum" and n is not None and _num(spec) is not None:
            excl = schema.get("exclusiveMinimum") is True
            if n < _num(spec) or (excl and n == _num(spec)):
                out.append(_leaf(k, spec, "comparison failed", value))
        elif k == "maximum" and n is not None and _num(spec) is not None:
            excl = schema.get("exclusiveMaximum") is True
            if n > _num(spec) or (excl and n == _num(spec)):
                out.append(_leaf(k, spec, "comparison failed", value))
        elif k in ("minLength", "maxLength") and isinstance(value, str):
            if (len(value) < spec) if k == "minLength" else (len(value) > spec):
                out.append(_leaf(k, spec, "specified string length was not satisfied", value))
        elif k == "pattern" and isinstance(value, str):
            pat = spec.pattern if isinstance(spec, Regex) else spec
            if re.search(str(pat), value) is None:
                out.append(_leaf(k, spec, "regular expression did not match", value))
        elif k == "multipleOf" and n is not None and _num(spec):
            if n % _num(spec) != 0:
                out.append(_leaf(k, spec, "considered value is not a multiple of the "
                                          "specified value", value))
    if isinstance(value, list):
        out.extend(_array_rules(schema, value))
    if isinstance(value, dict):
        out.extend(_object_rules(schema, value))
    out.extend(_logical_rules(schema, value))
    if "enum" in schema and not any(_equal(value, e) for e in schema["enum"]):
        out.append(_leaf("enum", schema["enum"], "value was not found in enum", value))
    return out


def _equal(a: Any, b: Any) -> bool:
    """BSON equality for ``enum``/``uniqueItems`` (numbers by value, else type and value)."""
    na, nb = _num(a), _num(b)
    if na is not None and nb is not None:
        return na == nb
    return bson_type_name(a) == bson_type_name(b) and a == b


def _object_rules(schema: dict[str, Any], doc: dict[str, Any]) -> list[dict[str, Any]]:
    """``required``, ``properties``, ``additionalProperties``, ``min/maxProperties``."""
    out: list[dict[str, Any]] = []
    for k, spec in sorted(schema.items(), key=lambda kv: _ORDER.get(kv[0], 99)):
        if k == "required":
            missing = [f for f in spec if f not in doc]
            if missing:
                out.append({"operatorName": "required", "specifiedAs": {"required": spec},
                            "missingProperties": sorted(missing)})
        elif k == "properties":
            failing = []
            for name, sub in spec.items():
                if name not in doc:
                    continue
                details = _value_rules(sub, doc[name])
                if details:
                    entry: dict[str, Any] = {"propertyName": name}
                    for a in ("title", "description"):
                        if a in sub:
                            entry[a] = sub[a]
                    entry["details"] = details
                    failing.append(entry)
            if failing:
                out.append({"operatorName": "properties", "propertiesNotSatisfied": failing})
        elif k == "additionalProperties":
            props = schema.get("properties", {})
            patterns = list((schema.get("patternProperties") or {}).keys())
            extra = [f for f in doc if f not in props and
                     not any(re.search(p, f) for p in patterns)]
            if spec is False and extra:
                out.append({"operatorName": "additionalProperties",
                            "specifiedAs": {"additionalProperties": False},
                            "additionalProperties": extra})
            elif isinstance(spec, dict):
                bad = next((f for f in extra if _value_rules(spec, doc[f])), None)
                if bad is not None:
                    out.append({"operatorName": "additionalProperties",
                                "reason": "at least one additional property did not match "
                                          "the subschema",
                                "failingProperty": bad,
                                "details": _value_rules(spec, doc[bad])})
        elif k in ("minProperties", "maxProperties"):
            if (len(doc) < spec) if k == "minProperties" else (len(doc) > spec):
                out.append({"operatorName": k, "specifiedAs": {k: spec},
                            "reason": "specified number of properties was not satisfied",
                            "numberOfProperties": len(doc)})
    return out


def _array_rules(schema: dict[str, Any], arr: list[Any]) -> list[dict[str, Any]]:
    """``items`` (one schema), ``minItems``/``maxItems``, ``uniqueItems``."""
    out: list[dict[str, Any]] = []
    for k, spec in schema.items():
        if k == "items" and isinstance(spec, dict):
            for i, item in enumerate(arr):
                details = _value_rules(spec, item)
                if details:
                    out.append({"operatorName": "items", "reason": "At least one item did "
                                "not match the sub-schema", "itemIndex": i, "details": details})
                    break
        elif k in ("minItems", "maxItems"):
            if (len(arr) < spec) if k == "minItems" else (len(arr) > spec):
                out.append(_leaf(k, spec, "array did not match specified length", arr))
        elif k == "uniqueItems" and spec is True:
            for i, a in enumerate(arr):
                if any(_equal(a, b) for b in arr[:i]):
                    out.append({**_leaf(k, spec, "found a duplicate item", arr),
                                "duplicatedValue": a})
                    break
    return out


def _logical_rules(schema: dict[str, Any], value: Any) -> list[dict[str, Any]]:
    """``allOf``/``anyOf``/``oneOf``/``not``."""
    out: list[dict[str, Any]] = []
    for k in ("allOf", "anyOf", "oneOf"):
        if k not in schema:
            continue
        results = [_value_rules(sub, value) for sub in schema[k]]
        failing = [{"index": i, "details": d} for i, d in enumerate(results) if d]
        passing = [i for i, d in enumerate(results) if not d]
        if k == "allOf" and failing:
            out.append({"operatorName": k, "schemasNotSatisfied": failing})
        elif k == "anyOf" and not passing:
            out.append({"operatorName": k, "schemasNotSatisfied": failing})
        elif k == "oneOf" and len(passing) != 1:
            out.append({"operatorName": k, "schemasNotSatisfied": failing} if not passing else
                       {"operatorName": k, "reason": "more than one subschema matched",
                        "matchingSchemaIndexes": passing})
    if "not" in schema and not _value_rules(schema["not"], value):
        out.append({"operatorName": "not", "specifiedAs": {"not": schema["not"]},
                    "reason": "child expression matched"})
    return out


def schema_details(schema: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any] | None:
    """The ``$jsonSchema`` error for ``doc`` (None when it passes)."""
    rules = _value_rules(schema, doc)
    if not rules:
        return None
    out: dict[str, Any] = {"operatorName": "$jsonSchema"}
    for a in ("title", "description"):
        if a in schema:
            out[a] = schema[a]
    out["schemaRulesNotSatisfied"] = rules
    return out


# -- query operators -----------------------------------------------------------------------
_REASONS = {
    "$eq": "comparison failed", "$gt": "comparison failed", "$gte": "comparison failed",
    "$lt": "comparison failed", "$lte": "comparison failed", "$ne": "comparison succeeded",
    "$in": "no matching value found in array", "$nin": "matching value found in array",
    "$type": "type did not match", "$exists": "path does not exist",
    "$regex": "regular expression did not match", "$size": "array length was not equal to "
    "given size", "$all": "array did not contain all specified values",
    "$elemMatch": "array did not satisfy the child predicate",
    "$mod": "$mod did not evaluate to expected remainder",
}
_ARRAY_OPS = {"$size", "$elemMatch", "$all"}


def _path_values(doc: Any, path: str, traverse_leaf: bool) -> list[Any] | None:
    """The values at dotted ``path`` (arrays on the way traversed; a leaf array's elements
    when ``traverse_leaf``), or None when the path is absent."""
    cur = [doc]
    for part in path.split("."):
        nxt = []
        for v in cur:
            if isinstance(v, dict) and part in v:
                nxt.append(v[part])
            elif isinstance(v, list):
                if part.isdigit() and int(part) < len(v):
                    nxt.append(v[int(part)])
                for e in v:
                    if isinstance(e, dict) and part in e:
                        nxt.append(e[part])
        if not nxt:
            return None
        cur = nxt
    if traverse_leaf:
        flat: list[Any] = []
        for v in cur:
            flat.extend(v if isinstance(v, list) else [v])
        return flat
    return cur


def _leaf_error(field: str, op: str, arg: Any, doc: dict[str, Any]) -> dict[str, Any]:
    """The error of one failing ``{field: {op: arg}}`` (``generatePathError``)."""
    out: dict[str, Any] = {"operatorName": op, "specifiedAs": {field: arg if op == "$eq" and
                                                               not isinstance(arg, dict)
                                                               else {op: arg}}}
    vals = _path_values(doc, field, op not in _ARRAY_OPS)
    if vals is None:
        out["reason"] = "field was missing"
        return out
    if op in _ARRAY_OPS and not any(isinstance(v, list) for v in vals):
        out["reason"] = "type did not match"
        types = sorted({bson_type_name(v) for v in vals})
        out["consideredType" if len(types) == 1 else "consideredTypes"] = \
            types[0] if len(types) == 1 else types
        out["expectedType"] = "array"
    else:
        out["reason"] = _REASONS.get(op, "expression did not match")
    if len(vals) == 1:
        out["consideredValue"] = vals[0]
    elif vals:
        out["consideredValues"] = vals
    if op == "$type" and vals:
        types = sorted({bson_type_name(v) for v in vals})
        out["consideredType" if len(types) == 1 else "consideredTypes"] = \
            types[0] if len(types) == 1 else types
    return out


def _clauses(filt: dict[str, Any]) -> list[dict[str, Any]]:
    """A filter's implicit ``$and`` clauses: one per top-level field, one per operator of a
    field with several."""
    out = []
    for k, v in filt.items():
        if not k.startswith("$") and isinstance(v, dict) and len(v) > 1 and \
                all(str(o).startswith("$") for o in v) and "$options" not in v:
            out.extend({k: {o: a}} for o, a in v.items())
        else:
            out.append({k: v})
    return out


def _clause_error(clause: dict[str, Any], doc: dict[str, Any],
                  matches: Any) -> dict[str, Any]:
    """The error of one failing single-field clause."""
    (k, v), = clause.items()
    if k == "$jsonSchema":
        return schema_details(v, doc) or {"operatorName": "$jsonSchema"}
    if k in ("$and", "$or", "$nor"):
        failing = [{"index": i, "details": query_details(c, doc, matches)}
                   for i, c in enumerate(v)
                   if (not _filter_matches(c, doc, matches)) == (k != "$nor")]
        key = "clausesNotSatisfied" if k != "$nor" else "clausesSatisfied"
        return {"operatorName": k, key: failing}
    if k == "$expr":
        return {"operatorName": "$expr", "specifiedAs": {"$expr": v},
                "reason": "expression did not match", "expressionResult": False}
    if isinstance(v, dict) and len(v) == 1 and next(iter(v)).startswith("$"):
        (op, arg), = v.items()
        if op == "$not":
            return {"operatorName": "$not", "details": _leaf_error(k, "$eq", arg, doc)}
        return _leaf_error(k, op, arg, doc)
    if isinstance(v, dict) and "$regex" in v:
        return _leaf_error(k, "$regex", v["$regex"], doc)
    return _leaf_error(k, "$eq", v, doc)


def query_details(filt: dict[str, Any], doc: dict[str, Any], matches: Any) -> dict[str, Any]:
    """The error of a failing query-operator filter (``matches(filter, doc)`` decides each
    clause)."""
    clauses = _clauses(filt)
    if len(clauses) == 1:
        return _clause_error(clauses[0], doc, matches)
    failing = [{"index": i, "details": _clause_error(c, doc, matches)}
               for i, c in enumerate(clauses) if not _clause_matches(c, doc, matches)]
    return {"operatorName": "$and", "clausesNotSatisfied": failing}


def _filter_matches(filt: dict[str, Any], doc: dict[str, Any], matches: Any) -> bool:
    """Whether ``doc`` passes ``filt`` (``$jsonSchema`` clauses evaluated here)."""
    return all(_clause_matches(c, doc, matches) for c in _clauses(filt))


def _clause_matches(clause: dict[str, Any], doc: dict[str, Any], matches: Any) -> bool:
    (k, v), = clause.items()
    if k == "$jsonSchema":
        return schema_details(v, doc) is None
    if k in ("$and", "$or", "$nor") and isinstance(v, list) and \
            any("$jsonSchema" in str(c) for c in v):
        results = [_filter_matches(c, doc, matches) for c in v]
        return all(results) if k == "$and" else any(results) if k == "$or" else \
            not any(results)
    return matches(clause, doc)


def failure_details(validator: dict[str, Any], doc: dict[str, Any],
                    matches: Any) -> dict[str, Any] | None:
    """None when ``doc`` passes ``validator``, else ``errInfo.details``. ``matches(filter,
    doc) -> bool`` is the query matcher used for query-operator clauses."""
    if not validator:
        return None
    if _filter_matches(validator, doc, matches):
        return None
    return query_details(validator, doc, matches)
