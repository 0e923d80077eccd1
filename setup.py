"""Package layout only (metadata lives in pyproject.toml).

The repository keeps the roles in top-level folders (``router/``, ``shard/``, ``configsvr/``),
but installs them under the ``shardsim`` namespace (``shardsim.router`` ...), so that installing
shardsim into a user's environment adds one top-level package and never shadows a user's own
``router`` module.
"""

from setuptools import find_packages, setup

ROLES = ("router", "shard", "configsvr")

package_dir = {"shardsim": "shardsim"}
packages = find_packages(include=["shardsim", "shardsim.*"])
for role in ROLES:
    package_dir[f"shardsim.{role}"] = role
    packages += [f"shardsim.{name}" for name in find_packages(include=[role, f"{role}.*"])]

setup(packages=packages, package_dir=package_dir)
