"""Server-side JavaScript: ``$where`` in queries, the ``$function`` aggregation expression and
the ``$accumulator`` group accumulator, ``mapReduce`` (mongod 8.0 still runs them, deprecated), on an embedded QuickJS engine (the ``quickjs-ng``
package: the maintained quickjs-ng fork, wheels for Linux, macOS and Windows, imported as
``quickjs``). mongod uses SpiderMonkey (``src/mongo/scripting/mozjs/``).

* **``$where``** (``src/mongo/db/matcher/expression_where.cpp``, ``JsFunction`` in
  ``src/mongo/db/query/js_function.cpp``): a string or Code; a function source is called, any
  other source is the body of ``function() { return <source>; }``; ``this`` and the global
  ``obj`` are the document; the result's truthiness decides. Only at the top level of a
  filter or under ``$and``/``$or``/``$nor`` (:func:`split_where`).
* **``$function``** ``{body, args, lang: "js"}`` (``expression_function.cpp``): ``body`` a
  string or Code, ``args`` an array expression (31266 otherwise), ``lang`` "js" (31418 /
  31419); 31260 / 31261 / 31262 / 31263 for the other malformed forms; the result comes back
  as BSON: JS numbers are doubles, Dates dates, ObjectIds ObjectIds.
* Values cross as mongod's shell types do for the common ones: documents, arrays, strings,
  numbers (int, long and double become JS numbers), booleans, null, dates (``Date``),
  ObjectIds (an ``ObjectId`` object with ``str``, ``toString()``, ``equals()``); other BSON
  types reach JS as their extended-JSON documents. ``sleep(ms)`` is there, as in mongod's
  engine (a busy wait here, ended by the call's time limit).
* **Errors** (``JsExecution``/``MozJSImplScope``): a JS exception or syntax error is
  JSInterpreterFailure (139) with the engine's message ("ReferenceError: x is not defined
  :\n..."); a function that runs past the operation's ``maxTimeMS`` is MaxTimeMSExpired (50).
* **Sandbox**: QuickJS without its ``std``/``os`` modules: no files, network, processes or
  timers; each database has its own context (mongod pools a scope per database and user), with
  :data:`MEMORY_LIMIT` bytes of heap (beyond: 139 "InternalError: out of memory") and
  :data:`TIME_LIMIT_S` seconds of CPU per call, or the operation's remaining ``maxTimeMS``.
* **Disabled** (``--noscripting``, mongod's ``security.javascriptEnabled: false``, or the
  engine not installed): ``$where`` is 6108304 "no globalScriptEngine in $where parsing",
  ``$function`` 31264 "Cannot run server-side javascript without the javascript engine
  enabled" (``ExpressionContext::getJsExecWithScope``).

* **``$accumulator``** in ``$group`` (``accumulator_js_reduce.cpp``): :func:`install` lets
  mongomock's ``$group`` hand those fields to :func:`accumulate_group` (init / accumulate /
  finalize in one engine call per group; mongod's parse errors 4544701-4544712).

* **``mapReduce``** (:func:`parse_map_reduce`, :func:`map_reduce`): ``map`` with ``emit``,
  ``reduce``, ``finalize``, ``scope``; inline results or a replaced output collection (the
  shard's and the router's ``mapReduce`` handlers).

Code with scope is refused as mongod 4.4+ refuses it (``$where`` 2 "$where got bad type",
``$function`` 31262). Not built: the ``merge``/``reduce`` output modes of ``mapReduce`` (238),
``db`` and the shell's other globals inside functions (``Array.sum``/``avg``, ``tojson``,
``print``, ``sleep`` are there).
"""

from __future__ import annotations

import datetime
import json
import threading
from typing import Any

from bson import ObjectId
from bson.code import Code
from bson.int64 import Int64

from shardsim.core import max_time
from shardsim.core.errors import MongoError

try:
    import quickjs as _quickjs
except ImportError:  # pragma: no cover - the pinned dependency is missing
    _quickjs = None

ENGINE_AVAILABLE = _quickjs is not None
MEMORY_LIMIT = 64 * 1024 * 1024  # bytes of JS heap per database's context
TIME_LIMIT_S = 30.0  # CPU seconds per call without a maxTimeMS
_enabled = True
_contexts: dict[tuple[int, str], Any] = {}
_lock = threading.Lock()

