#!/usr/bin/env bash
# Build the shardsim image(s) with no network inside the Docker build.
#
#   shardsim:local         every role (configsvr, shard, router, init)      -- always
#   shardsim-spark:local   the same + Java 17 + pyspark (Spark master/worker, `shardsim load`)
#                          -- with --spark or SHARDSIM_SPARK=1
#
# Steps:
#  1. Wheels on the host: the project (app/) and every runtime dependency (deps/), built with
#     the host's pip (which reaches PyPI) into a staging build context under .cache/docker/.
#     The host interpreter must be CPython 3.11 on the engine's architecture with glibc, like
#     the image's (Debian bookworm: CPython 3.11, glibc 2.36), so that the binary wheels pip
#     picks for the host (manylinux) install in the image.
#  2. The base image: $SHARDSIM_BASE_IMAGE if set; else the official python:3.11-slim-bookworm
#     if it is present or can be pulled; else (no registry) the local shardsim-base:bookworm made
#     by deploy/make-base-image.sh (debootstrap + docker import), built here when missing.
#  3. docker build of deploy/Dockerfile on the staging context (pip install --no-index inside).
#
# Usage: deploy/build-image.sh [--spark] [--no-core]
# Environment: SHARDSIM_IMAGE (shardsim:local), SHARDSIM_SPARK_IMAGE (shardsim-spark:local),
#   SHARDSIM_BASE_IMAGE, SHARDSIM_SPARK_BASE_IMAGE, SHARDSIM_WHEEL_PYTHON (host python used
#   for pip wheel; default .venv/bin/python, else python3).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
IMAGE="${SHARDSIM_IMAGE:-shardsim:local}"
SPARK_IMAGE="${SHARDSIM_SPARK_IMAGE:-shardsim-spark:local}"
OFFICIAL_BASE="python:3.11-slim-bookworm"
LOCAL_BASE="${SHARDSIM_BASE_TAG:-shardsim-base:bookworm}"
SPARK="${SHARDSIM_SPARK:-0}"
CORE=1
for arg in "$@"; do
    case "$arg" in
        --spark) SPARK=1 ;;
        --no-core) CORE=0 ;;
        *) echo "build-image.sh: unknown argument $arg" >&2; exit 2 ;;
    esac
done
log() { echo "[docker-build] $*" >&2; }
have_image() { docker image inspect "$1" >/dev/null 2>&1; }

docker info >/dev/null 2>&1 || { log "no Docker engine reachable (docker info failed)"; exit 1; }

# --- 1. wheels -------------------------------------------------------------------------------
PY="${SHARDSIM_WHEEL_PYTHON:-}"
if [[ -z $PY ]]; then
    if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
engine_arch=$(docker info --format '{{.Architecture}}')
host_tag=$("$PY" -c 'import platform, sys; print(sys.implementation.name, "%d.%d" % sys.version_info[:2], platform.machine(), platform.libc_ver()[0])')
if [[ $host_tag != "cpython 3.11 $engine_arch glibc" ]]; then
    log "wheels must be built by CPython 3.11 on $engine_arch/glibc to match the image; $PY is: $host_tag"
    log "set SHARDSIM_WHEEL_PYTHON to such an interpreter"
    exit 1
fi

stage="$ROOT/.cache/docker"
mkdir -p "$stage"

# requirements.txt for a set of extras, straight from pyproject.toml (pins stay in one place).
requirements() {  # requirements EXTRA...
    "$PY" - "$@" <<'EOF'
import sys, tomllib
with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
reqs = list(project["dependencies"])
for extra in sys.argv[1:]:
    reqs += project["optional-dependencies"][extra]
print("\n".join(dict.fromkeys(reqs)))
EOF
}

