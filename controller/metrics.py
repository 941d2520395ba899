"""Prometheus metrics of the controller, computed from its state at scrape time (no stale label sets)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ferrymq.controller.replicas import electable


class ControllerCollector(Collector):
    def __init__(self, service: Any) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        svc = self.service
        leader = svc.is_leader
        yield GaugeMetricFamily("ferrymq_controller_is_leader", "1 when this controller is the leader",
                                value=1 if leader else 0)
        has_master = GaugeMetricFamily("ferrymq_controller_group_has_master",
                                       "1 when the broker group has a master", labels=["group"])
        epoch = GaugeMetricFamily("ferrymq_controller_master_epoch", "the group's masterEpoch", labels=["group"])
        sss = GaugeMetricFamily("ferrymq_controller_sync_state_set_size", "members of the group's SyncStateSet",
                                labels=["group"])
        sss_epoch = GaugeMetricFamily("ferrymq_controller_sync_state_set_epoch", "the group's syncStateSetEpoch",
                                      labels=["group"])
        alive = GaugeMetricFamily("ferrymq_controller_alive_replicas",
                                  "replicas heartbeating within the timeout (leader only)", labels=["group"])
        can_elect = GaugeMetricFamily("ferrymq_controller_group_electable",
                                      "1 when the group has a master or an electable replica (leader only)",
                                      labels=["group"])
        for name, gs in sorted(svc.groups.items()):
            has_master.add_metric([name], 1 if gs.master_id is not None else 0)
            epoch.add_metric([name], gs.master_epoch)
            sss.add_metric([name], len(gs.sync_state_set))
            sss_epoch.add_metric([name], gs.sync_state_set_epoch)
            if leader:
                statuses = svc.statuses(name)
                alive.add_metric([name], sum(1 for st in statuses.values() if st.alive))
                can_elect.add_metric([name], 1 if electable(gs, statuses, unclean=svc.unclean) else 0)
        yield from (has_master, epoch, sss, sss_epoch, alive, can_elect)
        elections = CounterMetricFamily("ferrymq_controller_elections",
                                        "master changes decided by this controller, by outcome "
                                        "(elected, none: left without master)", labels=["group", "outcome"])
        for (name, outcome), count in sorted(svc.elections.items()):
            elections.add_metric([name, outcome], count)
        yield elections


def metrics_route(service: Any) -> web.RouteDef:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ControllerCollector(service))

    async def metrics(request: web.Request) -> web.Response:
        await service.refresh_if_follower()
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    return web.get("/metrics", metrics)
