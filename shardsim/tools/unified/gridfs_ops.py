"""GridFS ``bucket`` entities of the unified test format (``unified-test-format.md``
§bucket, the GridFS spec's download operations), with pymongo's :class:`gridfs.GridFSBucket`.

``bucketOptions``: ``bucketName``, ``chunkSizeBytes``, ``writeConcern``, ``readConcern``,
``readPreference``. Operations: ``download`` (``id``) and ``downloadByName`` (``filename``,
``revision``) return the file's bytes; ``delete`` (``id``), ``upload`` (``filename``,
``source`` as ``{$$hexBytes}``, ``chunkSizeBytes``, ``metadata``) for completeness.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

import gridfs

from .matcher import RunnerError

if TYPE_CHECKING:  # pragma: no cover
    from .operations import Args, OpResult


@dataclass
class Bucket:
    """A bucket entity: pymongo's GridFSBucket and its two collections."""

    bucket: gridfs.GridFSBucket
    files: Any
    chunks: Any


def make_bucket(db: Any, options: Mapping[str, Any] | None) -> Bucket:
    """A bucket on ``db`` with the entity's ``bucketOptions``."""
    from .operations import make_read_pref, make_write_concern
    from pymongo.read_concern import ReadConcern
    kw: dict[str, Any] = {}
    for key, value in (options or {}).items():
        if key == "bucketName":
            kw["bucket_name"] = value
        elif key == "chunkSizeBytes":
            kw["chunk_size_bytes"] = value
        elif key == "writeConcern":
            kw["write_concern"] = make_write_concern(value)
        elif key == "readPreference":
            kw["read_preference"] = make_read_pref(value)
        elif key == "readConcern":
            db = db.with_options(read_concern=ReadConcern(value.get("level")))
        else:
            raise RunnerError(f"bucketOptions.{key} is not supported by this runner")
    name = kw.get("bucket_name", "fs")
    coll_kw = {k: kw[k] for k in ("write_concern", "read_preference") if k in kw}
    root = db.get_collection(name, **coll_kw)
    return Bucket(gridfs.GridFSBucket(db, **kw), root.files, root.chunks)


def _download(bucket: "Bucket", filt: dict[str, Any], revision: int | None = None) -> bytes:
    """The GridFS spec's download: the files document (``find`` on ``<bucket>.files`` with the
    filter as given; by name, ``revision`` -1 = newest by ``uploadDate``), then its chunks in
    ``n`` order. pymongo's own GridFSBucket wraps ids in ``$eq``, which the tests' expected
    events do not show, so the runner reads the two collections itself (both retryable
    reads). Raises gridfs.NoFile when there is no such file."""
    files, chunks = bucket.files, bucket.chunks
    if revision is None:
        doc = files.find_one(filt)
    else:
        skip, order = (revision, 1) if revision >= 0 else (-revision - 1, -1)
        doc = next(iter(files.find(filt, sort=[("uploadDate", order)], skip=skip, limit=1)), None)
    if doc is None:
        raise gridfs.NoFile(f"no file matches {filt}")
    if not doc.get("length"):
        return b""
    parts = [bytes(c["data"]) for c in chunks.find({"files_id": doc["_id"]}, sort=[("n", 1)])]
    return b"".join(parts)


def bucket_op(entity: "Bucket", name: str, a: "Args") -> "OpResult":
    """Run one bucket operation."""
    from .operations import OpResult
    bucket = entity.bucket
    if name == "download":
        file_id = a.req("id")
        a.done()
        return OpResult(_download(entity, {"_id": file_id}))
    if name == "downloadByName":
        filename = a.req("filename")
        revision = a.opt("revision", -1)
        a.done()
        return OpResult(_download(entity, {"filename": filename}, revision))
    if name == "delete":
        file_id = a.req("id")
        a.done()
        bucket.delete(file_id)
        return OpResult()
    if name == "upload":
        filename = a.req("filename")
        source = a.req("source")
        kw: dict[str, Any] = {}
        if a.has("chunkSizeBytes"):
            kw["chunk_size_bytes"] = a.req("chunkSizeBytes")
        if a.has("metadata"):
            kw["metadata"] = a.req("metadata")
        a.done()
        data = bytes.fromhex(source["$$hexBytes"]) if isinstance(source, Mapping) else source
        return OpResult(bucket.upload_from_stream(filename, data, **kw))
    raise RunnerError(f"unsupported bucket operation {name!r}")
