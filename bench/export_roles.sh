#!/bin/sh
# Export the code of commit $1 as an installed `shardsim` package in directory $2 (the role
# folders shard/, router/, configsvr/ placed inside shardsim/, as setup.py installs them), for a
# before/after pair: run the bench with PYTHONPATH=$2 from a directory outside the checkout
# (python puts the working directory first on sys.path, and an editable install maps any
# shardsim.<role> missing from PYTHONPATH back to the checkout). Prints where the roles load from.
set -eu
commit=$1 dest=$2
repo=$(git rev-parse --show-toplevel)
rm -rf "$dest" "$dest.src"
mkdir -p "$dest.src" "$dest"
git -C "$repo" archive "$commit" | tar -x -C "$dest.src"
cp -r "$dest.src/shardsim" "$dest/shardsim"
for role in shard router configsvr; do cp -r "$dest.src/$role" "$dest/shardsim/$role"; done
rm -rf "$dest.src"
cd /
PYTHONPATH=$dest "$repo/.venv/bin/python" -c 'import shardsim.core.node, shardsim.shard.node, shardsim.router.node as r; print("roles load from", r.__file__.rsplit("/", 2)[0])'
