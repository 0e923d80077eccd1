"""The one contract between roles: every internal request declared once.

* :mod:`.shard`: what a shard (or the config server, a mongod) answers for another role;
* :mod:`.configsvr`: what the config server answers for a router;
* :mod:`.versions`: placement versions and the network errors;
* :mod:`.base`: how a request is declared, built (:meth:`~.base.InternalRequest.to_command`)
  and parsed (:meth:`~.base.InternalRequest.parse`).

No ``_shardsim*`` / ``_configsvr*`` command name is spelled anywhere else
(``tests/unit/test_protocol.py`` checks it).
"""

from shardsim.core.protocol import configsvr, shard, versions
from shardsim.core.protocol.base import REGISTRY, InternalRequest

__all__ = ["configsvr", "shard", "versions", "REGISTRY", "InternalRequest"]
