"""What a consumer can observe of a pydantic model, compared: for models the product builds without
validation (`construct`), whose promise is the model validation would give."""

from __future__ import annotations

from typing import Any


def hash_or_error(model: Any) -> int | str:
    try:
        return hash(model)
    except TypeError as exc:
        return str(exc)


def assert_same_model(fast: Any, slow: Any) -> None:
    """Everything a consumer can observe of a pydantic model is the same for both."""
    assert type(fast) is type(slow)
    assert fast == slow
    assert fast.model_dump() == slow.model_dump()
    assert fast.model_dump_json() == slow.model_dump_json()
    assert fast.model_dump(mode="json", by_alias=True) == slow.model_dump(mode="json", by_alias=True)
    assert fast.model_dump(exclude_unset=True) == slow.model_dump(exclude_unset=True)
    assert fast.model_fields_set == slow.model_fields_set
    assert fast.model_extra == slow.model_extra
    assert fast.__pydantic_private__ == slow.__pydantic_private__
    assert list(fast.__dict__) == list(slow.__dict__)  # declaration order, as dumps and reprs use
    assert repr(fast) == repr(slow)
    assert hash_or_error(fast) == hash_or_error(slow)  # frozen models hash their fields (or fail alike)
    assert fast.model_copy(update={}) == slow.model_copy(update={})
