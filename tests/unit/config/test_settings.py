"""The activity log's and the captures' configuration as an operator writes it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from swapgate.config.settings import ActivityConfig, CaptureConfig


@pytest.mark.parametrize(
    ("written", "size"),
    [("1MiB", 1_048_576), ("512KiB", 524_288), ("2MB", 2_000_000), (4096, 4096), ("100", 100)],
)
def test_max_bytes_reads_sizes(written: object, size: int) -> None:
    assert CaptureConfig(max_bytes=written).max_bytes == size


@pytest.mark.parametrize("written", ["lots", "1 parsec", True, -1])
def test_max_bytes_rejects_what_is_not_a_size(written: object) -> None:
    with pytest.raises(ValidationError):
        CaptureConfig(max_bytes=written)


def test_capture_defaults_capture_nothing_and_keep_a_mebibyte() -> None:
    config = CaptureConfig()

    assert (config.max_bytes, config.keep) == (1_048_576, 200)
    assert not config.wants("llama", "alice")


def test_unknown_keys_are_refused() -> None:
    with pytest.raises(ValidationError):
        CaptureConfig.model_validate({"model": ["llama"]})
    with pytest.raises(ValidationError):
        ActivityConfig.model_validate({"max_row": 10})


def test_activity_defaults_and_durations() -> None:
    assert ActivityConfig().max_age == 604_800.0
    assert ActivityConfig(max_age="2h").max_age == 7_200.0
    with pytest.raises(ValidationError):
        ActivityConfig(max_rows=0)