# deps/: one wheel per runtime dependency, rebuilt only when the requirement set changes.
build_deps() {  # build_deps CTX EXTRA...
    local ctx=$1; shift
    local req="$ctx/requirements.txt" stamp="$ctx/deps/.requirements.sha256"
    mkdir -p "$ctx"
    requirements "$@" > "$req"
    local want; want=$(sha256sum "$req" | cut -d' ' -f1)
    if [[ -f $stamp && $(cat "$stamp") == "$want" ]] && ls "$ctx"/deps/*.whl >/dev/null 2>&1; then
        log "dependency wheels in $ctx/deps are up to date"
        return
    fi
    log "building dependency wheels into $ctx/deps ($*)"
    rm -rf "$ctx/deps"; mkdir -p "$ctx/deps"
    "$PY" -m pip wheel -q --disable-pip-version-check --prefer-binary -w "$ctx/deps" -r "$req"
    echo "$want" > "$stamp"
}

# app/: the project's own wheel, rebuilt every time (the source changes, the deps rarely).
build_app() {  # build_app CTX
    local ctx=$1 tmp
    rm -rf "$ctx/app"; mkdir -p "$ctx/app"
    tmp=$(mktemp -d)
    # Build from a copy of the tracked+untracked source (not .venv, .cache, ...): pip builds
    # setuptools projects in place, and the shared work tree should not get build/ litter.
    local src=(pyproject.toml setup.py README.md shardsim shard router configsvr)
    if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        # (a tracked file deleted in the work tree fails to copy: that is fine)
        git ls-files -co --exclude-standard -z -- "${src[@]}" |
            xargs -0 -I{} cp --parents {} "$tmp/" 2>/dev/null || true
    else
        cp -r "${src[@]}" "$tmp/"
    fi
    if ! "$PY" -m pip wheel -q --disable-pip-version-check --no-deps -w "$ctx/app" "$tmp" \
            >"$stage/wheel-app.log" 2>&1; then
        cat "$stage/wheel-app.log" >&2; log "building the shardsim wheel failed"; exit 1
    fi
    rm -rf "$tmp"
    cp deploy/entrypoint.sh deploy/healthcheck.py deploy/init_cluster.py "$ctx/"
}

# --- 2. base image ---------------------------------------------------------------------------
pick_base() {  # pick_base JAVA(0|1) -> prints the image to build FROM
    local java=$1
    if [[ -n ${SHARDSIM_BASE_IMAGE:-} && $java == 0 ]]; then echo "$SHARDSIM_BASE_IMAGE"; return; fi
    if [[ -n ${SHARDSIM_SPARK_BASE_IMAGE:-} && $java == 1 ]]; then echo "$SHARDSIM_SPARK_BASE_IMAGE"; return; fi
    if have_image "$OFFICIAL_BASE"; then echo "$OFFICIAL_BASE"; return; fi
    if timeout 120 docker pull -q "$OFFICIAL_BASE" >/dev/null 2>&1; then echo "$OFFICIAL_BASE"; return; fi
    log "$OFFICIAL_BASE cannot be pulled (no registry): using the local base image"
    if [[ $java == 1 ]]; then
        bash deploy/make-base-image.sh --java >&2
        echo "$LOCAL_BASE-java"
    else
        bash deploy/make-base-image.sh --no-java >&2
        echo "$LOCAL_BASE"
    fi
}

# --- 3. docker build -------------------------------------------------------------------------
docker_build() {  # docker_build TAG CTX BASE WITH_JAVA
    log "building $1 FROM $3"
    # The legacy builder and BuildKit both accept a Dockerfile outside the context.
    if ! docker build -t "$1" -f deploy/Dockerfile \
            --build-arg BASE_IMAGE="$3" --build-arg WITH_JAVA="$4" \
            --label org.opencontainers.image.revision="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
        --label org.shardsim.image=1 \
            "$2" >"$stage/build-$(basename "$2").log" 2>&1; then
        tail -n 40 "$stage/build-$(basename "$2").log" >&2
        log "docker build of $1 failed (full log: $stage/build-$(basename "$2").log)"
        exit 1
    fi
    # Earlier builds of this image are now untagged: remove them (only ours, only dangling).
    docker image prune -f --filter label=org.shardsim.image=1 >/dev/null 2>&1 || true
    log "built $1"
}

if [[ $CORE == 1 ]]; then
    ctx="$stage/core"
    build_deps "$ctx"
    build_app "$ctx"
    docker_build "$IMAGE" "$ctx" "$(pick_base 0)" 0
fi
if [[ $SPARK == 1 ]]; then
    ctx="$stage/spark"
    build_deps "$ctx" load
    build_app "$ctx"
    docker_build "$SPARK_IMAGE" "$ctx" "$(pick_base 1)" 1
fi
