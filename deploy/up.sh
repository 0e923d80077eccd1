#!/usr/bin/env bash
# `make up`: start the compose cluster and wait until the one-shot init has added the shards.
# Works with `docker compose` (v2) and `docker-compose` (v1, which has no `up --wait`).
# Extra arguments go to `up` (e.g. `--profile spark` goes first: COMPOSE_PROFILES=spark make up).
set -euo pipefail
cd "$(dirname "$0")/.."
if docker compose version >/dev/null 2>&1; then compose=(docker compose); else compose=(docker-compose); fi
# MEMBERS=3 (make up MEMBERS=3): 2 shards of 3 members each, every member its own container
# (deploy/docker-compose.members.yml); MEMBERS=1 (default): one container per shard.
case "${MEMBERS:-1}" in
    1) files=(-f deploy/docker-compose.yml) ;;
    3) files=(-f deploy/docker-compose.members.yml)
       if [[ -n ${SHARDSIM_AUTH:-} ]]; then
           echo "up: MEMBERS=3 has no authentication overlay yet (use MEMBERS=1 for up-auth)" >&2; exit 2
       fi ;;
    *) echo "up: MEMBERS must be 1 or 3, not ${MEMBERS}" >&2; exit 2 ;;
esac
# SHARDSIM_AUTH=1 (make up-auth): key file, --keyFile on every member, a root user from
# MONGO_INITDB_ROOT_USERNAME / MONGO_INITDB_ROOT_PASSWORD (deploy/docker-compose.auth.yml).
[[ -n ${SHARDSIM_AUTH:-} ]] && files+=(-f deploy/docker-compose.auth.yml)
"${compose[@]}" "${files[@]}" up -d "$@"
cid=$("${compose[@]}" "${files[@]}" ps -a -q init)
[[ -n $cid ]] || { echo "up: no init container" >&2; exit 1; }
rc=$(timeout "${SHARDSIM_UP_TIMEOUT:-180}" docker wait "$cid") || { echo "up: init did not finish" >&2; exit 1; }
"${compose[@]}" "${files[@]}" logs --no-color init | tail -n 5
if [[ $rc != 0 ]]; then echo "up: init failed (exit $rc)" >&2; exit 1; fi
if [[ -n ${SHARDSIM_AUTH:-} ]]; then
    echo "shardsim cluster ready: mongodb://${MONGO_INITDB_ROOT_USERNAME:-root}:<password>@${SHARDSIM_BIND:-127.0.0.1}:${SHARDSIM_PORT:-27017}/"
else
    echo "shardsim cluster ready: mongodb://${SHARDSIM_BIND:-127.0.0.1}:${SHARDSIM_PORT:-27017}/"
fi