# The types and the conversions on the JS side: documents arrive as JSON with tagged
# ObjectIds/dates, revived here; results leave as JSON with the same tags.
_PRELUDE = r"""
function ObjectId(hex) {
    if (!(this instanceof ObjectId)) return new ObjectId(hex);
    this.str = hex;
}
ObjectId.prototype.toString = function () { return 'ObjectId("' + this.str + '")'; };
ObjectId.prototype.valueOf = function () { return this.str; };
ObjectId.prototype.equals = function (o) { return o instanceof ObjectId && o.str === this.str; };
ObjectId.prototype.toJSON = function () { return {$oid: this.str}; };
// a few helpers of mongod's server-side utils (Array.sum/avg, tojson, print...)
Array.sum = function (arr) { var s = 0; for (var i = 0; i < arr.length; i++) s += arr[i]; return s; };
Array.avg = function (arr) { return arr.length ? Array.sum(arr) / arr.length : undefined; };
Array.contains = function (arr, x) { return arr.indexOf(x) >= 0; };
Array.unique = function (arr) { return arr.filter(function (x, i) { return arr.indexOf(x) == i; }); };
function tojson(x) { return JSON.stringify(x); }
function isNumber(x) { return typeof x === 'number'; }
function isString(x) { return typeof x === 'string'; }
function isObject(x) { return typeof x === 'object' && x !== null; }
function print() {}
function printjson() {}
function sleep(ms) {  // the shell's sleep(): interruptible by the call's time limit
    var end = Date.now() + ms;
    while (Date.now() < end) {}
}
function __ss_revive(k, v) {
    if (v !== null && typeof v === 'object' && !Array.isArray(v)) {
        var keys = Object.keys(v);
        if (keys.length === 1 && keys[0] === '$oid') return new ObjectId(v.$oid);
        if (keys.length === 1 && keys[0] === '$date') return new Date(v.$date);
    }
    return v;
}
function __ss_out(k, v) {
    var raw = this[k];
    if (raw instanceof Date) return {$date: raw.getTime()};
    if (v === undefined) return null;
    if (typeof v === 'number' && !isFinite(v)) return {$double: String(v)};
    return v;
}
function __ss_call(fn, thisText, argsText) {
    var self = thisText === null ? undefined : JSON.parse(thisText, __ss_revive);
    globalThis.obj = self;
    var result = fn.apply(self, JSON.parse(argsText, __ss_revive));
    return JSON.stringify({r: result}, __ss_out);
}
"""


def set_enabled(enabled: bool) -> None:
    """Turn server-side JavaScript on or off for this process (``--noscripting``)."""
    global _enabled
    _enabled = bool(enabled)


def enabled() -> bool:
    """True when JavaScript may run: the engine is installed and scripting is not off."""
    return _enabled and ENGINE_AVAILABLE


def _context(db: str) -> Any:
    """The database's QuickJS context on this thread (created on first use)."""
    key = (threading.get_ident(), db)
    ctx = _contexts.get(key)
    if ctx is None:
        ctx = _quickjs.Context()
        ctx.set_memory_limit(MEMORY_LIMIT)
        ctx.set_max_stack_size(1024 * 1024)
        ctx.eval(_PRELUDE)
        with _lock:
            _contexts[key] = ctx
    return ctx


