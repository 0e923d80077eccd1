"""What every role's ``explain`` shares (``explain_options.cpp``, ``explain_common.cpp``,
``canonical_query_encoder.cpp``): the verbosity, ``serverInfo``/``serverParameters``, the
``parsedQuery`` of a filter and the query's hashes.

* ``verbosity``: ``"queryPlanner"``, ``"executionStats"`` or ``"allPlansExecution"`` (the
  default of the ``explain`` command); anything else FailedToParse (9).
* The explained command must be an object whose first field names a command: 9 otherwise.
"""

from __future__ import annotations

import socket
import zlib
from typing import Any

from bson import json_util

from shardsim.core.errors import MongoError
from shardsim.core.node_commands import SERVER_VERSION

VERBOSITIES = ("queryPlanner", "executionStats", "allPlansExecution")
_MIB100 = 104857600


def parse_request(body: dict[str, Any]) -> tuple[str, dict[str, Any], str]:
    """``(inner command name, inner command, verbosity)`` of ``{explain: <cmd>, verbosity}``."""
    inner = body.get("explain")
    if not isinstance(inner, dict) or not inner:
        raise MongoError(9, "explain command requires a nested object")
    verbosity = body.get("verbosity", "allPlansExecution")
    if verbosity not in VERBOSITIES:
        raise MongoError(9, "verbosity string must be one of {'queryPlanner', "
                            "'executionStats', 'allPlansExecution'}")
    return next(iter(inner)), inner, verbosity


def server_info(port: int, version: str = SERVER_VERSION) -> dict[str, Any]:
    """``serverInfo``: ``{host, port, version, gitVersion}`` (host: the machine's name;
    ``version``: the node's server-version profile, ``buildInfo.version``)."""
    return {"host": socket.gethostname(), "port": port, "version": version,
            "gitVersion": "shardsim"}


def server_parameters() -> dict[str, Any]:
    """``serverParameters``: the memory limits mongod 8.0 reports with every explain."""
    return {"internalQueryFacetBufferSizeBytes": _MIB100,
            "internalQueryFacetMaxOutputDocSizeBytes": _MIB100,
            "internalLookupStageIntermediateDocumentMaxSizeBytes": _MIB100,
            "internalDocumentSourceGroupMaxMemoryBytes": _MIB100,
            "internalQueryMaxBlockingSortMemoryUsageBytes": _MIB100,
            "internalQueryProhibitBlockingMergeOnMongoS": 0,
            "internalQueryMaxAddToSetBytes": _MIB100,
            "internalDocumentSourceSetWindowFieldsMaxMemoryBytes": _MIB100,
            "internalQueryFrameworkControl": "trySbeRestricted",
            "internalQueryPlannerIgnoreIndexWithCollationForRegex": 1}


def _leaf(field: str, value: Any) -> list[dict[str, Any]]:
    """``{field: value}`` as MatchExpression serializes it: implicit equality as ``$eq``,
    several operators as one clause each."""
    if isinstance(value, dict) and value and all(str(k).startswith("$") for k in value):
        if len(value) == 1 or "$options" in value:
            return [{field: dict(value)}]
        return [{field: {op: arg}} for op, arg in value.items()]
    return [{field: {"$eq": value}}]


def parsed_query(filt: dict[str, Any] | None) -> dict[str, Any]:
    """``parsedQuery``: ``{}``, one clause, or ``{$and: [clauses]}``."""
    clauses: list[dict[str, Any]] = []
    for k, v in (filt or {}).items():
        if k in ("$and", "$or", "$nor") and isinstance(v, list):
            clauses.append({k: [parsed_query(c) for c in v]})
        elif k.startswith("$"):
            clauses.append({k: v})
        else:
            clauses.extend(_leaf(k, v))
    if not clauses:
        return {}
    return clauses[0] if len(clauses) == 1 else {"$and": clauses}


def query_hashes(ns: str, filt: Any, sort: Any, projection: Any) -> tuple[str, str]:
    """``(queryHash, planCacheKey)``: 8 upper-case hex digits over the query's shape."""
    shape = json_util.dumps({"ns": ns, "q": _shape(filt), "s": sort, "p": projection})
    qh = zlib.crc32(shape.encode()) & 0xFFFFFFFF
    pk = zlib.crc32(f"{shape}|key".encode()) & 0xFFFFFFFF
    return f"{qh:08X}", f"{pk:08X}"


def _shape(v: Any) -> Any:
    """A filter with its constants replaced (the shape the hashes are over)."""
    if isinstance(v, dict):
        return {k: _shape(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_shape(x) for x in v]
    return "?"
