"""A broker replica in controller mode: identity, heartbeats, and the master/slave role.

The controller decides roles; this class carries them out:

* identity: the brokerId the controller assigned, kept in ``.broker.meta`` across restarts;
* heartbeats every controllerHeartbeatInterval, whose answers carry the group's state;
* master: appends (epoch, max offset) to the epoch file, streams to slaves, keeps the SyncStateSet
  (shrinks lagging slaves, re-admits caught-up ones, through the controller), waits for in-sync
  replicas on SYNC replication, and takes writes only while its lease (the last heartbeat answer that
  named it master) is fresh — so a master paused past the controller's timeout is fenced;
* slave: refuses writes naming the master, replicates, and copies topic configs and group offsets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from ferrymq.broker.ha.controller_client import ControllerClient
from ferrymq.broker.ha.epoch_file import EpochFile
from ferrymq.broker.ha.ha_client import HAClient
from ferrymq.broker.ha.ha_server import HAServer
from ferrymq.broker.ha.sync_state import SyncStateTracker
from ferrymq.broker.services.topics import TopicConfigIn
from ferrymq.common.config import FlushDiskType, ReplicationMode
from ferrymq.common.durable import read_json, write_json_atomic
from ferrymq.common.errors import FerryError
from ferrymq.common.limits import SYSTEM_TOPICS

if TYPE_CHECKING:
    from ferrymq.broker.server import Broker

log = logging.getLogger(__name__)
TOPIC_REPORT_INTERVAL = 30.0


class ReplicaManager:
    def __init__(self, broker: Broker, controller: ControllerClient, *, http_address: str, tcp_address: str,
                 ha_host: str, ha_port: int, ha_advertise: str | None = None) -> None:
        cfg = broker.config
        self.broker = broker
        self.config = cfg
        self.controller = controller
        self.group = cfg.broker_name
        self.name = cfg.broker_replica_name
        self.http_address = http_address
        self.tcp_address = tcp_address
        self.meta_path = Path(cfg.store_path_root_dir) / ".broker.meta"
        self.epochs = EpochFile(Path(cfg.store_path_root_dir) / "epochFileCheckpoint")
        self.store = broker.store
        self.ha_server = HAServer(self.store, self.epochs, ha_host, ha_port, cfg.ha_transfer_batch_size,
                                  self._on_ack, self._on_slave_gone,
                                  lambda: broker.topics.version, broker.topic_routes)
        self._ha_advertise = ha_advertise
        self.broker_id: int | None = None
        self.role = "none"
        self.master_epoch = 0
        self.master: dict[str, Any] | None = None
        self.tracker: SyncStateTracker | None = None
        self.client: HAClient | None = None
        self.lease_until = 0.0
        self.switching_away = False
        self.last_state: dict[str, Any] = {}
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._tasks: list[asyncio.Task[None]] = []
        self._isr_kick = asyncio.Event()
        self._topics_reported = (-1, 0.0)
        self._transition = asyncio.Lock()
        self._http: aiohttp.ClientSession | None = None
        # Until the controller names a role this replica takes no writes, on any protocol, and serves
        # nothing it recovered from disk: its tail may be one the group's master never had.
        broker.role = "slave"
        self.store.extra_visibility_limit = lambda: 0
        broker.messaging.write_guard = self.check_writable
        broker.messaging.replication_wait = self.wait_replicated

    @property
    def ha_address(self) -> str:
        host = self._ha_advertise or self.http_address.rpartition(":")[0]
        return f"{host}:{self.ha_server.port}"

    # ---- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        self.epochs.load()
        await self.ha_server.start()
        meta = read_json(self.meta_path, {}) or {}
        if meta and meta.get("group") not in (None, self.group):
            raise RuntimeError(f"{self.meta_path} belongs to group {meta.get('group')!r}, not {self.group!r}")
        self.broker_id = meta.get("brokerId")
        self.store.log_listeners.append(self._on_log_advanced)
        await self._register()
        self._tasks = [asyncio.create_task(self._heartbeat_loop(), name="controller-heartbeat"),
                       asyncio.create_task(self._isr_loop(), name="isr-maintenance"),
                       asyncio.create_task(self._slave_sync_loop(), name="slave-sync")]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(BaseException):
                await t
        if self.client is not None:
            await self.client.stop()
        # Written, not confirmed: the outcome is unknown to the producer, so not a plain "not stored".
        self._fail_waiters(FerryError("FLUSH_SLAVE_TIMEOUT", "the broker shut down before in-sync replicas "
                                      "confirmed the message; it may or may not be kept"))
        await self.ha_server.stop()
        await self.controller.close()
        if self._http is not None:
            await self._http.close()

    async def _register(self) -> None:
        backoff = 0.2
        while True:
            try:
                ans = await self.controller.register({
                    "group": self.group, "name": self.name, "brokerId": self.broker_id,
                    "httpAddress": self.http_address, "tcpAddress": self.tcp_address,
                    "haAddress": self.ha_address, "electionPriority": self.config.election_priority,
                })
                break
            except FerryError as exc:
                log.warning("registering with the controller failed: %s; retrying", exc.message)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 3.0)
        bid = int(ans["brokerId"])
        if bid != self.broker_id:
            self.broker_id = bid
            write_json_atomic(self.meta_path, {"brokerId": bid, "group": self.group, "name": self.name})
        self.broker.broker_id = bid
        log.info("registered with the controller as broker %d of group %s", bid, self.group)
        if isinstance(ans.get("group"), dict):
            await self.apply(ans["group"], time.monotonic())

    # ---- heartbeats and role changes ----------------------------------------------------------------
    def _beat(self) -> dict[str, Any]:
        beat: dict[str, Any] = {
            "group": self.group, "brokerId": self.broker_id, "epoch": self.epochs.last_epoch,
            "maxOffset": self.store.commitlog.max_offset,
            "confirmOffset": self.tracker.confirm_offset if self.tracker else
            (self.client.confirm_offset if self.client else 0),
            "electionPriority": self.config.election_priority,
            "writable": self.role == "master" and not self.switching_away, "topics": None,
        }
        if self.role == "master":
            version, at = self._topics_reported
            if version != self.broker.topics.version or time.monotonic() - at > TOPIC_REPORT_INTERVAL:
                beat["topics"] = self.broker.topic_routes()
        return beat

    async def _heartbeat_loop(self) -> None:
        interval = self.config.controller_heartbeat_interval / 1000
        failures = 0
        while True:
            sent_at = time.monotonic()
            beat = self._beat()
            try:
                state = await self.controller.heartbeat(beat)
                if beat["topics"] is not None:
                    self._topics_reported = (self.broker.topics.version, sent_at)
                failures = 0
                await self.apply(state, sent_at)
            except FerryError as exc:
                failures += 1
                if exc.code == "BROKER_NOT_REGISTERED":
                    await self._register()
                elif failures in (1, 10) or failures % 60 == 0:
                    log.warning("heartbeat to the controller failed (%d in a row): %s", failures, exc.message)
            except Exception:
                log.exception("applying the controller's answer failed")
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - sent_at)))

    async def apply(self, state: dict[str, Any], sent_at: float) -> None:
        """Carry out the group state the controller answered with."""
        async with self._transition:
            self.last_state = state
            master = state.get("master")
            mid = master.get("brokerId") if master else None
            epoch = int(state.get("masterEpoch", 0))
            if epoch < self.master_epoch:
                return  # an answer older than what we already acted on
            if mid == self.broker_id:
                if self.role != "master" or epoch != self.master_epoch:
                    await self._become_master(epoch)
                self.lease_until = sent_at + self.config.master_lease / 1000
                assert self.tracker is not None
                ss_epoch = int(state.get("syncStateSetEpoch", 0))
                if ss_epoch >= self.tracker.sync_state_set_epoch:
                    self.tracker.set_confirmed_set({int(b) for b in state.get("syncStateSet", [])}, ss_epoch)
                    self._progress()
                switching = state.get("switching")
                self.switching_away = bool(switching) and switching.get("from") == self.broker_id
            elif mid is not None:
                assert master is not None
                if self.role != "slave" or epoch != self.master_epoch or self.master != master:
                    await self._become_slave(master, epoch)
            elif self.role == "master":
                self._step_down("the controller reports no master for the group")

    async def _become_master(self, epoch: int) -> None:
        if self.client is not None:
            await self.client.stop()
            self.client = None
        start = self.store.commitlog.max_offset
        if epoch > self.epochs.last_epoch:
            self.epochs.append(epoch, start)
        await self._restore_missing_topics()
        tracker = SyncStateTracker(self.broker_id or 0, self.config.in_sync_replicas,
                                   self.config.all_ack_in_sync_state_set, self.config.ha_max_time_slave_not_catchup)
        tracker.master_offset = self._durable_offset()
        self.tracker = tracker
        self.store.extra_visibility_limit = lambda: tracker.confirm_offset
        self.ha_server.tracker = tracker
        self.role = "master"
        self.master_epoch = epoch
        self.master = {"brokerId": self.broker_id, "name": self.name, "httpAddress": self.http_address,
                       "tcpAddress": self.tcp_address, "haAddress": self.ha_address}
        self.broker.role, self.broker.epoch = "master", epoch
        self._topics_reported = (-1, 0.0)
        self.store.redispatch()
        log.warning("broker %s/%d is now MASTER at epoch %d (log ends at %d)", self.group, self.broker_id, epoch, start)

    async def _become_slave(self, master: dict[str, Any], epoch: int) -> None:
        was_master = self.role == "master"
        self._step_down(f"broker {master.get('brokerId')} is the master now")
        if self.client is not None:
            await self.client.stop()
        self.role = "slave"
        self.master_epoch = epoch
        self.master = master
        self.broker.role, self.broker.epoch = "slave", epoch
        client = HAClient(self.store, self.epochs, self.broker_id or 0, master["haAddress"], epoch,
                          self._adopt_topics)
        self.client = client
        self.store.extra_visibility_limit = lambda: client.confirm_offset
        client.start()
        log.warning("broker %s/%d is now SLAVE of %s at epoch %d%s", self.group, self.broker_id,
                    master.get("name") or master.get("brokerId"), epoch, " (was master)" if was_master else "")

    def _step_down(self, why: str) -> None:
        if self.role == "master":
            # These messages are written but not confirmed: they may survive (if the new master got them)
            # or not. FLUSH_SLAVE_TIMEOUT tells producers not to resend blindly (RocketMQ's
            # retryAnotherBrokerWhenNotStoreOK), unlike SERVICE_NOT_AVAILABLE, which means "not stored".
            exc = FerryError("FLUSH_SLAVE_TIMEOUT", f"this replica lost mastership ({why}) before the message was "
                             "confirmed; it may or may not be kept")
            self._fail_waiters(exc)
            self.store.fail_flush_waiters(exc)
            log.warning("broker %s/%d steps down: %s", self.group, self.broker_id, why)
        self.ha_server.tracker = None
        self.ha_server.close_connections()
        self.tracker = None
        self.role = "slave" if self.role == "master" else self.role
        self.broker.role = "slave"

    # ---- writes -----------------------------------------------------------------------------------
    def check_writable(self) -> None:
        if self.role != "master":
            m = self.master
            where = f"; the master is {m.get('name') or m.get('brokerId')} at {m.get('httpAddress')}" if m else \
                "; the group has no master right now"
            raise FerryError("SERVICE_NOT_AVAILABLE", f"this replica is a slave and takes no writes{where}",
                             master=m)
        if time.monotonic() > self.lease_until:
            raise FerryError("SERVICE_NOT_AVAILABLE", "this master has not heard from the controller within its "
                             "lease; writes wait until the controller confirms it")
        if self.switching_away:
            raise FerryError("SERVICE_NOT_AVAILABLE", "mastership is being handed over; retry shortly")
        assert self.tracker is not None
        n = len(self.tracker.sync_state_set)
        if n < self.config.min_in_sync_replicas:
            raise FerryError("IN_SYNC_REPLICAS_NOT_ENOUGH",
                             f"the SyncStateSet has {n} replica(s); minInSyncReplicas is "
                             f"{self.config.min_in_sync_replicas}")

    async def wait_replicated(self, end: int) -> None:
        tracker = self.tracker
        if self.role != "master" or tracker is None:
            raise FerryError("FLUSH_SLAVE_TIMEOUT", "this replica lost mastership after writing the message and "
                             "before it was confirmed; it may or may not be kept")
        if self.config.replication_mode != ReplicationMode.SYNC or tracker.replicated_offset() >= end:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((end, fut))
        try:
            await asyncio.wait_for(asyncio.shield(fut), self.config.sync_flush_timeout / 1000)
        except TimeoutError as exc:
            raise FerryError("FLUSH_SLAVE_TIMEOUT", f"in-sync replicas did not confirm within "
                             f"{self.config.sync_flush_timeout} ms; the message may still be replicated") from exc

    def _fail_waiters(self, exc: FerryError) -> None:
        while self._waiters:
            _, fut = self._waiters.popleft()
            if not fut.done():
                fut.set_exception(exc)

    def _durable_offset(self) -> int:
        cl = self.store.commitlog
        return cl.files.flushed_offset if self.config.flush_disk_type == FlushDiskType.SYNC_FLUSH else cl.max_offset

    def _progress(self) -> None:
        """Acks or the local log moved: release SYNC puts, expose what is confirmed, tell the senders."""
        tracker = self.tracker
        if tracker is None:
            return
        tracker.master_offset = self._durable_offset()
        if self._waiters:
            done_to = tracker.replicated_offset()
            while self._waiters and self._waiters[0][0] <= done_to:
                _, fut = self._waiters.popleft()
                if not fut.done():
                    fut.set_result(None)
        self.store.redispatch()
        self.ha_server.notify_data()

    def _on_log_advanced(self) -> None:
        if self.role == "master":
            self._progress()

    def _on_ack(self, broker_id: int, offset: int) -> None:
        tracker = self.tracker
        if tracker is None:
            return
        before = tracker.sync_state_set
        tracker.on_ack(broker_id, offset, self.store.commitlog.max_offset)
        self._progress()
        if broker_id not in before and offset >= tracker.confirm_offset:
            self._isr_kick.set()

    def _on_slave_gone(self, broker_id: int) -> None:
        if self.tracker is not None:
            self.tracker.on_disconnect(broker_id)

    # ---- SyncStateSet maintenance -------------------------------------------------------------------
    async def _isr_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._isr_kick.wait(), 0.5)
            self._isr_kick.clear()
            tracker = self.tracker
            if self.role != "master" or tracker is None:
                continue
            proposed = tracker.proposed_set()
            if proposed == tracker.sync_state_set:
                continue
            try:
                ans = await self.controller.alter_sync_state_set(self.group, tracker.master_id, self.master_epoch,
                                                                 tracker.sync_state_set_epoch, proposed)
            except FerryError as exc:
                log.warning("changing the SyncStateSet to %s failed: %s: %s", sorted(proposed), exc.code, exc.message)
                await asyncio.sleep(0.5)
                continue
            if self.tracker is tracker:
                old = tracker.sync_state_set
                tracker.set_confirmed_set({int(b) for b in ans["syncStateSet"]}, int(ans["syncStateSetEpoch"]))
                log.warning("SyncStateSet %s -> %s (epoch %d)", sorted(old), sorted(tracker.sync_state_set),
                            tracker.sync_state_set_epoch)
                self._progress()

    # ---- slaves copy topic configs and group offsets ------------------------------------------------
    async def _adopt_topics(self, topics: dict[str, dict[str, Any]]) -> None:
        """The master's topic configs, pushed over the replication link when they change."""
        changed = False
        for name, t in topics.items():
            spec = TopicConfigIn(readQueueNums=t["readQueueNums"], writeQueueNums=t["writeQueueNums"],
                                 perm=t["perm"], messageType=t.get("messageType", "NORMAL"))
            _, c = await asyncio.to_thread(self.broker.topics.upsert, name, spec)
            changed |= c
        for name in [n for n, c in self.broker.topics.topics.items() if not c.system and n not in topics]:
            self.broker.delete_topic(name)
            changed = True
        if changed:
            log.info("topic configs updated from the master")

    async def _restore_missing_topics(self) -> None:
        """A new master must serve every topic it holds messages of. Configs reach slaves right after a
        change, but a master that dies in that instant leaves queues without a config: recreate those
        (queue counts from the queues present) rather than answer TOPIC_NOT_EXIST for stored messages."""
        held: dict[str, int] = {}
        for topic, qid in list(self.store.queues):
            if self.store.max_offset(topic, qid) > 0:
                held[topic] = max(held.get(topic, 0), qid + 1)
        for topic, n in held.items():
            if self.broker.topics.get(topic) is None and topic not in SYSTEM_TOPICS:
                log.warning("topic %s has messages but no config on the new master; recreating it with %d "
                            "queue(s)", topic, n)
                await asyncio.to_thread(self.broker.topics.upsert, topic,
                                        TopicConfigIn(readQueueNums=n, writeQueueNums=n))
    async def _slave_sync_loop(self) -> None:
        interval = self.config.slave_sync_interval / 1000
        while True:
            await asyncio.sleep(interval)
            if self.role != "slave" or not self.master:
                continue
            try:
                await self._sync_from_master(self.master["httpAddress"])
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, FerryError) as exc:
                log.debug("syncing configs from the master failed: %s", exc)

    async def _sync_from_master(self, http_address: str) -> None:
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        base = f"http://{http_address}"
        async with self._http.get(f"{base}/v1/topics") as resp:
            topics = (await resp.json())["topics"]
        async with self._http.get(f"{base}/v1/internal/offsets") as resp:
            offsets = (await resp.json())["offsets"]
        await self._adopt_topics({t["topicName"]: t for t in topics})
        self.broker.offsets.replace_all(offsets)
        # Delay-level offsets, the timer checkpoint and the transaction scan position, so that a
        # promotion resumes delivery where the master was instead of delivering again.
        async with self._http.get(f"{base}/v1/internal/message-type-progress") as resp:
            progress = await resp.json()
        if self.role == "slave":
            await asyncio.to_thread(self.broker.message_types.adopt_progress, progress)
