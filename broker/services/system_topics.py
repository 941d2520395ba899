"""The topics the broker keeps for delay, timer and transaction messages, and the moves between a
system topic and the real one.

A message held in a system topic carries its real destination in REAL_TOPIC / REAL_QID; when its time
comes (or its transaction commits) it is rebuilt with the same body, properties, born time and
reconsume count and put to the real topic. Nothing here touches the store's internals: entries are
read through the consume queue's public reader, records through ``MessageStore.get_messages``.
"""

from __future__ import annotations

from ferrymq.broker.services.topics import PERM_READ, PERM_WRITE, TopicConfigIn, TopicManager
from ferrymq.broker.store.message_store import MessageStore
from ferrymq.common.message import PROPERTY_REAL_QUEUE_ID, PROPERTY_REAL_TOPIC, Message, StoredMessage

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
TIMER_TOPIC = "rmq_sys_wheel_timer"
HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
CHECK_MAX_TOPIC = "RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC"

# Consume-queue tag slots of SCHEDULE_TOPIC_XXXX and the timer topic hold the delivery time (epoch ms),
# as RocketMQ's. A tag hash is a Java int, so a slot below this came from re-dispatching the log after
# a crash (or from a replica), which knows only the tags: then the time is recomputed from the record.
TIMESTAMP_CODE_FLOOR = 1 << 31


def ensure_system_topics(topics: TopicManager, delay_levels: int) -> bool:
    """Create (or widen) the system topics; True when anything changed. Blocking file I/O."""
    rw = PERM_READ | PERM_WRITE
    wanted = {
        SCHEDULE_TOPIC: delay_levels,
        TIMER_TOPIC: 1,
        HALF_TOPIC: 1,
        OP_TOPIC: 1,
        CHECK_MAX_TOPIC: 1,
    }
    changed = False
    for name, queues in wanted.items():
        cur = topics.get(name)
        if cur is not None and cur.system and cur.readQueueNums >= queues and cur.writeQueueNums >= queues:
            continue
        _, did = topics.upsert(name, TopicConfigIn(readQueueNums=queues, writeQueueNums=queues, perm=rw),
                               system=True)
        changed = changed or did
    return changed


def hold_in(msg: Message, system_topic: str, queue_id: int) -> None:
    """Park ``msg`` in a system queue, remembering where it really goes."""
    msg.properties[PROPERTY_REAL_TOPIC] = msg.topic
    msg.properties[PROPERTY_REAL_QUEUE_ID] = str(msg.queue_id)
    msg.topic = system_topic
    msg.queue_id = queue_id


def release(stored: StoredMessage, drop: tuple[str, ...] = ()) -> Message:
    """The real message a held one stands for; properties named in ``drop`` go."""
    props = dict(stored.properties)
    topic = props.pop(PROPERTY_REAL_TOPIC, stored.topic)
    try:
        queue_id = int(props.pop(PROPERTY_REAL_QUEUE_ID, "0"))
    except ValueError:
        queue_id = 0
    for name in drop:
        props.pop(name, None)
    return Message(topic=topic, body=stored.body, queue_id=queue_id, flag=stored.flag, properties=props,
                   sysflag=stored.sysflag, born_timestamp=stored.born_timestamp, born_host=stored.born_host,
                   reconsume_times=stored.reconsume_times)


def read_entries(store: MessageStore, topic: str, queue_id: int, start: int,
                 count: int) -> list[tuple[int, int, int, int]]:
    """(queue offset, commit-log offset, size, tags code) from ``start``; thread-safe, blocking."""
    cq = store.queues.get((topic, queue_id))
    if cq is None:
        return []
    return list(cq.entries(start, count))


def store_timestamp(store: MessageStore, phys: int) -> int | None:
    """The store time of the record at ``phys`` (blocking read of 8 bytes)."""
    from ferrymq.common import record

    raw = store.commitlog.files.pread(phys + record.OFF_STORE_TIMESTAMP, 8)
    return int.from_bytes(raw, "big", signed=True) if len(raw) == 8 else None
