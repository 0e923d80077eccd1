"""Error replies and change-stream labels (error_codes.yml, error_labels.cpp)."""

from shardsim.core.errors import MongoError, change_stream_labels, code_name


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


def test_code_names_come_from_the_server_list():
    from shardsim.core.error_codes import ERROR_CODE_NAMES
    assert code_name(47) == "NoMatchingDocument"
    assert code_name(23) == "AlreadyInitialized"
    assert code_name(16) == "InvalidLength"
    assert code_name(28) == "PathNotViable"
    assert code_name(10171600) == "ReadThroughCacheTimeMonotonicityViolation"
    assert code_name(40324) == "Location40324"  # an assertion-site code, not in error_codes.yml
    assert not any(name.startswith("Location") for name in ERROR_CODE_NAMES.values())
    assert len(ERROR_CODE_NAMES) > 400


def test_label_sets_agree_with_the_server_categories():
    from shardsim.core.error_codes import codes_in_category
    from shardsim.core.errors import (NON_RESUMABLE_CHANGE_STREAM_CODES, RESUMABLE_CHANGE_STREAM_CODES,
                                 RETRYABLE_WRITE_CODES)
    retriable = codes_in_category("RetriableError")
    assert RETRYABLE_WRITE_CODES == retriable
    assert RESUMABLE_CHANGE_STREAM_CODES == (retriable | codes_in_category("NetworkError")
                                             | codes_in_category("NeedRetargettingError") | {234, 133})
    assert NON_RESUMABLE_CHANGE_STREAM_CODES == codes_in_category("NonResumableChangeStreamError")


def test_translate_error_hides_python_text():
    from shardsim.core.query import translate_error
    err = translate_error(TypeError("unsupported operand type(s) for +: 'Decimal128' and 'int'"))
    assert err.code == 2 and "unsupported operand" not in err.errmsg and err.code_name == "BadValue"
    err = translate_error(NotImplementedError("The $foo operator is not implemented in mongomock yet"))
    assert (err.code, err.code_name) == (238, "NotImplemented")
    assert err.errmsg == "The $foo operator is not supported by shardsim"
