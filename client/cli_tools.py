"""``ferrymq produce`` and ``ferrymq consume``: the command-line producer and consumer.

consume prints one JSON object per message and line; it runs until Ctrl-C / SIGTERM, or until
``--max-messages`` were printed or nothing arrived for ``--idle-exit-seconds`` (for scripts). A
message is acknowledged only after it was printed, so an interrupted consume never loses one.
"""

from __future__ import annotations

import base64
import json
import signal
import sys
import threading
import time
from typing import Any

from ferrymq.client.errors import ClientError
from ferrymq.client.message import ConsumeResult, Message, ReceivedMessage
from ferrymq.client.sync import Producer, PushConsumer


def message_json(m: ReceivedMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"msgId": m.msg_id, "topic": m.topic, "brokerGroup": m.broker_group,
                           "queueId": m.queue_id, "queueOffset": m.queue_offset, "tags": m.tags, "keys": m.keys,
                           "properties": m.properties, "bornTimestamp": m.born_timestamp,
                           "storeTimestamp": m.store_timestamp, "reconsumeTimes": m.reconsume_times,
                           "bodyBase64": base64.b64encode(m.body).decode()}
    try:
        out["body"] = m.body.decode("utf-8")
    except UnicodeDecodeError:
        pass
    return out


def produce(server: str, topic: str, *, tags: str | None, keys: str | None, count: int, body: str | None,
            batch: bool) -> int:
    if count < 1:
        raise ClientError("INVALID_REQUEST", "--count must be at least 1")
    key_list = [k for k in (keys or "").split(",") if k] or None
    msgs = [Message(topic=topic, body=(body if body is not None else f"message {i}").encode(), tags=tags,
                    keys=key_list) for i in range(count)]
    producer = Producer(server, group="ferrymq-cli-producer")
    producer.start()
    try:
        results = producer.send_batch(msgs) if batch else [producer.send(m) for m in msgs]
        for r in results:
            print(json.dumps({"msgId": r.msg_id, "topic": r.topic, "brokerGroup": r.broker_group,
                              "queueId": r.queue_id, "queueOffset": r.queue_offset, "status": r.status}),
                  flush=True)
    finally:
        producer.shutdown()
    return 0


def consume(server: str, topic: str, *, group: str, from_: str, tags: str, max_messages: int | None,
            idle_exit_seconds: float | None, orderly: bool, broadcast: bool) -> int:
    lock = threading.Lock()
    done = threading.Event()
    state = {"printed": 0, "last": time.monotonic()}

    def listener(msgs: list[ReceivedMessage]) -> ConsumeResult:
        with lock:
            if max_messages is not None and state["printed"] + len(msgs) > max_messages:
                done.set()
                # not printed, so not acknowledged: the next consumer of the group gets it
                return ConsumeResult.RECONSUME_LATER
            for m in msgs:
                sys.stdout.write(json.dumps(message_json(m)) + "\n")
                state["printed"] += 1
            sys.stdout.flush()
            state["last"] = time.monotonic()
            if max_messages is not None and state["printed"] >= max_messages:
                done.set()
        return ConsumeResult.SUCCESS

    consumer = PushConsumer(server, group=group, topic=topic, tags=tags, listener=listener, orderly=orderly,
                            broadcast=broadcast, consume_from=from_, consume_thread_count=1,
                            auto_commit_interval=1.0)
    previous = signal.signal(signal.SIGTERM, lambda *_: done.set())
    consumer.start()
    try:
        while not done.wait(0.1):
            if idle_exit_seconds is not None and time.monotonic() - state["last"] > idle_exit_seconds:
                break
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        consumer.shutdown()
    return 0
