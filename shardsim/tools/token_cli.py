"""``shardsim decode-token`` and ``shardsim tail``: resume tokens for people.

* ``shardsim decode-token TOKEN [--json]``: the fields of a resume token by the server's names
  (``ResumeTokenData`` in ``src/mongo/db/pipeline/resume_token.h``): ``clusterTime``,
  ``version``, ``tokenType`` (0 high-water mark, 128 event), ``txnOpIndex``,
  ``fromInvalidate``, ``uuid``, ``eventIdentifier``, ``fragmentNum``. ``TOKEN`` is the hex
  ``_data`` string or the token document as (extended) JSON (``{"_data": "8263..."}``).
  ``--json`` prints one JSON object (``clusterTime`` as ``{"t", "i"}``, ``uuid`` as a string,
  ``eventIdentifier`` as relaxed extended JSON). A token that does not decode prints the
  server's error (``<code> <codeName>: <errmsg>``) on stderr and exits with status 2.
* ``shardsim tail URI [--ns DB[.COLL]] [--resume-after TOKEN] [--max-events N]``: opens a change
  stream (cluster-wide, or on the database/collection of ``--ns``) and prints each event as
  one JSON line followed by its decoded token, as they arrive, until Ctrl-C (or ``N``
  events); then prints the last resume token (the postBatchResumeToken when no event came),
  ready for ``--resume-after``.

Decoding is :func:`shardsim.core.resume_token.decode` (KeyString v1 tokens as mongod writes
them).
"""

from __future__ import annotations

import json
import sys
import uuid as uuid_mod
from typing import Any

import click
from bson import json_util

from shardsim.core import resume_token as rt
from shardsim.core.errors import MongoError

_JSON = json_util.JSONOptions(json_mode=json_util.JSONMode.RELAXED)


def parse_token(text: str) -> dict[str, Any]:
    """``TOKEN`` as a token document: hex ``_data`` or (extended) JSON; BadValue (2) else."""
    text = text.strip()
    if text.startswith("{"):
        try:
            doc = json_util.loads(text)
        except ValueError as exc:
            raise MongoError(2, f"token is not valid JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise MongoError(2, "token JSON must be an object")
        return doc
    return {"_data": text}


def token_fields(token: Any) -> dict[str, Any]:
    """The decoded fields of ``token`` (a token document), JSON-ready, in the server's order.
    Raises the decoder's MongoError."""
    data = rt.decode(token)
    return {
        "clusterTime": {"t": data.clusterTime.time, "i": data.clusterTime.inc},
        "version": data.version,
        "tokenType": data.tokenType,
        "txnOpIndex": data.txnOpIndex,
        "fromInvalidate": data.fromInvalidate,
        "uuid": str(uuid_mod.UUID(bytes=data.uuid)) if data.uuid else None,
        "eventIdentifier": json.loads(json_util.dumps(data.eventIdentifier,
                                                      json_options=_JSON)),
        "fragmentNum": data.fragmentNum,
    }


def describe(fields: dict[str, Any]) -> str:
    """One line per field, ``name: value`` (the human form of ``decode-token``)."""
    ct = fields["clusterTime"]
    kind = {rt.EVENT: "event"}.get(fields["tokenType"], "high-water mark")
    lines = [f"clusterTime: Timestamp({ct['t']}, {ct['i']})",
             f"version: {fields['version']}",
             f"tokenType: {fields['tokenType']} ({kind})",
             f"txnOpIndex: {fields['txnOpIndex']}",
             f"fromInvalidate: {str(fields['fromInvalidate']).lower()}",
             f"uuid: {fields['uuid'] if fields['uuid'] else '-'}",
             f"eventIdentifier: {json.dumps(fields['eventIdentifier'])}",
             f"fragmentNum: {'-' if fields['fragmentNum'] is None else fields['fragmentNum']}"]
    return "\n".join(lines)


def _fail(exc: MongoError) -> None:
    click.echo(f"{exc.code} {exc.code_name}: {exc.errmsg}", err=True)
    sys.exit(2)


@click.command("decode-token")
@click.argument("token")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def decode_token(token: str, as_json: bool) -> None:
    """Decode a change-stream resume token (hex _data or {"_data": ...} JSON)."""
    try:
        fields = token_fields(parse_token(token))
    except MongoError as exc:
        _fail(exc)
        return
    click.echo(json.dumps(fields) if as_json else describe(fields))


def _token_line(token: Any) -> str:
    try:
        f = token_fields(token)
    except MongoError as exc:  # pragma: no cover - the server's own tokens decode
        return f"  token: undecodable ({exc.errmsg})"
    ct = f["clusterTime"]
    extra = f" fragmentNum={f['fragmentNum']}" if f["fragmentNum"] is not None else ""
    return (f"  token: clusterTime=Timestamp({ct['t']}, {ct['i']}) version={f['version']} "
            f"tokenType={f['tokenType']} txnOpIndex={f['txnOpIndex']} "
            f"fromInvalidate={str(f['fromInvalidate']).lower()} uuid={f['uuid'] or '-'} "
            f"eventIdentifier={json.dumps(f['eventIdentifier'])}{extra}")


def _watch_target(client: Any, ns: str | None) -> Any:
    if not ns:
        return client
    db, _, coll = ns.partition(".")
    return client[db][coll] if coll else client[db]


@click.command("tail")
@click.argument("uri")
@click.option("--ns", default=None, help="DB or DB.COLL to watch (default: the whole cluster).")
@click.option("--resume-after", "resume_after", default=None,
              help="Resume after this token (hex _data or JSON).")
@click.option("--max-events", type=click.IntRange(min=1), default=None,
              help="Stop after this many events (default: until Ctrl-C).")
@click.option("--full-document", default=None,
              type=click.Choice(["updateLookup", "whenAvailable", "required"]))
def tail(uri: str, ns: str | None, resume_after: str | None, max_events: int | None,
         full_document: str | None) -> None:
    """Print a change stream's events and their decoded resume tokens as they arrive."""
    import pymongo
    from pymongo.errors import OperationFailure, PyMongoError

    kwargs: dict[str, Any] = {"max_await_time_ms": 500}
    if full_document:
        kwargs["full_document"] = full_document
    try:
        if resume_after:
            kwargs["resume_after"] = parse_token(resume_after)
    except MongoError as exc:
        _fail(exc)
        return
    client: Any = pymongo.MongoClient(uri, serverSelectionTimeoutMS=10000)
    last: Any = None
    seen = 0
    try:
        with _watch_target(client, ns).watch(**kwargs) as stream:
            last = stream.resume_token
            while max_events is None or seen < max_events:
                ev = stream.try_next()
                last = stream.resume_token or last
                if ev is None:
                    continue
                seen += 1
                click.echo(json_util.dumps(ev, json_options=_JSON))
                click.echo(_token_line(ev["_id"]))
    except KeyboardInterrupt:
        pass
    except OperationFailure as exc:
        details = exc.details or {}
        click.echo(f"{exc.code} {details.get('codeName', '')}: "
                   f"{details.get('errmsg', str(exc))}", err=True)
        sys.exit(2)
    except PyMongoError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    finally:
        client.close()
    if last is not None:
        click.echo(f"last resume token: {json_util.dumps(last)}", err=True)
