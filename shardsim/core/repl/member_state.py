"""Member states as the server numbers and names them (src/mongo/db/repl/member_state.h,
``MemberState::MS`` and ``toString``), and the errors of the replication core.

The errors are plain data (``code``, ``codeName``, ``errmsg``) so this package needs no other
shardsim module; the node that drives the core turns a :class:`ReplError` into its MongoError.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class MemberState(IntEnum):
    """``replSetGetStatus`` ``members[].state``; :attr:`state_str` is ``stateStr``."""

    STARTUP = 0
    PRIMARY = 1
    SECONDARY = 2
    RECOVERING = 3
    STARTUP2 = 5
    UNKNOWN = 6
    ARBITER = 7
    DOWN = 8
    ROLLBACK = 9
    REMOVED = 10

    @property
    def state_str(self) -> str:
        """``PRIMARY``, ``SECONDARY``, ... (``(not reachable/healthy)`` for DOWN, as the server)."""
        return "(not reachable/healthy)" if self is MemberState.DOWN else self.name


@dataclass  # not frozen: re-raising sets __traceback__ (contextlib.contextmanager does)
class ReplError(Exception):
    """A MongoDB error produced by the core: ``code``, ``code_name`` and ``errmsg`` match what
    mongod sends for the same situation (src/mongo/base/error_codes.yml)."""

    __hash__ = Exception.__hash__  # equal by value, hashable as any exception

    code: int
    code_name: str
    errmsg: str

    def to_doc(self) -> dict:
        """``{ok: 0, errmsg, code, codeName}``."""
        return {"ok": 0.0, "errmsg": self.errmsg, "code": self.code, "codeName": self.code_name}


def bad_value(msg: str) -> ReplError:
    """BadValue 2."""
    return ReplError(2, "BadValue", msg)


def not_writable_primary(msg: str = "not primary") -> ReplError:
    """NotWritablePrimary 10107."""
    return ReplError(10107, "NotWritablePrimary", msg)


def interrupted_due_to_repl_state_change(msg: str = "operation was interrupted") -> ReplError:
    """InterruptedDueToReplStateChange 11602 (operations killed at stepdown or rollback)."""
    return ReplError(11602, "InterruptedDueToReplStateChange", msg)


def primary_stepped_down() -> ReplError:
    """PrimarySteppedDown 189: what every ``w`` waiter gets when the primary steps down or the
    term changes (``ReplicationCoordinatorImpl::_updateMemberStateFromTopologyCoordinator``)."""
    return ReplError(189, "PrimarySteppedDown",
                     "Primary stepped down while waiting for replication")
