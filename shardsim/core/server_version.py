"""Server-version profiles: which MongoDB release a shardsim process pretends to be.

A :class:`ServerProfile` carries what a client can observe of the release (``buildInfo``
``version``/``versionArray``, ``hello`` ``maxWireVersion``, the ``featureCompatibilityVersion``
parameter) and flags named by the change-stream behaviour they switch. Every role reads its
profile from ``options["server_version"]`` (``--server-version`` on ``python -m shardsim.<role>``
and ``shardsim up``; ``ShardedCluster(server_version=...)`` in the test kit); the default is
``8.0``, the behaviour shardsim had before profiles existed.

Sources (see docs/versions.md for the table): wire versions from the drivers' wire tables
(6.0 = 17, 7.0 = 21, 8.0 = 25, 8.2 = 27); resume-token version 1 on 6.0 (mongos sends
``$_generateV2ResumeTokens: false``, ``src/mongo/db/pipeline/resume_token.cpp``); the 8.2.0-only
fields (SERVER-86688, reverted by SERVER-109626 in 8.2.1); ``nsType`` on ``create`` since 8.1
(change-streams spec ``@since 8.1.0``); the 9.0 ``$changeStream`` fields ``version`` and
``ignoreRemovedShards`` (``document_source_change_stream.cpp``, SERVER-121161/-121162).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

__all__ = ["ServerProfile", "PROFILES", "DEFAULT", "get", "names", "click_option",
           "NEW_SHARD_OPS", "new_shard_op_name", "fcv_key", "cluster_fcv"]

# The internal event a shard emits for an ``o2.migrateChunkToNewShard`` no-op (a chunk moved to a
# shard that had none of the collection): ``DocumentSourceChangeStream::kNewShardDetectedOpType``,
# ``"kNewShardDetected"`` up to 6.0 and ``"migrateChunkToNewShard"`` after
# (``document_source_change_stream.h``). The 6.x/7.0 shards pick the name by the stream's token
# version (``change_stream_helpers_legacy.cpp`` ``change_stream_legacy::getNewShardDetectedOpName``,
# "TODO SERVER-66138: This function can be removed after we branch for 7.0"): the new name for
# the default version 2, ``"kNewShardDetected"`` ("the op name on 6.0 and older versions") for
# v1 tokens, i.e. for a 6.0 router, which asks for ``$_generateV2ResumeTokens: false``. From 8.0
# on the shard always uses the new name.
NEW_SHARD_OPS = frozenset({"kNewShardDetected", "migrateChunkToNewShard"})


def new_shard_op_name(token_version: int, profile: "ServerProfile | None" = None) -> str:
    """The ``operationType`` of the new-shard event a shard of ``profile`` (default 8.0) emits in
    a stream making ``token_version`` tokens (see :data:`NEW_SHARD_OPS`)."""
    legacy = profile is not None and profile.version_array[0] < 8
    return "kNewShardDetected" if legacy and token_version < 2 else "migrateChunkToNewShard"


@dataclass(frozen=True, eq=False)  # profiles are singletons: identity equality
class ServerProfile:
    """One release's observable behaviour.

    ``name``: the ``--server-version`` value (``"6.0"``, ``"8.2.0"``...). ``version`` /
    ``version_array``: ``buildInfo`` (``versionArray`` has four ints). ``max_wire_version``:
    ``hello``. ``fcv``: ``getParameter featureCompatibilityVersion.version``.
    Flags: ``resume_token_version`` (1 on 6.0: ``eventIdentifier`` = documentKey for classic
    events; 2 after; the new-shard event's name follows the token version, see
    :func:`new_shard_op_name`);
    ``refine_reshard_events`` (refineCollectionShardKey/reshardCollection expanded events
    without their feature flag, 7.0+); ``disambiguated_paths`` (7.0+, ``showExpandedEvents``);
    ``provenance`` (``operationDescription.provenance``, 8.0+); ``commands_80`` (moveCollection,
    unshardCollection exist: 8.0+); ``expanded_fields_always`` (8.2.0 only: ``collectionUUID``,
    ``updateDescription.disambiguatedPaths`` and ``commitTimestamp`` without
    showExpandedEvents); ``ns_type`` (``nsType`` on ``create`` events: 8.1+ per the spec;
    shardsim's 8.0 has always emitted it, so the 8.0 profile keeps it, see docs/versions.md);
    ``change_stream_version_field`` (``$changeStream.version: "v1"|"v2"`` is parsed, 8.2+:
    jstests ``change_streams_version_field`` is tagged ``requires_fcv_82``);
    ``ignore_removed_shards`` (``$changeStream.ignoreRemovedShards``, 9.0);
    ``show_commit_timestamp`` (the internal ``showCommitTimestamp`` shows ``commitTimestamp``
    on events of prepared transactions: 8.2.1+, SERVER-109626; accepted and ignored before);
    ``change_stream_reader_v2`` (the router's v2 reader, precise shard targeting, for
    ``version: "v2"`` streams: 9.0; router/change_stream/reader_v2.py); ``valid_fcvs`` (the
    featureCompatibilityVersion values the binary can run at, oldest first; the last is
    ``fcv``).
    """

    name: str
    version: str
    version_array: tuple[int, int, int, int]
    max_wire_version: int
    fcv: str
    resume_token_version: int = 2
    refine_reshard_events: bool = True
    disambiguated_paths: bool = True
    provenance: bool = True
    commands_80: bool = True
    expanded_fields_always: bool = False
    ns_type: bool = True
    change_stream_version_field: bool = False
    ignore_removed_shards: bool = False
    show_commit_timestamp: bool = False
    change_stream_reader_v2: bool = False
    # the featureCompatibilityVersion values the binary runs at: lastLTS, lastContinuous, latest
    # (FeatureCompatibilityVersionParser; "expected '6.0' or '6.3' or '7.0'" from a 7.0 binary)
    valid_fcvs: tuple[str, ...] = ()
    # error codes the release labels ResumableChangeStreamError beyond 8.0's, and codeNames it
    # spells differently (6.0: 63 StaleShardVersion, a NeedRetargettingError; OBSOLETE in 7.0)
    extra_resumable_codes: frozenset[int] = frozenset()
    code_names: Mapping[int, str] = field(default_factory=dict)

    @property
    def is_default(self) -> bool:
        """True for the 8.0 profile (shardsim's behaviour without a profile)."""
        return self.name == "8.0"


PROFILES: dict[str, ServerProfile] = {p.name: p for p in (
    ServerProfile("6.0", "6.0.20", (6, 0, 20, 0), 17, "6.0", resume_token_version=1,
                  valid_fcvs=("5.0", "5.3", "6.0"),
                  refine_reshard_events=False,
                  disambiguated_paths=False, provenance=False, commands_80=False, ns_type=False,
                  extra_resumable_codes=frozenset({63}), code_names={63: "StaleShardVersion"}),
    ServerProfile("7.0", "7.0.16", (7, 0, 16, 0), 21, "7.0", provenance=False,
                  valid_fcvs=("6.0", "6.3", "7.0"),
                  commands_80=False, ns_type=False),
    ServerProfile("8.0", "8.0.4", (8, 0, 4, 0), 25, "8.0", valid_fcvs=("7.0", "7.3", "8.0")),
    ServerProfile("8.2.0", "8.2.0", (8, 2, 0, 0), 27, "8.2", expanded_fields_always=True,
                  valid_fcvs=("8.0", "8.2"),
                  change_stream_version_field=True),
    ServerProfile("8.2", "8.2.1", (8, 2, 1, 0), 27, "8.2", change_stream_version_field=True,
                  valid_fcvs=("8.0", "8.2"),
                  show_commit_timestamp=True),
    # 9.0's wire version: 8.3 = 28 and 9.0 follows it (inferred, see docs/versions.md).
    ServerProfile("9.0", "9.0.1", (9, 0, 1, 0), 29, "9.0", valid_fcvs=("8.0", "8.3", "9.0"),
                  change_stream_version_field=True, ignore_removed_shards=True,
                  show_commit_timestamp=True, change_stream_reader_v2=True),
)}

DEFAULT = PROFILES["8.0"]


def fcv_key(fcv: str) -> tuple[int, int]:
    """``"8.0"`` -> ``(8, 0)``, for comparing featureCompatibilityVersion values."""
    major, _, minor = str(fcv).partition(".")
    return int(major), int(minor or 0)


def cluster_fcv(profiles: "list[ServerProfile]") -> str:
    """The featureCompatibilityVersion a cluster of members with these binaries starts at: the
    lowest binary's (a rolling upgrade replaces binaries first and raises the FCV last, with
    ``setFeatureCompatibilityVersion``). ValueError when some binary cannot run at it (a binary
    runs at its lastLTS, lastContinuous or latest FCV only: ``valid_fcvs``)."""
    fcv = min((p.fcv for p in profiles), key=fcv_key)
    for p in profiles:
        if fcv not in p.valid_fcvs:
            raise ValueError(f"a {p.name} binary cannot run at featureCompatibilityVersion {fcv} "
                             f"(it runs at {', '.join(p.valid_fcvs)})")
    return fcv


def names() -> list[str]:
    """The accepted ``--server-version`` values, oldest first."""
    return list(PROFILES)


def get(name: str | ServerProfile | None) -> ServerProfile:
    """The profile called ``name`` (None: the 8.0 default). ValueError for an unknown name."""
    if name is None:
        return DEFAULT
    if isinstance(name, ServerProfile):
        return name
    try:
        return PROFILES[str(name)]
    except KeyError:
        raise ValueError(f"unknown server version {name!r}; one of {', '.join(PROFILES)}") from None


def click_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """The ``--server-version`` click option (a ``server_version`` str argument)."""
    import click
    return click.option("--server-version", "server_version", type=click.Choice(names()),
                        default=DEFAULT.name, show_default=True,
                        help="MongoDB release to behave as (docs/versions.md).")(func)
