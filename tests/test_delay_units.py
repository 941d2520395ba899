"""Pure parts of delay and timer messages: durations, level capping, delivery-time bounds."""

from __future__ import annotations

import pytest

from ferrymq.broker.services.schedule import delay_level_of
from ferrymq.broker.services.timer import deliver_at_of
from ferrymq.common.config import BrokerConfig
from ferrymq.common.durations import parse_delay_levels, parse_duration_ms
from ferrymq.common.errors import FerryError
from ferrymq.common.message import Message


def test_rocketmq_default_levels() -> None:
    levels = parse_delay_levels(BrokerConfig().message_delay_level)
    assert len(levels) == 18
    assert levels[:4] == [1000, 5000, 10_000, 30_000]
    assert levels[-3:] == [1_800_000, 3_600_000, 7_200_000]


@pytest.mark.parametrize(("text", "ms"), [("250ms", 250), ("1s", 1000), ("1.5s", 1500), ("2m", 120_000),
                                          ("1h", 3_600_000), ("1d", 86_400_000), (" 3S ", 3000)])
def test_duration_units(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["", "1", "5x", "-1s", "0s", "1 s", "ms"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration_ms(text)


def test_config_rejects_bad_levels() -> None:
    with pytest.raises(ValueError):
        BrokerConfig.model_validate({"messageDelayLevel": "1s 5q"})
    assert BrokerConfig.model_validate({"messageDelayLevel": "200ms 1s"}).message_delay_level == "200ms 1s"


def _msg(**props: str) -> Message:
    return Message(topic="t", body=b"x", properties=dict(props))


def test_delay_level_is_capped_and_validated() -> None:
    assert delay_level_of(_msg(), 18) == 0
    assert delay_level_of(_msg(DELAY="3"), 18) == 3
    assert delay_level_of(_msg(DELAY="99"), 18) == 18
    for bad in ("x", "-1"):
        with pytest.raises(FerryError) as exc:
            delay_level_of(_msg(DELAY=bad), 18)
        assert exc.value.code == "MESSAGE_ILLEGAL"


def test_deliver_at_forms_and_limit() -> None:
    now = 1_000_000
    assert deliver_at_of(_msg(), now, 60) is None
    assert deliver_at_of(_msg(TIMER_DELIVER_MS=str(now + 5000)), now, 60) == now + 5000
    assert deliver_at_of(_msg(TIMER_DELAY_MS="700"), now, 60) == now + 700
    assert deliver_at_of(_msg(TIMER_DELAY_SEC="2"), now, 60) == now + 2000
    with pytest.raises(FerryError):
        deliver_at_of(_msg(TIMER_DELIVER_MS=str(now + 61_000)), now, 60)
    with pytest.raises(FerryError):
        deliver_at_of(_msg(TIMER_DELIVER_MS="soon"), now, 60)
