"""The operator's reading of the controller, against a real controller and real broker replicas.

The decisions are unit-tested on hand-written JSON elsewhere; this keeps that JSON honest.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from support import ControllerProcess, ReplicaProcess, wait_until

from ferrymq.operator.controller_client import ControllerClient
from ferrymq.operator.decisions import parse_group


@pytest.mark.slow
async def test_parse_group_reads_a_live_controller(tmp_path: Path) -> None:
    ctl = ControllerProcess(tmp_path, extra=["--heartbeat-timeout-ms", "2000"]).start()
    cfg = {"controllerHeartbeatInterval": 200, "masterLease": 1200}
    pods = [ReplicaProcess(tmp_path, f"bg-{i}", "bg", ctl.url, config=cfg).start() for i in range(2)]
    wait_until(lambda: len(ctl.call("GET", "/v1/groups/bg")[1].get("syncStateSet", [])) == 2, 20, 0.1,
               "both replicas in sync")
    async with aiohttp.ClientSession() as session:
        view = parse_group(await ControllerClient(ctl.url, session).group("bg"))
    assert view.master == "bg-0"
    assert view.master_epoch == 1
    assert view.sync_state_set == frozenset({"bg-0", "bg-1"})
    assert {r.name for r in view.replicas} == {"bg-0", "bg-1"}
    assert {r.name: r.role for r in view.replicas} == {"bg-0": "master", "bg-1": "slave"}
    for p in pods:
        p.stop()
    ctl.stop()
