"""An internal request between roles, declared once: its name, its payload's fields and types.

Modelled on the server's IDL request types (``src/mongo/s/request_types/*.idl``): a request is a
frozen dataclass whose first field is the command's own value (``{<NAME>: <first field>, ...}``)
and whose other fields are the payload. The sender builds it and calls :meth:`to_command`; the
receiver calls :meth:`parse` on the command body. Optional fields default to ``None`` and are
left out of the command when ``None``.

Parse errors are the IDL parser's: a missing required field is 40414
(``BSON field '<cmd>.<field>' is missing but a required field``), a field of the wrong BSON type
is TypeMismatch 14 (``BSON field '<cmd>.<field>' is the wrong type '<got>', expected type
'<want>'``) -- ``src/mongo/idl/idl_parser.cpp`` ``IDLParserContext::throwMissingField`` /
``throwBadType``.
"""

from __future__ import annotations

import dataclasses
import types as pytypes
import typing
from typing import Any, ClassVar, Mapping, TypeVar

from bson.binary import Binary
from bson.objectid import ObjectId
from bson.timestamp import Timestamp

from shardsim.core.commands import bson_type_name
from shardsim.core.errors import MongoError

R = TypeVar("R", bound="InternalRequest")

# Python type -> the BSON type name the IDL parser says it expects.
_BSON_NAMES = {str: "string", bool: "bool", int: "int", float: "double", dict: "object",
               list: "array", Timestamp: "timestamp", Binary: "binData", ObjectId: "objectId"}


def _accepts(value: Any, types: tuple[type, ...]) -> bool:
    if bool not in types and isinstance(value, bool):
        return False  # a bool is no number on the wire
    return isinstance(value, types)


class InternalRequest:
    """Base of every internal request. Subclasses are ``@dataclass(frozen=True)`` with
    ``NAME`` set; see the module docstring for the wire shape and the errors of :meth:`parse`."""

    NAME: ClassVar[str]
    # field -> wire name, for a wire name that is a Python keyword (``from``)
    WIRE_NAMES: ClassVar[dict[str, str]] = {}
    _types: ClassVar[dict[str, tuple[type, ...] | None]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._types = {}

    @classmethod
    def _field_types(cls) -> dict[str, tuple[tuple[type, ...] | None, bool]]:
        """field -> (accepted Python types or None for any, required)."""
        if not cls._types:
            hints = typing.get_type_hints(cls)
            for f in dataclasses.fields(cls):  # type: ignore[arg-type]
                hint = hints[f.name]
                union = typing.get_origin(hint) in (typing.Union, pytypes.UnionType)
                args = typing.get_args(hint) if union else (hint,)
                types = tuple(typing.get_origin(a) or a for a in args if a is not type(None))
                cls._types[f.name] = None if Any in types else types
        required = {f.name for f in dataclasses.fields(cls)  # type: ignore[arg-type]
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
        return {name: (types, name in required) for name, types in cls._types.items()}

    def to_command(self) -> dict[str, Any]:
        """``{NAME: <first field>, <field>: value, ...}`` (``None`` fields left out)."""
        fields = dataclasses.fields(self)  # type: ignore[arg-type]
        cmd: dict[str, Any] = {self.NAME: getattr(self, fields[0].name)}
        for f in fields[1:]:
            value = getattr(self, f.name)
            if value is not None:
                cmd[self.WIRE_NAMES.get(f.name, f.name)] = value
        return cmd

    @classmethod
    def parse(cls: type[R], body: Mapping[str, Any]) -> R:
        """The request in ``body`` (a command body whose first key is ``NAME``).

        Raises MongoError 40414 for a missing required field, 14 for a field of the wrong type."""
        values: dict[str, Any] = {}
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        for i, (name, (types, required)) in enumerate(cls._field_types().items()):
            key = cls.NAME if i == 0 else cls.WIRE_NAMES.get(name, name)
            value = body.get(key)
            if value is None:
                if required:
                    raise MongoError(40414, f"BSON field '{cls.NAME}.{key}' is missing but a "
                                            f"required field")
                continue
            if types is not None and not _accepts(value, types):
                want = _BSON_NAMES.get(types[0], types[0].__name__)
                raise MongoError(14, f"BSON field '{cls.NAME}.{key}' is the wrong type "
                                     f"'{bson_type_name(value)}', expected type '{want}'")
            values[fields[i].name] = value
        return cls(**values)

    @classmethod
    def forward(cls: type[R], arg: Any, source: Mapping[str, Any], *,
                only: tuple[str, ...] | None = None, **fields: Any) -> R:
        """The request built from a user's command: ``arg`` as the first field, ``fields`` as
        given, and every other declared field (of ``only``, when given) that ``source`` carries
        (mongos forwards the options of ``shardCollection``, ``moveChunk``... to the config
        server as they came)."""
        names = [f.name for f in dataclasses.fields(cls)][1:]  # type: ignore[arg-type]
        if only is not None:
            names = [n for n in names if n in only]
        values = {n: source[n] for n in names if n in source and n not in fields}
        first = dataclasses.fields(cls)[0].name  # type: ignore[arg-type]
        return cls(**{first: arg, **values, **fields})


REGISTRY: dict[str, type[InternalRequest]] = {}


def request(cls: type[R]) -> type[R]:
    """Class decorator: make ``cls`` a frozen dataclass and register it by ``NAME``."""
    cls = dataclasses.dataclass(frozen=True)(cls)
    assert cls.NAME not in REGISTRY, cls.NAME
    REGISTRY[cls.NAME] = cls
    return cls
