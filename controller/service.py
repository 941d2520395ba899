"""The controller's decisions loop: leadership, heartbeats, expiry scans, elections, graceful switches.

Only the leader decides. Each decision is computed by the pure rules in ``replicas`` from the state in memory,
persisted with the store's compare-and-swap, and only then adopted — so a decision the store refused (or a
leader killed before persisting) never happened, and the next leader, reloading the state, decides again.
Followers keep a copy of the stored state for the reads they serve (routes, health, metrics).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from ferrymq.controller import replicas as rules
from ferrymq.controller.config import ControllerConfig
from ferrymq.controller.errors import ControllerError
from ferrymq.controller.failpoints import failpoint
from ferrymq.controller.heartbeats import HeartbeatTable
from ferrymq.controller.replicas import GroupState, Statuses
from ferrymq.controller.routes import ReplicaAddress, RouteTable
from ferrymq.controller.stores.base import ControllerStore, StoreConflict, StoreUnavailable

log = logging.getLogger("ferrymq.controller")
FOLLOWER_REFRESH_S = 0.5  # a follower re-reads the store at most this often before serving a read


def _now_ms() -> int:
    return int(time.time() * 1000)


class ControllerService:
    def __init__(self, config: ControllerConfig, store: ControllerStore, *,
                 clock: Callable[[], float] = time.monotonic, wall_ms: Callable[[], int] = _now_ms) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self.wall_ms = wall_ms
        self.unclean = config.enable_elect_unclean_master
        self.groups: dict[str, GroupState] = {}
        self.version: Any = None
        self.heartbeats = HeartbeatTable(config.controller_broker_heartbeat_timeout, clock)
        self.routes = RouteTable()
        self.elections: dict[tuple[str, str], int] = {}  # (group, outcome) -> count, for /metrics
        self._lock = asyncio.Lock()
        self._leading = False
        self._term: Any = None
        self._loaded_at = float("-inf")
        self._masterless: set[str] = set()
        self._changed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # ---- lifecycle --------------------------------------------------------------------------------------
    async def start(self) -> None:
        await self.store.open()
        await self._reload()
        self._tasks = [asyncio.create_task(self._leadership_loop(), name="controller-leadership"),
                       asyncio.create_task(self._scan_loop(), name="controller-scan")]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._leading:
            self._leading = False
            await self.store.resign()
        await self.store.close()

    @property
    def is_leader(self) -> bool:
        return self._leading and self.store.is_leader()

    async def _leadership_loop(self) -> None:
        while True:
            try:
                leading = await self.store.campaign()
                if self._leading and (not leading or self.store.leadership_term != self._term):
                    self._on_deposed()
                if leading and not self._leading:
                    await self._on_elected()
            except StoreUnavailable as exc:
                log.warning("state store unavailable: %s", exc.message)
            except Exception:
                log.exception("leadership round failed")
            await asyncio.sleep(self.store.campaign_interval_s)

    async def _on_elected(self) -> None:
        async with self._lock:
            await self._reload()
            # Liveness is not persisted: every known replica gets one full timeout to reach the new leader.
            self.heartbeats.clear()
            for name, gs in self.groups.items():
                self.heartbeats.seed(name, gs.replicas)
            self._masterless.clear()
            self._term = self.store.leadership_term
            self._leading = True
        log.info("this controller (%s) is now the leader; %d group(s) loaded", self.store.identity, len(self.groups))

    def _on_deposed(self) -> None:
        self._leading = False
        self.heartbeats.clear()
        log.warning("this controller (%s) lost leadership; leader is now %s", self.store.identity,
                    self.store.leader_address())

    def _require_leader(self) -> None:
        if not self.is_leader:
            raise ControllerError("NOT_LEADER", "this controller is not the leader", leader=self.leader_url())

    def leader_url(self) -> str | None:
        """The leader's URL for redirects; None while unknown or while this controller is still taking over."""
        addr = self.store.leader_address()
        if addr == self.store.identity and not self.is_leader:
            return None
        return addr

    # ---- state ------------------------------------------------------------------------------------------
    async def _reload(self) -> None:
        stored = await self.store.load()
        self._adopt(rules.state_from_json(stored.data), stored.version)
        self._loaded_at = self.clock()

    async def refresh_if_follower(self) -> None:
        """Followers serve reads from the stored state, re-read at most every FOLLOWER_REFRESH_S."""
        if self.is_leader or self.clock() - self._loaded_at < FOLLOWER_REFRESH_S:
            return
        async with self._lock:
            if not self.is_leader and self.clock() - self._loaded_at >= FOLLOWER_REFRESH_S:
                try:
                    await self._reload()
                except StoreUnavailable as exc:
                    # serve the last state read rather than fail health probes while the store is away
                    log.warning("cannot refresh state from the store: %s", exc.message)
                    self._loaded_at = self.clock()

    def _adopt(self, groups: dict[str, GroupState], version: Any) -> None:
        self.groups = groups
        self.version = version
        for name, gs in groups.items():
            self.routes.replace_group(
                name,
                [ReplicaAddress(r.broker_id, r.http_address, r.tcp_address, name=r.name) for r in gs.replicas.values()],
                gs.master_id, {t: dict(c) for t, c in gs.topics.items()})
        self.routes.retain(set(groups))
        self._changed.set()
        self._changed = asyncio.Event()

    async def _commit(self, groups: dict[str, GroupState]) -> None:
        """Persist, then adopt. Called with the lock held."""
        try:
            version = await self.store.compare_and_swap(self.version, rules.state_to_json(groups))
        except StoreConflict:
            log.warning("the store refused a write (state changed or leadership lost); reloading")
            with contextlib.suppress(StoreUnavailable):
                await self._reload()
            raise
        self._adopt(groups, version)

    async def _change_group(self, name: str, decide: Callable[[GroupState, Statuses], GroupState],
                            before_persist: Callable[[GroupState, GroupState], Awaitable[None]] | None = None,
                            ) -> GroupState:
        """Apply one pure rule to a group under the lock; persist when it changed anything."""
        async with self._lock:
            self._require_leader()
            current = self.groups.get(name)
            if current is None:
                raise ControllerError("GROUP_NOT_FOUND", f"no broker group {name!r} has registered")
            new = decide(current, self.heartbeats.statuses(name))
            if new != current:
                if before_persist is not None:
                    await before_persist(current, new)
                await self._commit({**self.groups, name: new})
                self._log_change(current, new)
            self._note_masterless(name)
            return self.groups[name]

    def _log_change(self, old: GroupState, new: GroupState) -> None:
        g = new.group
        if new.master_id != old.master_id:
            outcome = "elected" if new.master_id is not None else "none"
            self.elections[(g, outcome)] = self.elections.get((g, outcome), 0) + 1
            if new.master_id is not None:
                # a first master is routine; a changed one is a failover or a switch worth noticing
                log.log(logging.INFO if old.master_id is None and not old.replicas else logging.WARNING,
                        "group %s: broker %s is master at masterEpoch %d (was %s); SyncStateSet %s epoch %d",
                        g, new.master_id, new.master_epoch, old.master_id, sorted(new.sync_state_set),
                        new.sync_state_set_epoch)
        if new.switching != old.switching:
            if new.switching is not None:
                log.info("group %s: graceful switch from %s to %s started", g, new.switching.from_id,
                         new.switching.to_id)
            elif old.switching is not None and new.master_id != old.switching.to_id:
                log.warning("group %s: graceful switch to %s abandoned", g, old.switching.to_id)
        if new.sync_state_set != old.sync_state_set and new.master_id == old.master_id:
            log.info("group %s: SyncStateSet %s -> %s (epoch %d)", g, sorted(old.sync_state_set),
                     sorted(new.sync_state_set), new.sync_state_set_epoch)

    def _note_masterless(self, name: str) -> None:
        """Log once per transition into and out of 'no master', not on every scan."""
        gs = self.groups.get(name)
        if gs is None:
            return
        if gs.master_id is None and name not in self._masterless:
            self._masterless.add(name)
            log.error("group %s has no master: no alive replica is electable (SyncStateSet %s, "
                      "enableElectUncleanMaster=%s); it takes no writes until an in-sync replica returns",
                      name, sorted(gs.sync_state_set), str(self.unclean).lower())
        elif gs.master_id is not None and name in self._masterless:
            self._masterless.discard(name)
            log.warning("group %s has a master again: broker %s", name, gs.master_id)

    # ---- scans ------------------------------------------------------------------------------------------
    async def _scan_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.scan_interval / 1000)
            if not self.is_leader:
                continue
            try:
                await self.scan()
            except ControllerError as exc:
                log.warning("scan: %s", exc.message)
            except Exception:
                log.exception("scan failed")

    async def scan(self) -> None:
        """Expire masters and elect; move graceful switches on (RocketMQ's scanNeedReelectBrokerSets)."""
        for name in list(self.groups):
            await self._change_group(name, self._scan_rule, self._before_election)

    def _scan_rule(self, gs: GroupState, statuses: Statuses) -> GroupState:
        new = gs
        if not rules.is_alive(statuses, gs.master_id):
            if gs.master_id is not None:
                log.warning("group %s: master %s expired (no heartbeat for %s ms)", gs.group, gs.master_id,
                            self.config.controller_broker_heartbeat_timeout)
            new = rules.elect(gs, statuses, unclean=self.unclean)
        return rules.progress_switch(new, statuses, now_ms=self.wall_ms())

    async def _before_election(self, old: GroupState, new: GroupState) -> None:
        if new.master_id != old.master_id:
            await failpoint("controller.before_persist_election")

    # ---- broker requests --------------------------------------------------------------------------------
    async def register(self, group: str, name: str, *, http_address: str, tcp_address: str, ha_address: str,
                       broker_id: int | None, election_priority: int) -> tuple[int, GroupState]:
        async with self._lock:
            self._require_leader()
            current = self.groups.get(group)
            reg = rules.register(current, group, name, http_address=http_address, tcp_address=tcp_address,
                                 ha_address=ha_address, broker_id=broker_id, election_priority=election_priority)
            if reg.state != current:
                await self._commit({**self.groups, group: reg.state})
                if current is None or current.master_id != reg.state.master_id:
                    self._log_change(current or GroupState(group), reg.state)
                log.info("group %s: %s registered as broker %d", group, name, reg.broker_id)
            self.heartbeats.touch(group, reg.broker_id)
            self._note_masterless(group)
            return reg.broker_id, self.groups[group]

    async def heartbeat(self, group: str, broker_id: int, *, epoch: int, max_offset: int, confirm_offset: int,
                        election_priority: int | None, writable: bool | None,
                        topics: dict[str, dict[str, Any]] | None) -> GroupState:
        self._require_leader()
        gs = self.groups.get(group)
        if gs is None or broker_id not in gs.replicas:
            raise ControllerError("BROKER_NOT_REGISTERED",
                                  f"broker {broker_id} of group {group!r} is not registered; register again")
        self.heartbeats.beat(group, broker_id, epoch=epoch, max_offset=max_offset, confirm_offset=confirm_offset,
                             election_priority=election_priority, writable=writable)
        topics_changed = topics is not None and gs.master_id == broker_id and topics != gs.topics
        if not topics_changed and gs.switching is None:
            return gs

        def decide(current: GroupState, statuses: Statuses) -> GroupState:
            new = current
            if topics is not None and current.master_id == broker_id and topics != current.topics:
                new = replace(new, topics=topics)
            return rules.progress_switch(new, statuses, now_ms=self.wall_ms())

        return await self._change_group(group, decide)

    async def alter_sync_state_set(self, group: str, *, master_id: int, master_epoch: int,
                                   sync_state_set_epoch: int, sync_state_set: list[int]) -> GroupState:
        return await self._change_group(group, lambda gs, st: rules.alter_sync_state_set(
            gs, master_id=master_id, master_epoch=master_epoch, sync_state_set_epoch=sync_state_set_epoch,
            new_set=sync_state_set, statuses=st))

    async def elect(self, group: str, broker_id: int | None) -> GroupState:
        """``broker_id`` None: re-run the election now. Otherwise start a graceful switch (designateElect)."""
        if broker_id is None:
            return await self._change_group(group, lambda gs, st: rules.elect(gs, st, unclean=self.unclean),
                                            self._before_election)

        def decide(gs: GroupState, statuses: Statuses) -> GroupState:
            new = rules.designate(gs, broker_id, statuses, now_ms=self.wall_ms(), timeout_ms=self.config.switch_timeout)
            if new.switching is not None and new.switching != gs.switching:
                # only a heartbeat sent after this moment may tell us the old master stopped writing
                self.heartbeats.forget_writable(gs.group, new.switching.from_id)
            return new

        return await self._change_group(group, decide)

    async def wait_switch(self, group: str, target: int) -> GroupState:
        """Wait until the group's switch is over; the state then (master == target when it completed)."""
        deadline = self.clock() + self.config.switch_timeout / 1000 + 2 * self.config.scan_interval / 1000
        while True:
            gs = self.groups.get(group)
            if gs is None or gs.switching is None or gs.switching.to_id != target:
                return gs or GroupState(group)
            remaining = deadline - self.clock()
            if remaining <= 0:
                return gs
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(remaining, self.config.scan_interval / 1000))

    # ---- reads ------------------------------------------------------------------------------------------
    def statuses(self, group: str) -> Statuses:
        return self.heartbeats.statuses(group) if self.is_leader else {}

    def groups_without_master(self) -> list[str]:
        return sorted(n for n, gs in self.groups.items() if gs.master_id is None)
