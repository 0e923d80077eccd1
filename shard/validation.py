"""Document validation on the shard (``collection_impl.cpp`` ``checkValidation``,
``coll_mod.cpp``, ``create_collection.cpp``): a collection's ``validator`` checked on every
insert, update, replacement and upsert of the CRUD commands.

* ``validationLevel``: ``strict`` (default) checks every write; ``moderate`` skips updates of
  documents that already failed the validator; ``off`` checks nothing.
* ``validationAction``: ``error`` (default) refuses the write with DocumentValidationFailure
  (121) ``"Document failed validation"`` and ``errInfo: {failingDocumentId, details}``
  (details from :func:`shardsim.core.doc_validation.failure_details`); ``warn`` lets it through
  and logs it.
* ``bypassDocumentValidation: true`` on insert/update/findAndModify (and the router's
  bulkWrite) skips the check; chunk migrations and internal writes never check.

:func:`check_options` validates the options when ``create``/``collMod`` set them: TypeMismatch
(14) for a non-object validator or a non-string level/action, BadValue (2) for an unknown
level or action, and the ``$jsonSchema`` checks of :func:`shardsim.core.doc_validation.check_schema`.
"""

from __future__ import annotations

import contextvars
import logging
from typing import Any

from shardsim.core import query as q
from shardsim.core.commands import bson_type_name
from shardsim.core.doc_validation import check_schema, failure_details
from shardsim.core.errors import MongoError

log = logging.getLogger("shardsim.shard.validation")

# bypassDocumentValidation of the write command being run; each CRUD handler sets it first.
BYPASS: contextvars.ContextVar[bool] = contextvars.ContextVar("bypass_validation",
                                                              default=False)
LEVELS = ("off", "strict", "moderate")
ACTIONS = ("error", "warn")


def set_bypass(body: dict[str, Any]) -> None:
    """Note the command's ``bypassDocumentValidation`` for the checks of this command."""
    BYPASS.set(body.get("bypassDocumentValidation") is True)


def check(coll: Any, new: dict[str, Any], old: dict[str, Any] | None = None) -> None:
    """Raise DocumentValidationFailure (121) when ``new`` (replacing ``old``, or inserted
    when ``old`` is None) fails ``coll``'s validator under its level and action."""
    opts = coll.options
    validator = opts.get("validator")
    if not validator or BYPASS.get():
        return
    level = opts.get("validationLevel", "strict")
    if level == "off":
        return
    details = failure_details(validator, new, q.matches)
    if details is None:
        return
    if level == "moderate" and old is not None and \
            failure_details(validator, old, q.matches) is not None:
        return  # moderate: a document that already failed may stay invalid
    if opts.get("validationAction", "error") == "warn":
        log.warning("Document would fail validation: ns=%s _id=%r", coll.ns, new.get("_id"))
        return
    raise MongoError(121, "Document failed validation",
                     errInfo={"failingDocumentId": new.get("_id"), "details": details})


def check_options(cmd: str, options: dict[str, Any]) -> None:
    """Refuse bad ``validator``/``validationLevel``/``validationAction`` values of
    ``create``/``collMod`` (``cmd``)."""
    if "validator" in options:
        v = options["validator"]
        if not isinstance(v, dict):
            raise MongoError(14, f"BSON field '{cmd}.validator' is the wrong type "
                                 f"'{bson_type_name(v)}', expected type 'object'")
        if "$jsonSchema" in v:
            check_schema(v["$jsonSchema"])
        for bad in ("$where", "$near", "$nearSphere", "$text"):
            if bad in v:
                raise MongoError(2,
                                 f"{bad} is not allowed in collection validators")
    for field, allowed in (("validationLevel", LEVELS), ("validationAction", ACTIONS)):
        if field in options:
            val = options[field]
            if not isinstance(val, str):
                raise MongoError(14, f"BSON field '{cmd}.{field}' is the wrong type "
                                     f"'{bson_type_name(val)}', expected type 'string'")
            if val not in allowed:
                raise MongoError(2, f"Enumeration value '{val}' for field '{cmd}.{field}' is "
                                    f"not a valid value.")
