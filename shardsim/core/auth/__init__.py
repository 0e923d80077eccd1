"""Authentication and authorization as mongod and mongos do them (docs/security.md).

SCRAM-SHA-1/SHA-256 conversations (:mod:`.scram`, on the ``scramp`` library), per-connection
sessions (:mod:`.session`), users and roles (:mod:`.store`, :mod:`.roles`,
:mod:`.user_commands`), the privilege each command needs (:mod:`.privileges`; the rules beyond a
privilege list in :mod:`.checks`), signed cluster time (:mod:`.cluster_time`), TLS
(:mod:`.tls`), and the node-level switch (:mod:`.security`, which also binds session ids to
their user).
"""
