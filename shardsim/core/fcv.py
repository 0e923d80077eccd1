"""``setFeatureCompatibilityVersion``: the featureCompatibilityVersion (FCV) of a cluster whose
members may run different binaries (a rolling upgrade), and what it gates.

Every node holds ``node.fcv`` (``getParameter featureCompatibilityVersion``), set at start from
``options["fcv"]`` (the test kit gives a mixed cluster its lowest binary's FCV,
:func:`shardsim.core.server_version.cluster_fcv`) or the binary's own FCV. The command, as
``set_feature_compatibility_version_command.cpp`` (``SetFeatureCompatibilityVersionCommand::run``)
and the sharded protocol have it, without the transitional states (``targetVersion``) and phases:

- on the router: forwarded to the config server as it is (mongos' ``setFeatureCompatibilityVersion``
  runs on the config server); the router then records the new FCV too;
- on the config server: validated, then applied to every shard (``fromConfigServer: true``), then
  to itself; when a shard refuses (its binary cannot run at that FCV), the shards already changed
  are set back and its error is the reply;
- on a shard or a lone node: validated and applied.

Validation, in the server's order: ``confirm`` is an unknown field on 6.0 (40415; 7.0+ have it);
the value must be one the binary runs at (``valid_fcvs``: lastLTS, lastContinuous, latest), else
BadValue (2) "Invalid feature compatibility version value '<v>'. Expected one of the following
versions: ..." (``FeatureCompatibilityVersionParser::parseVersion``); the same FCV is a no-op;
any change without ``confirm: true`` on 7.0+ fails with 7369100 (the upgrade / downgrade messages
of ``SetFeatureCompatibilityVersionCommand::run``).

What the FCV gates here: the router's v2 change-stream reader needs FCV 9.0 (its feature flag,
``featureFlagChangeStreamPreciseShardTargeting``, is enabled by FCV); a downgrade on the config
server clears ``config.placementHistory`` ("likely due to an FCV downgrade, which clears the
placement history information", ``change_stream_db_present_state_event_handler.cpp``), so a v2
stream asked for a time before the next upgrade falls back to v1 (``node.on_fcv_change``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardsim.core.auth import privileges as priv
from shardsim.core.commands import CommandFamily, Request, bson_type_name
from shardsim.core.errors import MongoError
from shardsim.core.server_version import fcv_key

if TYPE_CHECKING:
    from shardsim.core.node import Node

commands = CommandFamily("fcv")

_UPGRADE_MSG = ("Once you have upgraded to {}, you will not be able to downgrade FCV and binary "
                "version without support assistance. Please re-run this command with 'confirm: "
                "true' to acknowledge this and continue with the FCV upgrade.")
_DOWNGRADE_MSG = ("Once you have downgraded the FCV, if you choose to downgrade the binary "
                  "version, it will require support assistance. Please re-run this command with "
                  "'confirm: true' to acknowledge this and continue with the FCV downgrade.")
_FIELDS = frozenset({"setFeatureCompatibilityVersion", "confirm", "fromConfigServer",
                     "writeConcern", "comment", "lsid", "$db", "$clusterTime", "$readPreference",
                     "apiVersion", "apiStrict", "apiDeprecationErrors", "maxTimeMS"})


def validate(node: "Node", req: Request) -> str | None:
    """The requested FCV, or None when it is the node's already (a no-op). Raises the errors of
    the module docstring."""
    for k in req.body:
        if k not in _FIELDS or (k == "confirm" and node.profile.version_array[0] < 7):
            raise MongoError(40415, f"BSON field 'setFeatureCompatibilityVersion.{k}' is an "
                                    "unknown field.")
    requested = req.arg
    if not isinstance(requested, str):
        raise MongoError(14, "BSON field 'setFeatureCompatibilityVersion.setFeatureCompatibilityVersion' "
                             f"is the wrong type '{bson_type_name(requested)}', expected type 'string'")
    confirm = req.get("confirm", False)
    if not isinstance(confirm, bool):
        raise MongoError(14, "BSON field 'setFeatureCompatibilityVersion.confirm' is the wrong type "
                             f"'{bson_type_name(confirm)}', expected type 'bool'")
    valid = node.profile.valid_fcvs
    if requested not in valid:
        listed = ", ".join(f"'{v}'" for v in valid)
        raise MongoError(2, f"Invalid feature compatibility version value '{requested}'. Expected "
                            f"one of the following versions: '{listed}")
    if requested == node.fcv:
        return None
    if node.profile.version_array[0] >= 7 and not confirm and not req.get("fromConfigServer"):
        up = fcv_key(requested) > fcv_key(node.fcv)
        raise MongoError(7369100, _UPGRADE_MSG.format(requested) if up else _DOWNGRADE_MSG)
    return requested


async def _set_local(node: "Node", fcv: str) -> None:
    old, node.fcv = node.fcv, fcv
    await node.on_fcv_change(old, fcv)


@commands.handler("setFeatureCompatibilityVersion",
                  privileges=priv.on_cluster("setFeatureCompatibilityVersion"))
async def set_feature_compatibility_version(node: "Node", req: Request) -> dict[str, Any]:
    """``{setFeatureCompatibilityVersion: "<x.y>", confirm?}`` -> ``{}`` (see the module
    docstring for the roles and the errors)."""
    if node.role == "router":
        from shardsim.core.gossip import gossip_command
        body = {k: v for k, v in req.body.items() if k not in ("$db", "$clusterTime", "lsid")}
        await gossip_command(node.clock, node.config_pool, "admin", body)  # type: ignore[attr-defined]
        if req.arg in node.profile.valid_fcvs:
            node.fcv = str(req.arg)
        return {}
    requested = validate(node, req)
    if requested is None:
        return {}
    if node.role == "configsvr":
        old = node.fcv
        done: list[str] = []
        body = {"setFeatureCompatibilityVersion": requested, "fromConfigServer": True}
        try:
            for shard in [s["_id"] for s in await node.shards()]:  # type: ignore[attr-defined]
                await node.on_shard(shard, "admin", body)  # type: ignore[attr-defined]
                done.append(shard)
        except MongoError:
            for shard in done:  # set back the shards already changed
                try:
                    await node.on_shard(shard, "admin",  # type: ignore[attr-defined]
                                        {"setFeatureCompatibilityVersion": old,
                                         "fromConfigServer": True})
                except MongoError:
                    pass
            raise
    await _set_local(node, requested)
    return {}
