"""Error replies and change-stream labels (error_codes.yml, error_labels.cpp)."""

from shardsim.errors import MongoError, change_stream_labels, code_name


def test_reply_shape_field_order():
    exc = MongoError(11000, "E11000 duplicate key", keyValue={"_id": 1})
    reply = exc.to_reply()
    assert list(reply) == ["ok", "errmsg", "code", "codeName", "keyValue"]
    assert reply["codeName"] == "DuplicateKey" and reply["ok"] == 0.0


def test_unknown_code_names_are_location_codes():
    assert code_name(4242) == "Location4242"
    assert code_name(286) == "ChangeStreamHistoryLost"
    assert code_name(346) == "ChangeStreamInvalidated"


def test_resumable_label_only_for_change_stream_aggregate_and_getmore():
    assert change_stream_labels(6, is_change_stream=True, command="getMore") == ["ResumableChangeStreamError"]
    assert change_stream_labels(6, is_change_stream=False, command="getMore") == []
    assert change_stream_labels(6, is_change_stream=True, command="insert") == []
    # CursorNotFound is resumed by drivers without a label; the server adds none.
    assert change_stream_labels(43, is_change_stream=True, command="getMore") == []


def test_non_resumable_label_for_280_and_286_on_any_command():
    assert change_stream_labels(280, is_change_stream=True, command="getMore") == ["NonResumableChangeStreamError"]
    assert change_stream_labels(286, is_change_stream=False, command="find") == ["NonResumableChangeStreamError"]