def _to_json(value: Any) -> Any:
    """A BSON value as JSON for JS (numbers as numbers; ObjectIds and dates tagged)."""
    if isinstance(value, dict):
        return {str(k): _to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, Int64)):
        return int(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return None
        return value
    if isinstance(value, ObjectId):
        return {"$oid": str(value)}
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        return {"$date": int(value.timestamp() * 1000)}
    from bson import json_util
    return json.loads(json_util.dumps(value))


def _from_json(value: Any) -> Any:
    """A JS result (parsed JSON) as BSON: numbers are doubles, tags become their types."""
    if isinstance(value, dict):
        if len(value) == 1:
            if "$oid" in value:
                return ObjectId(value["$oid"])
            if "$date" in value:
                return datetime.datetime(1970, 1, 1) + datetime.timedelta(
                    milliseconds=value["$date"])
            if "$double" in value:
                return float(value["$double"])
        return {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return float(value)
    return value


def _source(code: Any) -> str:
    """The function source of a ``$where``/``$function`` body: a function expression is used
    as it is, anything else becomes ``function() { return <source>; }``."""
    text = str(code).strip()
    if text.startswith("function") or text.startswith("async function"):
        return f"({text})"
    return f"(function() {{ return {text}; }})"


def _js_error(exc: Exception) -> MongoError:
    """JSInterpreterFailure (139) "<error> :\n<where>" (the first frame of the user's code;
    the engine's own frames are left out), or MaxTimeMSExpired (50) for a call interrupted
    at the operation's deadline."""
    msg = str(exc).rstrip("\n")
    head, _, stack = msg.partition("\n")
    if head == "InternalError: interrupted" and max_time.remaining() is not None:
        return max_time.expired_error()
    frame = stack.strip().split("\n")[0].strip() if stack else ""
    return MongoError(139, f"{head} :\n{frame}" if frame else head)


def call(db: str, body: Any, args: list[Any], this: Any = None) -> Any:
    """Run the function ``body`` (source or Code) with ``args`` (BSON values) and ``this``
    (a document or None) in the context of ``db``; returns the result as BSON. Raises
    JSInterpreterFailure (139) for a JS error, MaxTimeMSExpired (50) past ``maxTimeMS``."""
    ctx = _context(db)
    left = max_time.remaining()
    if left is not None and left <= 0:
        raise max_time.expired_error()
    ctx.set_time_limit(min(TIME_LIMIT_S, left) if left is not None else TIME_LIMIT_S)
    try:
        fn = ctx.eval(_source(body))
        runner = ctx.get("__ss_call")
        this_text = None if this is None else json.dumps(_to_json(this))
        out = runner(fn, this_text, json.dumps([_to_json(a) for a in args]))
    except MongoError:
        raise
    except Exception as exc:  # quickjs.JSException / StackOverflow
        if _quickjs is not None and isinstance(exc, (_quickjs.JSException,
                                                     _quickjs.StackOverflow)):
            raise _js_error(exc) from None
        raise
    return _from_json(json.loads(out)["r"]) if out is not None else None


# -- $where ------------------------------------------------------------------------------------

def has_where(filt: Any) -> bool:
    """True when the filter holds ``$where`` at its top level or under $and/$or/$nor."""
    if not isinstance(filt, dict):
        return False
    for k, v in filt.items():
        if k == "$where":
            return True
        if k in ("$and", "$or", "$nor") and isinstance(v, list) and any(has_where(x) for x in v):
            return True
    return False


def check_where(code: Any) -> None:
    """``$where``'s parse-time checks: the engine (6108304 when disabled or missing) and the
    operand's type (a string or Code: BadValue 2 "$where got bad type")."""
    if not enabled():
        raise MongoError(6108304, "no globalScriptEngine in $where parsing")
    if not isinstance(code, (str, Code)) or (isinstance(code, Code) and code.scope is not None):
        raise MongoError(2, "$where got bad type")  # Code with scope too (gone since 4.4)


def compile_where(db: str, code: Any) -> None:
    """Parse-time ``$where``: :func:`check_where`, then compile the function (a syntax error
    is 139, as ``JsFunction`` creating the function fails)."""
    check_where(code)
    ctx = _context(db)
    ctx.set_time_limit(TIME_LIMIT_S)
    try:
        ctx.eval(_source(code))
    except Exception as exc:
        if _quickjs is not None and isinstance(exc, (_quickjs.JSException,
                                                     _quickjs.StackOverflow)):
            raise _js_error(exc) from None
        raise


def where(db: str, code: Any, doc: dict[str, Any]) -> bool:
    """Does ``doc`` pass the ``$where`` function ``code``? (its result's JS truthiness)"""
    check_where(code)
    result = call(db, code, [], this=doc)
    if isinstance(result, (dict, list)):
        return True
    return bool(result)


# -- $function ---------------------------------------------------------------------------------

def function_expression(db: str, parser: Any, spec: Any) -> Any:
    """``$function`` inside mongomock's expression parser (``parser.parse`` evaluates the
    ``args`` expression against the current document)."""
    from shardsim.core.commands import bson_type_name
    if not isinstance(spec, dict):
        raise MongoError(31260, f"$function requires an object as an argument, found: "
                                f"{bson_type_name(spec)}")
    if "body" not in spec:
        raise MongoError(31261, "The body function must be specified.")
    body = spec["body"]
    if isinstance(body, dict):
        raise MongoError(31432, "The body function must be a constant expression")
    if not isinstance(body, (str, Code)) or (isinstance(body, Code) and body.scope is not None):
        raise MongoError(31262, "The body function must evaluate to type string or code")
    if "args" not in spec:
        raise MongoError(31263, "The args field must be specified.")
    if "lang" not in spec:
        raise MongoError(31418, "The lang field must be specified.")
    if spec["lang"] != "js":
        raise MongoError(31419, "Currently the only supported language specifier is 'js'.")
    if not enabled():
        raise MongoError(31264, "Cannot run server-side javascript without the javascript "
                                "engine enabled")
    raw_args = spec["args"]
    if isinstance(raw_args, list):  # an array literal: each element is an expression
        args: Any = []
        for item in raw_args:
            try:
                args.append(parser.parse(item))
            except KeyError:  # a missing field: undefined in mongod, null here
                args.append(None)
    else:
        args = parser.parse(raw_args)
    if not isinstance(args, list):
        raise MongoError(31266, "The args field must be of type array")
    return call(db, body, args)


# -- $accumulator ------------------------------------------------------------------------------

_ACC_FIELDS = ("init", "initArgs", "accumulate", "accumulateArgs", "merge", "finalize", "lang")


def parse_accumulator(spec: Any) -> dict[str, Any]:
    """``{$accumulator: {init, initArgs?, accumulate, accumulateArgs, merge, finalize?,
    lang?}}`` checked as ``AccumulatorJs::parse`` (``accumulator_js_reduce.cpp``): 4544703 not
    an object, 4544702 a function that is not a string or Code (4544701 an expression),
    4544704 / 4544705 ``lang`` not the string "js", 4544706 an unknown field, 4544707-4544710
    a missing ``init``/``accumulate``/``merge``/``accumulateArgs``."""
    from shardsim.core.commands import bson_type_name
    if not isinstance(spec, dict):
        raise MongoError(4544703, f"$accumulator expects an object as an argument; found: "
                                  f"{bson_type_name(spec)}")
    for name, value in spec.items():
        if name in ("init", "accumulate", "merge", "finalize"):
            if isinstance(value, dict):
                raise MongoError(4544701, f"$accumulator '{name}' must be a constant expression")
            if not isinstance(value, (str, Code)) or (isinstance(value, Code)
                                                      and value.scope is not None):
                raise MongoError(4544702, f"$accumulator '{name}' must be a String or Code")
        elif name == "lang":
            if not isinstance(value, str):
                raise MongoError(4544704, f"$accumulator lang must be a string; found: "
                                          f"{bson_type_name(value)}")
            if value != "js":
                raise MongoError(4544705, "$accumulator only supports lang: 'js'")
        elif name not in _ACC_FIELDS:
            raise MongoError(4544706, f"$accumulator got an unexpected field: {name}")
    for n, name in ((4544707, "init"), (4544708, "accumulate"), (4544709, "merge")):
        if not spec.get(name):
            raise MongoError(n, f"$accumulator missing required argument '{name}'")
    if "accumulateArgs" not in spec:
        raise MongoError(4544710, "$accumulator missing required argument 'accumulateArgs'")
    return spec


def accumulate_group(db: str, spec: dict[str, Any], docs: list[dict[str, Any]],
                     evaluate: Any) -> Any:
    """One group's ``$accumulator`` value: ``init(...initArgs)`` (``initArgs`` evaluated on the
    group's first document, 4544711 unless an array), then ``accumulate(state,
    ...accumulateArgs)`` per document (4544712 unless an array), then ``finalize(state)``, in
    one call into the engine per group, as mongod batches its calls
    (``AccumulatorJs::reduceMemoryConsumptionIfAble``). ``merge`` is parsed and not needed:
    the group runs in one place here. ``evaluate(expr, doc)``: the pipeline's expression
    evaluator."""
    if not enabled():
        raise MongoError(31264, "Cannot run server-side javascript without the javascript "
                                "engine enabled")
    init_args = evaluate(spec["initArgs"], docs[0]) if "initArgs" in spec and docs else []
    if not isinstance(init_args, list):
        raise MongoError(4544711, f"$accumulator initArgs must evaluate to an array: "
                                  f"{init_args!r}")
    pending = []
    for doc in docs:
        args = evaluate(spec["accumulateArgs"], doc)
        if not isinstance(args, list):
            raise MongoError(4544712, f"$accumulator accumulateArgs must evaluate to an array: "
                                      f"{args!r}")
        pending.append(args)
    finalize = f"state = {_source(spec['finalize'])}(state);" if spec.get("finalize") else ""
    body = (f"function(initArgs, pending) {{ var state = {_source(spec['init'])}"
            f".apply(null, initArgs); var acc = {_source(spec['accumulate'])};"
            f" for (var i = 0; i < pending.length; i++)"
            f" state = acc.apply(null, [state].concat(pending[i])); {finalize} return state; }}")
    return call(db, body, [init_args, pending])


def install() -> None:
    """Let mongomock's ``$group`` compute ``$accumulator`` fields (idempotent): they are taken
    out of the stage's accumulators, mongomock computes the rest, and the output keeps the
    specification's field order."""
    from mongomock import aggregate as mm_aggregate
    if getattr(mm_aggregate, "_shardsim_js", False):
        return
    orig = mm_aggregate._accumulate_group

    def evaluate(expr: Any, doc: dict[str, Any]) -> Any:
        if isinstance(expr, list):  # an array literal: each element is an expression
            return [evaluate(x, doc) for x in expr]
        try:
            return mm_aggregate._parse_expression(expr, doc)
        except KeyError:
            return None

    def _accumulate_group(output_fields: dict[str, Any], group_list: list[Any]) -> dict:
        js = {f: v["$accumulator"] for f, v in output_fields.items()
              if f != "_id" and isinstance(v, dict) and "$accumulator" in v}
        if not js:
            return orig(output_fields, group_list)
        rest = {f: v for f, v in output_fields.items() if f not in js}
        out = orig(rest, group_list) if len(rest) > 1 or "_id" not in rest else {}
        from shardsim.core.commands import CURRENT_REQUEST
        req = CURRENT_REQUEST.get()
        db = req.db if req is not None else "test"
        done = {f: accumulate_group(db, parse_accumulator(spec), group_list, evaluate)
                for f, spec in js.items()}
        return {f: done[f] if f in done else out[f] for f in output_fields
                if f != "_id" and (f in done or f in out)}

    mm_aggregate._accumulate_group = _accumulate_group
    mm_aggregate._shardsim_js = True


install()


# -- mapReduce ---------------------------------------------------------------------------------

_MR_FIELDS = frozenset({"mapReduce", "mapreduce", "map", "reduce", "out", "query", "sort",
                        "limit", "finalize", "scope", "jsMode", "verbose",
                        "bypassDocumentValidation", "collation", "writeConcern", "maxTimeMS",
                        "readConcern", "comment", "lsid", "txnNumber", "$db", "$clusterTime",
                        "$readPreference", "apiVersion", "apiStrict", "apiDeprecationErrors",
                        "$client", "$audit", "shardVersion", "databaseVersion"})


def parse_map_reduce(body: dict[str, Any]) -> dict[str, Any]:
    """The options of a ``mapReduce`` command (``map_reduce.idl``): ``map``/``reduce`` (and
    ``finalize``) string or Code (TypeMismatch 14 otherwise), ``out`` required (40414),
    ``{inline: 1}``, a collection name or ``{replace: <name>[, db]}`` (``merge``/``reduce``
    output modes and ``sharded`` are not built: NotImplemented 238), ``query``/``sort`` objects,
    ``limit`` a number, ``scope`` an object. 40415 for an unknown field. Returns ``{map,
    reduce, finalize, scope, query, sort, limit, out: None (inline) | (db or None, name)}``."""
    from shardsim.core.commands import bson_type_name
    for k in body:
        if k not in _MR_FIELDS:
            raise MongoError(40415, f"BSON field 'mapReduce.{k}' is an unknown field.")
    for k in ("map", "reduce", "out"):
        if k not in body:
            raise MongoError(40414, f"BSON field 'mapReduce.{k}' is missing but a required "
                                    f"field")
    for k in ("map", "reduce", "finalize"):
        if k in body and not isinstance(body[k], (str, Code)):
            if k == "finalize" and body[k] is None:
                continue
            raise MongoError(14, f"BSON field 'mapReduce.{k}' is the wrong type "
                                 f"'{bson_type_name(body[k])}', expected types "
                                 f"'[javascript, string]'")
    for k in ("query", "sort", "scope"):
        if body.get(k) is not None and not isinstance(body[k], dict):
            raise MongoError(14, f"BSON field 'mapReduce.{k}' is the wrong type "
                                 f"'{bson_type_name(body[k])}', expected type 'object'")
    out = body["out"]
    target: tuple[str | None, str] | None
    if isinstance(out, str):
        target = (None, out)
    elif isinstance(out, dict) and out.get("inline"):
        target = None
    elif isinstance(out, dict) and isinstance(out.get("replace"), str):
        db = out.get("db")
        target = (db if isinstance(db, str) else None, out["replace"])
    elif isinstance(out, dict) and ("merge" in out or "reduce" in out):
        raise MongoError(238, "mapReduce output modes 'merge' and 'reduce' are not supported "
                              "by shardsim")
    else:
        raise MongoError(2, f"'out' must be a string or an object with 'inline', 'replace', "
                            f"'merge' or 'reduce', found: {out!r}")
    limit = body.get("limit") or 0
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit < 0:
        raise MongoError(2, f"'limit' must be a non-negative number: {limit!r}")
    return {"map": body["map"], "reduce": body["reduce"], "finalize": body.get("finalize"),
            "scope": body.get("scope") or {}, "query": body.get("query") or {},
            "sort": body.get("sort") or None, "limit": int(limit), "out": target}


def map_reduce(db: str, docs: list[dict[str, Any]], spec: dict[str, Any]) -> list[dict[str, Any]]:
    """``[{_id: key, value}]`` of a mapReduce over ``docs`` (``spec`` from
    :func:`parse_map_reduce`), in ascending ``_id`` order: ``map`` called with ``this`` each
    document and an ``emit(key, value)`` global, ``reduce(key, values)`` for each key emitted
    more than once (a key emitted once keeps its value, as mongod), ``finalize(key, value)``;
    ``scope``'s fields are globals. One engine call for the whole job. 31264 when JavaScript is
    off; 139 for a JS error."""
    if not enabled():
        raise MongoError(31264, "Cannot run server-side javascript without the javascript "
                                "engine enabled")
    fin = f"var fin = {_source(spec['finalize'])};" if spec.get("finalize") else "var fin = null;"
    body = (
        "function(docs, scope) {"
        " for (var name in scope) globalThis[name] = scope[name];"
        f" var map = {_source(spec['map'])}; var reduce = {_source(spec['reduce'])}; {fin}"
        " var order = [], groups = {};"
        " globalThis.emit = function(k, v) { var s = JSON.stringify(k === undefined ? null : k);"
        "   if (!(s in groups)) { groups[s] = {k: k === undefined ? null : k, v: []};"
        "     order.push(s); }"
        "   groups[s].v.push(v === undefined ? null : v); };"
        " for (var i = 0; i < docs.length; i++) map.call(docs[i]);"
        " var out = [];"
        " for (var j = 0; j < order.length; j++) { var g = groups[order[j]];"
        "   var v = g.v.length == 1 ? g.v[0] : reduce(g.k, g.v);"
        "   if (fin) v = fin(g.k, v); out.push({_id: g.k, value: v}); }"
        " return out; }")
    results = call(db, body, [docs, spec.get("scope") or {}])
    from shardsim.core.query import sort_docs
    return sort_docs(results or [], {"_id": 1})
