"""End to end on kind: install, BrokerGroup + Topic, produce/consume over HTTP and TCP, master failover
with no acknowledged message lost, and a Topic's queues grown then safely shrunk.

Runs only where Docker, kind, kubectl and helm are available (see conftest.py and README.md).
"""

from __future__ import annotations

import json
import textwrap
import uuid

import pytest
from conftest import IMAGE, NAMESPACE, Kube

GROUP = "e2e"
TOPIC = "e2e-orders"
MASTER = f"http://{GROUP}-master.{NAMESPACE}.svc:8080"
CONTROLLER = f"http://ferrymq-controller.{NAMESPACE}.svc:9876"

HTTP_LIB = textwrap.dedent("""
    import json, sys, time, urllib.request
    def call(base, method, path, body=None, timeout=15):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read() or b"null")
""")


def job(kube: Kube, name: str, script: str, timeout: int = 300) -> str:
    """Run a Python script in the FerryMQ image as a Job; returns its log."""
    manifest = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "backoffLimit": 0,
            "ttlSecondsAfterFinished": 600,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "run",
                            "image": IMAGE,
                            "imagePullPolicy": "Never",
                            "command": ["python", "-c", HTTP_LIB + script],
                        }
                    ],
                }
            },
        },
    }
    kube("delete", "job", name, "--ignore-not-found", "--wait=true")
    kube.apply(json.dumps(manifest))
    kube("wait", f"job/{name}", "--for=condition=complete", f"--timeout={timeout}s", timeout=timeout + 30)
    return kube("logs", f"job/{name}")


def group_status(kube: Kube) -> dict:
    return kube.get("brokergroup", GROUP).get("status") or {}


@pytest.fixture(scope="module")
def group(kube: Kube) -> Kube:
    kube.apply(
        json.dumps(
            {
                "apiVersion": "ferrymq.io/v1alpha1",
                "kind": "BrokerGroup",
                "metadata": {"name": GROUP, "namespace": NAMESPACE},
                "spec": {
                    "replicas": 3,
                    "image": IMAGE,
                    "imagePullPolicy": "Never",
                    "storage": {"size": "1Gi"},
                    "flushDiskType": "SYNC_FLUSH",
                    "replication": {"mode": "SYNC", "inSyncReplicas": 2, "minInSyncReplicas": 2},
                },
            }
        )
    )
    kube.wait_for(
        "3 ready replicas and a master",
        lambda: (
            (s := group_status(kube)).get("readyReplicas") == 3
            and s.get("master")
            and len(s.get("syncStateSet") or []) >= 2
        ),
        timeout=600,
    )
    kube.apply(
        json.dumps(
            {
                "apiVersion": "ferrymq.io/v1alpha1",
                "kind": "Topic",
                "metadata": {"name": TOPIC, "namespace": NAMESPACE},
                "spec": {"readQueueNums": 4, "writeQueueNums": 4},
            }
        )
    )
    kube.wait_for("Topic Ready", lambda: topic_ready(kube))
    return kube


