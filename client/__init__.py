"""FerryMQ's Python client: producers, push and pull consumers, admin — blocking classes and their
asyncio twins (``Async*``). Give any of them the controller's (or a standalone server's) URL."""

from ferrymq.client.admin import AsyncAdmin
from ferrymq.client.errors import (
    BrokerError,
    ClientError,
    ClientStateError,
    RemotingConnectError,
    RemotingError,
    RemotingTimeoutError,
)
from ferrymq.client.message import (
    ConsumeResult,
    Message,
    MessageQueue,
    PullResult,
    ReceivedMessage,
    SendResult,
    TransactionState,
)
from ferrymq.client.producer import AsyncProducer, select_by_hash
from ferrymq.client.pull_consumer import AsyncPullConsumer
from ferrymq.client.push_consumer import AsyncPushConsumer
from ferrymq.client.sync import Admin, Producer, PullConsumer, PushConsumer, TransactionProducer
from ferrymq.client.transaction import AsyncTransactionProducer, TransactionSendResult

__all__ = [
    "Admin", "AsyncAdmin", "AsyncProducer", "AsyncPullConsumer", "AsyncPushConsumer", "AsyncTransactionProducer",
    "BrokerError", "ClientError", "ClientStateError", "ConsumeResult", "Message", "MessageQueue",
    "Producer", "PullConsumer", "PullResult", "PushConsumer", "ReceivedMessage",
    "RemotingConnectError", "RemotingError", "RemotingTimeoutError", "SendResult", "TransactionProducer",
    "TransactionSendResult", "TransactionState", "select_by_hash",
]
