"""Transaction producer: the API shape of RocketMQ's TransactionMQProducer. The broker side (half
messages, commit/rollback, checks) arrives with issue #4; until then sending raises a clear error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ferrymq.client.errors import NotSupportedError
from ferrymq.client.message import Message, SendResult, TransactionState

NOT_YET = "transactions are not supported by this broker yet (they arrive with issue #4)"


class AsyncTransactionProducer:
    def __init__(self, url: str, group: str, execute: Callable[[Message, Any], TransactionState],
                 check: Callable[[Message], TransactionState]) -> None:
        self.url, self.group, self.execute, self.check = url, group, execute, check

    async def start(self) -> None:
        pass

    async def shutdown(self) -> None:
        pass

    async def send_in_transaction(self, msg: Message, arg: Any = None) -> SendResult:
        raise NotSupportedError(NOT_YET)