def topic_ready(kube: Kube) -> bool:
    conds = (kube.get("topic", TOPIC).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def test_printer_columns(group: Kube) -> None:
    out = group("get", "brokergroups")
    assert "MASTER" in out and "EPOCH" in out and GROUP in out
    assert "READY" in group("get", "fmqtopic")


def test_produce_consume_over_http(group: Kube) -> None:
    marker = uuid.uuid4().hex
    log = job(
        group,
        "e2e-http",
        f"""
sent = call("{MASTER}", "POST", "/v1/topics/{TOPIC}/messages",
            {{"messages": [{{"body": "{marker}-%d" % i, "tags": "e2e"}} for i in range(20)]}})["results"]
assert all(r["status"] == "SEND_OK" for r in sent), sent
for r in sent:
    path = f"/v1/topics/{TOPIC}/queues/{{r['queueId']}}/messages?offset={{r['queueOffset']}}&maxMessages=1"
    got = call("{MASTER}", "GET", path)
    assert got["messages"][0]["msgId"] == r["msgId"], got
print("OK", len(sent))
""",
    )
    assert "OK 20" in log


def test_produce_consume_over_tcp_with_the_python_client(group: Kube) -> None:
    log = job(
        group,
        "e2e-tcp",
        f"""
import threading
from ferrymq.client import ConsumeResult, Message, Producer, PushConsumer
p = Producer("{CONTROLLER}", group="e2e-pg"); p.start()
ids = {{p.send(Message(topic="{TOPIC}", body=b"tcp-%d" % i)).msg_id for i in range(10)}}
p.shutdown()
seen, done = set(), threading.Event()
def listener(msgs):
    seen.update(m.msg_id for m in msgs)
    if ids <= seen: done.set()
    return ConsumeResult.SUCCESS
c = PushConsumer("{CONTROLLER}", group="e2e-tcp-cg", topic="{TOPIC}", listener=listener)
c.start(); ok = done.wait(120); c.shutdown()
assert ok, (len(ids - seen), "missing")
print("OK tcp", len(ids))
""",
    )
    assert "OK tcp 10" in log


def test_master_failover_loses_no_acknowledged_message(group: Kube) -> None:
    before = group_status(group)
    old_master, old_epoch = before["master"], before["masterEpoch"]
    # A producer that keeps sending through the master Service and logs each acknowledgement.
    producer = f"""
deadline, acked = time.time() + 90, []
while time.time() < deadline:
    try:
        r = call("{MASTER}", "POST", "/v1/topics/{TOPIC}/messages", {{"body": "fo-%d" % len(acked)}}, timeout=5)
        acked.append(r["results"][0]); print("ACK", json.dumps(r["results"][0]), flush=True)
    except Exception as exc:
        print("ERR", exc, flush=True); time.sleep(0.5)
"""
    manifest_name = "e2e-failover-producer"
    group("delete", "job", manifest_name, "--ignore-not-found", "--wait=true")
    group.apply(
        json.dumps(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": manifest_name, "namespace": NAMESPACE},
                "spec": {
                    "backoffLimit": 0,
                    "template": {
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [
                                {
                                    "name": "run",
                                    "image": IMAGE,
                                    "imagePullPolicy": "Never",
                                    "command": ["python", "-c", HTTP_LIB + producer],
                                }
                            ],
                        }
                    },
                },
            }
        )
    )
    group.wait_for("producer acks", lambda: "ACK" in group("logs", f"job/{manifest_name}", check=False), 120)
    group("delete", "pod", old_master, "--wait=false")
    group.wait_for(
        "a new master",
        lambda: (
            (s := group_status(group)).get("master") not in (None, old_master) and s.get("masterEpoch", 0) > old_epoch
        ),
        timeout=180,
    )
    group("wait", f"job/{manifest_name}", "--for=condition=complete", "--timeout=180s", timeout=200)
    acked = [
        json.loads(line[4:]) for line in group("logs", f"job/{manifest_name}").splitlines() if line.startswith("ACK ")
    ]
    assert acked, "the producer got no acknowledgement at all"
    wanted = json.dumps([[a["queueId"], a["queueOffset"], a["msgId"]] for a in acked])
    log = job(
        group,
        "e2e-failover-check",
        f"""
missing = []
for q, off, msg_id in json.loads('{wanted}'):
    got = call("{MASTER}", "GET", f"/v1/topics/{TOPIC}/queues/{{q}}/messages?offset={{off}}&maxMessages=1")
    if not got["messages"] or got["messages"][0]["msgId"] != msg_id:
        missing.append(msg_id)
print("MISSING", len(missing))
""",
    )
    assert "MISSING 0" in log


def test_topic_grow_then_safe_shrink(group: Kube) -> None:
    group(
        "patch", "topic", TOPIC, "--type=merge", "-p", json.dumps({"spec": {"readQueueNums": 8, "writeQueueNums": 8}})
    )
    group.wait_for(
        "8 queues in force",
        lambda: all(
            g.get("readQueueNums") == 8 for g in (group.get("topic", TOPIC)["status"].get("groups") or {}).values()
        ),
    )
    group(
        "patch", "topic", TOPIC, "--type=merge", "-p", json.dumps({"spec": {"readQueueNums": 2, "writeQueueNums": 2}})
    )
    # Step one: writes shrink at once, reads wait for consumers.
    group.wait_for(
        "writeQueueNums 2 with reads still 8",
        lambda: any(
            g.get("writeQueueNums") == 2 and g.get("readQueueNums") == 8 and g.get("phase") == "Shrinking"
            for g in (group.get("topic", TOPIC)["status"].get("groups") or {}).values()
        ),
        timeout=120,
    )
    # A consumer group catches up on every queue (committing offsets), which lets the shrink finish.
    job(
        group,
        "e2e-drain",
        f"""
for q in range(8):
    info = call("{MASTER}", "GET", "/v1/topics/{TOPIC}")
    top = next(x["maxOffset"] for x in info["queues"] if x["queueId"] == q)
    for g in call("{MASTER}", "GET", "/v1/topics/{TOPIC}/groups")["groups"]:
        call("{MASTER}", "PUT", f"/v1/groups/{{g}}/offsets/{TOPIC}/{{q}}", {{"offset": top}})
print("drained")
""",
    )
    group.wait_for(
        "readQueueNums 2",
        lambda: all(
            g.get("readQueueNums") == 2 and g.get("phase") == "Ready"
            for g in (group.get("topic", TOPIC)["status"].get("groups") or {}).values()
        ),
        timeout=240,
    )
    assert topic_ready(group)
