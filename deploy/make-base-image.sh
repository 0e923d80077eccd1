#!/usr/bin/env bash
# Build local base images for machines that cannot pull from any image registry.
#
#   shardsim-base:bookworm       Debian 12 (bookworm) minbase + python3 (3.11) + python3-venv
#   shardsim-base:bookworm-java  the same + openjdk-17-jre-headless (Spark master/worker/load)
#
# The root file system is made with debootstrap from Debian's package archive (the mirror the
# host's apt uses, or $DEBIAN_MIRROR), then imported with `docker import`. No registry is used.
#
# Usage: deploy/make-base-image.sh [--force] [--java|--no-java]
#   --force     rebuild even if the image tags exist (default: skip existing tags: idempotent)
#   --java      also build the -java image (default: yes, unless SHARDSIM_BASE_JAVA=0)
#   --no-java   build only the python base
# Environment: SHARDSIM_BASE_TAG (default shardsim-base:bookworm), DEBIAN_MIRROR,
#   SHARDSIM_BASE_WORKDIR (default .cache/docker-base under the repository).
set -euo pipefail

cd "$(dirname "$0")/.."
TAG="${SHARDSIM_BASE_TAG:-shardsim-base:bookworm}"
JAVA_TAG="${TAG}-java"
FORCE=0
JAVA="${SHARDSIM_BASE_JAVA:-1}"
for arg in "$@"; do
    case "$arg" in
        --force) FORCE=1 ;;
        --java) JAVA=1 ;;
        --no-java) JAVA=0 ;;
        *) echo "make-base-image.sh: unknown argument $arg" >&2; exit 2 ;;
    esac
done

log() { echo "[docker-base] $*" >&2; }
have_image() { docker image inspect "$1" >/dev/null 2>&1; }

need_base=1; need_java=0
if [[ $FORCE == 0 ]] && have_image "$TAG"; then need_base=0; log "$TAG exists (use --force to rebuild)"; fi
if [[ $JAVA == 1 ]]; then
    need_java=1
    if [[ $FORCE == 0 ]] && have_image "$JAVA_TAG"; then need_java=0; log "$JAVA_TAG exists (use --force to rebuild)"; fi
fi
if [[ $need_base == 0 && $need_java == 0 ]]; then exit 0; fi

if [[ $(id -u) != 0 ]]; then
    log "debootstrap needs root (run: sudo make docker-base)"; exit 1
fi
if ! command -v debootstrap >/dev/null 2>&1; then
    log "installing debootstrap"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null
fi

# The Debian mirror: $DEBIAN_MIRROR, else the one the host's apt already uses, else
# debootstrap's own default.
mirror="${DEBIAN_MIRROR:-}"
if [[ -z $mirror ]]; then
    mirror=$( { grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}';
                grep -hs '^deb ' /etc/apt/sources.list | awk '{print $2}'; } |
              grep -E '/debian/?$' | head -n1 || true)
fi

workdir="${SHARDSIM_BASE_WORKDIR:-$PWD/.cache/docker-base}"
mkdir -p "$workdir"
rootfs="$workdir/rootfs"
mounted=()
cleanup() {
    for m in "${mounted[@]:-}"; do [[ -n $m ]] && umount -l "$m" 2>/dev/null || true; done
    rm -rf "$rootfs" "$workdir/rootfs-java"
}
trap cleanup EXIT
rm -rf "$rootfs" "$workdir/rootfs-java"

# Settings applied to every imported image (docker import keeps no metadata of its own).
import_changes=(
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
    --change 'ENV LANG=C.UTF-8'
    --change 'ENV PYTHONUNBUFFERED=1'
    --change 'CMD ["/bin/bash"]'
)

slim_rootfs() {  # drop caches and docs that an image never needs
    local r=$1
    chroot "$r" apt-get clean
    rm -rf "$r"/var/lib/apt/lists/* "$r"/var/cache/apt/*.bin "$r"/usr/share/doc/* \
           "$r"/usr/share/man/* "$r"/usr/share/info/* "$r"/var/log/*.log "$r"/tmp/* \
           "$r"/debootstrap
    # Images get their resolver from the engine at run time.
    : > "$r/etc/resolv.conf"
}

import_rootfs() {  # import_rootfs DIR TAG
    log "importing $1 as $2"
    tar -C "$1" --numeric-owner -c . | docker import "${import_changes[@]}" - "$2" >/dev/null
}

log "debootstrap bookworm into $rootfs (mirror: ${mirror:-debootstrap default})"
debootstrap --variant=minbase \
    --include=python3,python3-venv,ca-certificates \
    bookworm "$rootfs" ${mirror:+"$mirror"} >"$workdir/debootstrap.log" 2>&1 || {
        tail -n 30 "$workdir/debootstrap.log" >&2; exit 1; }
# apt inside the chroot must not try to start services.
printf '#!/bin/sh\nexit 101\n' > "$rootfs/usr/sbin/policy-rc.d"; chmod +x "$rootfs/usr/sbin/policy-rc.d"

if [[ $need_java == 1 ]]; then
    # The Java base: the same root file system plus a JRE, installed with apt in a chroot
    # (the JRE's post-install scripts need /proc and name resolution).
    jroot="$workdir/rootfs-java"
    cp -a "$rootfs" "$jroot"
    cp /etc/resolv.conf "$jroot/etc/resolv.conf"
    mount -t proc proc "$jroot/proc"; mounted+=("$jroot/proc")
    log "installing openjdk-17-jre-headless into $jroot"
    if ! { chroot "$jroot" apt-get update -q &&
           DEBIAN_FRONTEND=noninteractive chroot "$jroot" apt-get install -y -q --no-install-recommends \
               openjdk-17-jre-headless procps; } >"$workdir/java.log" 2>&1; then
        tail -n 30 "$workdir/java.log" >&2; exit 1
    fi
    umount -l "$jroot/proc"; mounted=()
    slim_rootfs "$jroot"
    import_rootfs "$jroot" "$JAVA_TAG"
    rm -rf "$jroot"
fi

if [[ $need_base == 1 ]]; then
    slim_rootfs "$rootfs"
    import_rootfs "$rootfs" "$TAG"
fi

# Smoke check: each image runs python3 (and java) with no network.
docker run --rm --network none "$TAG" python3 -c 'import sys, venv, ensurepip; print("python", sys.version.split()[0])'
if [[ $JAVA == 1 ]]; then
    docker run --rm --network none "$JAVA_TAG" sh -c 'java -version 2>&1 | head -n1'
fi
log "done"
