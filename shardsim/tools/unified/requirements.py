"""``runOnRequirements`` evaluation and the facts about the deployment it needs.

Rules from ``unified-test-format.md`` §runOnRequirement and §Version String: a list of
requirements is satisfied when ANY element is; an element is satisfied when ALL its fields are.
File-level and test-level lists must both be satisfied. Every unsatisfied list yields a
human-readable reason (e.g. ``"needs server <= 4.2.99 (server is 8.0.0)"``) for the skip table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

SUPPORTED_SCHEMA = (1, 28)  # highest unified-format schema version this runner accepts
TOPOLOGIES = ("single", "replicaset", "sharded", "sharded-replicaset", "load-balanced")


def parse_version(text: str | Sequence[int]) -> tuple[int, int, int]:
    """``"4.9.0-alpha4-271-g7d5cf02"`` / ``"4.2"`` / ``[8, 0, 1, 0]`` → ``(major, minor, patch)``.

    Missing components are zero; anything after the patch (or a non-numeric suffix) is dropped.
    Raises ValueError for an empty/non-numeric major.
    """
    if not isinstance(text, str):
        parts = [int(x) for x in list(text)[:3]]
    else:
        parts = []
        for piece in text.split(".")[:3]:
            digits = ""
            for ch in piece:
                if not ch.isdigit():
                    break
                digits += ch
            if not digits:
                break
            parts.append(int(digits))
            if len(digits) != len(piece):
                break
    if not parts:
        raise ValueError(f"invalid version string {text!r}")
    while len(parts) < 3:
        parts.append(0)
    return (parts[0], parts[1], parts[2])


def fmt_version(v: tuple[int, ...]) -> str:
    return ".".join(str(x) for x in v)


@dataclass
class ServerInfo:
    """What ``runOnRequirements`` is evaluated against.

    ``version``: from ``buildInfo.versionArray`` (first three elements). ``topology``: one of
    ``single|replicaset|sharded|load-balanced``; ``shards_are_replica_sets`` for
    ``sharded-replicaset``. ``get_parameter(name)`` returns the server parameter's value or
    raises (→ requirement not met). ``serverless``/``auth``/``csfle`` describe this environment.
    """

    version: tuple[int, int, int]
    topology: str
    serverless: bool = False
    auth: bool = False
    auth_mechanisms: Sequence[str] = ()
    csfle: bool = False
    shards_are_replica_sets: bool = True
    get_parameter: Callable[[str], Any] | None = None
    _param_cache: dict = field(default_factory=dict)

    def parameter(self, name: str) -> Any:
        if name not in self._param_cache:
            if self.get_parameter is None:
                raise LookupError(name)
            try:
                self._param_cache[name] = ("ok", self.get_parameter(name))
            except Exception as exc:  # unsupported parameter: the requirement is not met
                self._param_cache[name] = ("err", exc)
        kind, value = self._param_cache[name]
        if kind == "err":
            raise LookupError(name) from value
        return value


def _values_equal(expected: Any, actual: Any) -> bool:
    # Flexible numeric comparison (int/long/double equal by value; bool is not a number).
    num = (int, float)
    if isinstance(expected, num) and isinstance(actual, num) \
            and not isinstance(expected, bool) and not isinstance(actual, bool):
        return expected == actual
    return type(expected) is type(actual) and expected == actual


def unmet(req: Mapping[str, Any], info: ServerInfo) -> list[str]:
    """Reasons why one runOnRequirement element is not satisfied (empty list = satisfied)."""
    reasons: list[str] = []
    if "minServerVersion" in req:
        want = parse_version(req["minServerVersion"])
        if info.version < want:
            reasons.append(f"needs server >= {req['minServerVersion']} "
                           f"(server is {fmt_version(info.version)})")
    if "maxServerVersion" in req:
        want = parse_version(req["maxServerVersion"])
        if info.version > want:
            reasons.append(f"needs server <= {req['maxServerVersion']} "
                           f"(server is {fmt_version(info.version)})")
    if "topologies" in req:
        tops = list(req["topologies"])
        ok = info.topology in tops
        if not ok and info.topology == "sharded" and "sharded-replicaset" in tops:
            ok = info.shards_are_replica_sets
        if not ok:
            reasons.append(f"needs topology {'/'.join(tops)} (deployment is {info.topology})")
    serverless = req.get("serverless", "allow")
    if serverless == "require" and not info.serverless:
        reasons.append("needs Atlas Serverless")
    elif serverless == "forbid" and info.serverless:
        reasons.append("forbidden on Atlas Serverless")
    if "auth" in req:
        if req["auth"] and not info.auth:
            reasons.append("needs authentication enabled")
        elif not req["auth"] and info.auth:
            reasons.append("needs authentication disabled")
    if "authMechanism" in req:
        mech = str(req["authMechanism"]).lower()
        if mech not in [m.lower() for m in info.auth_mechanisms]:
            reasons.append(f"needs auth mechanism {req['authMechanism']}")
    if "csfle" in req:
        want = req["csfle"]
        if want is False:
            if info.csfle:
                reasons.append("needs CSFLE unsupported")
        elif not info.csfle:
            reasons.append("needs client-side field level encryption (libmongocrypt)")
    if "serverParameters" in req:
        for name, value in req["serverParameters"].items():
            try:
                actual = info.parameter(name)
            except LookupError:
                reasons.append(f"needs server parameter {name}={value!r} (not supported)")
                continue
            if not _values_equal(value, actual):
                reasons.append(f"needs server parameter {name}={value!r} (is {actual!r})")
    known = {"minServerVersion", "maxServerVersion", "topologies", "serverless", "auth",
             "authMechanism", "csfle", "serverParameters"}
    for key in req:
        if key not in known:
            reasons.append(f"unknown runOnRequirement field {key!r}")
    return reasons


def skip_reason(reqs: Sequence[Mapping[str, Any]] | None, info: ServerInfo) -> str | None:
    """``None`` when ``reqs`` (a runOnRequirements list) is satisfied, else the reason.

    With several alternatives the reasons are joined with ``" or "`` (each one failed).
    """
    if not reqs:
        return None
    all_reasons = []
    for req in reqs:
        reasons = unmet(req, info)
        if not reasons:
            return None
        all_reasons.append("; ".join(reasons))
    # Drop duplicates but keep the order.
    seen: list[str] = []
    for r in all_reasons:
        if r not in seen:
            seen.append(r)
    return " or ".join(seen)


def check_schema_version(text: str) -> None:
    """Raise ValueError if a file's ``schemaVersion`` is not supported by this runner (1.0-1.28)."""
    v = parse_version(text)
    if v[0] != SUPPORTED_SCHEMA[0] or v[1] > SUPPORTED_SCHEMA[1]:
        raise ValueError(f"unsupported schemaVersion {text} (runner supports 1.0 - "
                         f"{SUPPORTED_SCHEMA[0]}.{SUPPORTED_SCHEMA[1]})")
