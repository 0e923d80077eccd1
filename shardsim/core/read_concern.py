"""``readConcern`` parsing and the rules every role applies before running a command
(``repl/read_concern_args.cpp``, ``service_entry_point_common.cpp`` ``_extractReadConcern``,
``read_concern_mongod.cpp`` ``waitForReadConcern``).

* ``level``: local, majority, linearizable, available or snapshot (BadValue 2 otherwise);
  ``afterClusterTime``/``atClusterTime`` must be Timestamps (TypeMismatch 14), not both
  (InvalidOptions 72), ``atClusterTime`` only with ``snapshot`` (72), neither beyond the node's
  cluster time (72).
* ``snapshot`` outside a transaction is only for ``find``, ``aggregate`` and ``distinct``
  (5.0+); any other command fails with InvalidOptions (72) "Command X does not support
  { readConcern: ... }", but ``getMore``/``killCursors`` (:data:`CURSOR_COMMANDS`), which take
  any level and ignore it (the cursor keeps its creator's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bson.timestamp import Timestamp

from shardsim.core.errors import MongoError

LEVELS = ("local", "majority", "linearizable", "available", "snapshot")
# Commands that take any readConcern and ignore it: a cursor "uses the readConcern setting from
# whatever created the cursor" (getmore_cmd.cpp / killcursors: supportsReadConcern answers
# allSupportedAndDefaultPermitted); drivers send a snapshot session's readConcern on getMore.
CURSOR_COMMANDS = frozenset({"getMore", "killCursors"})
# Commands that accept readConcern level snapshot outside a transaction (5.0+) declare
# ``snapshot=True`` (shardsim.core.commands.CommandSpec); callers pass ``snapshot_ok``.


@dataclass
class ReadConcern:
    """A parsed readConcern: ``level`` (None when not given), ``after``/``at`` Timestamps."""

    level: str | None = None
    after: Timestamp | None = None
    at: Timestamp | None = None

    @property
    def snapshot(self) -> bool:
        return self.level == "snapshot"


def _describe(rc: dict[str, Any]) -> str:
    parts = ", ".join(f"{k}: {v!r}" if not isinstance(v, str) else f'{k}: "{v}"'
                      for k, v in rc.items())
    return "{ " + parts + " }" if parts else "{}"


def parse(body: dict[str, Any], command: str, clock_now: Timestamp, *,
          snapshot_ok: bool = False) -> ReadConcern | None:
    """The command's readConcern, validated (see the module doc), or None when absent.
    ``command`` is the canonical command name, ``clock_now`` the node's cluster time."""
    rc = body.get("readConcern")
    if rc is None:
        return None
    if not isinstance(rc, dict):
        raise MongoError(14, "BSON field 'readConcern' is the wrong type, expected type "
                             "'object'")
    out = ReadConcern()
    for key, value in rc.items():
        if key == "level":
            if not isinstance(value, str):
                raise MongoError(14, "BSON field 'readConcern.level' is the wrong type, "
                                     "expected type 'string'")
            if value not in LEVELS:
                raise MongoError(2, f"Enumeration value '{value}' for field 'readConcern.level' "
                                    f"is not a valid value.")
            out.level = value
        elif key in ("afterClusterTime", "atClusterTime"):
            if not isinstance(value, Timestamp):
                raise MongoError(14, f"BSON field 'readConcern.{key}' is the wrong type, "
                                     f"expected type 'timestamp'")
            setattr(out, "after" if key == "afterClusterTime" else "at", value)
        elif key in ("afterOpTime", "provenance", "allowTransactionTableSnapshot",
                     "waitLastStableRecoveryTimestamp"):
            continue
        else:
            raise MongoError(40415, f"BSON field 'readConcern.{key}' is an unknown field.")
    if out.after is not None and out.at is not None:
        raise MongoError(72, "Can not specify both afterClusterTime and atClusterTime")
    if out.at is not None and not out.snapshot:
        raise MongoError(72, "atClusterTime field can be set only if level is snapshot")
    for name, ts in (("afterClusterTime", out.after), ("atClusterTime", out.at)):
        if ts is not None and ts > clock_now:
            raise MongoError(72, f"readConcern {name} value must not be greater than the "
                                 f"current clusterTime. Requested clusterTime: {ts}; current "
                                 f"clusterTime: {clock_now}")
    in_txn = body.get("autocommit") is False
    if out.snapshot and not in_txn and not snapshot_ok:
        raise MongoError(72, f"Command {command} does not support {_describe(rc)} :: caused "
                             f"by :: read concern not supported")
    return out


def attach_cluster_time(reply: dict[str, Any], at: Timestamp) -> None:
    """Put a snapshot read's ``atClusterTime`` where mongod/mongos send it: in ``cursor`` for
    find/aggregate, at the top for distinct."""
    cursor = reply.get("cursor")
    if isinstance(cursor, dict):
        cursor["atClusterTime"] = at
    else:
        reply["atClusterTime"] = at
