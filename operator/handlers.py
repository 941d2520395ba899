"""kopf handlers: thin glue from Kubernetes events and timers to the reconcile passes.

Change handlers give a fast first reaction; timers keep converging (rolling updates, queue
drains, master relabelling after a failover) and resume whatever an operator restart cut short.
A per-object lock serialises the two within this process; kopf peering keeps other operator
replicas passive, so at most one pass per object runs at a time cluster-wide.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import defaultdict
from typing import Any, NoReturn

import aiohttp
import kopf
import pydantic

from ferrymq.operator import models, reconcile
from ferrymq.operator.broker_admin import BrokerAdmin
from ferrymq.operator.controller_client import ControllerClient
from ferrymq.operator.http import ApiError
from ferrymq.operator.kube import ApiGateway

BG = (models.GROUP, models.VERSION, "brokergroups")
TOPIC = (models.GROUP, models.VERSION, "topics")
BG_INTERVAL = float(os.environ.get("FERRYMQ_OPERATOR_BG_INTERVAL", "5"))
TOPIC_INTERVAL = float(os.environ.get("FERRYMQ_OPERATOR_TOPIC_INTERVAL", "10"))

_locks: defaultdict[tuple[str, str, str], asyncio.Lock] = defaultdict(asyncio.Lock)


def controller_url() -> str:
    return os.environ.get("FERRYMQ_CONTROLLER_URL", "http://ferrymq-controller:9876")


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Progress and diff-base live in annotations, so the status schema stays strict (no kopf fields).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="ferrymq.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="ferrymq.io")
    settings.persistence.finalizer = "ferrymq.io/finalizer"
    settings.posting.level = logging.INFO
    settings.networking.request_timeout = 30
    from kubernetes import config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    memo.session = aiohttp.ClientSession()
    memo.kube = ApiGateway()


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    session = getattr(memo, "session", None)
    if session is not None:
        await session.close()


def _emit(body: kopf.Body, events: list[tuple[str, str, str]]) -> None:
    for type_, reason, message in events:
        kopf.event(body, type=type_, reason=reason, message=message)


def _invalid(body: kopf.Body, patch: kopf.Patch, meta: kopf.Meta, exc: pydantic.ValidationError) -> NoReturn:
    message = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
    patch.status["conditions"] = [
        {
            "type": "Ready",
            "status": "False",
            "reason": "InvalidSpec",
            "message": message,
            "observedGeneration": meta.get("generation"),
        }
    ]
    kopf.warn(body, reason="InvalidSpec", message=message)
    raise kopf.PermanentError(f"invalid spec: {message}")


# --------------------------------------------------------------------------- BrokerGroup


async def _broker_group_pass(
    body: kopf.Body, spec: kopf.Spec, meta: kopf.Meta, status: kopf.Status, patch: kopf.Patch, memo: kopf.Memo
) -> reconcile.PassResult:
    try:
        parsed = models.BrokerGroupSpec.model_validate(dict(spec))
    except pydantic.ValidationError as exc:
        _invalid(body, patch, meta, exc)
    async with _locks[("bg", meta["namespace"], meta["name"])]:
        controller = ControllerClient(parsed.controller_url or controller_url(), memo.session)
        try:
            result = await reconcile.reconcile_broker_group(
                name=meta["name"],
                namespace=meta["namespace"],
                uid=meta["uid"],
                generation=meta.get("generation"),
                spec=parsed,
                kube=memo.kube,
                controller=controller,
                default_controller_url=controller_url(),
                previous_conditions=list(status.get("conditions") or []),
            )
        except ApiError as exc:
            raise kopf.TemporaryError(str(exc), delay=10) from exc
    patch.status.update(result.status)
    _emit(body, result.events)
    return result


@kopf.on.create(*BG)
@kopf.on.update(*BG, field="spec")
@kopf.on.resume(*BG)
async def broker_group_changed(
    body: kopf.Body,
    spec: kopf.Spec,
    meta: kopf.Meta,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    await _broker_group_pass(body, spec, meta, status, patch, memo)


@kopf.timer(*BG, interval=BG_INTERVAL, initial_delay=BG_INTERVAL)
async def broker_group_tick(
    body: kopf.Body,
    spec: kopf.Spec,
    meta: kopf.Meta,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    await _broker_group_pass(body, spec, meta, status, patch, memo)


# --------------------------------------------------------------------------- Topic


def _admin_factory(memo: kopf.Memo) -> Any:
    return lambda url: BrokerAdmin(url, memo.session)


async def _topic_pass(
    body: kopf.Body, spec: kopf.Spec, meta: kopf.Meta, status: kopf.Status, patch: kopf.Patch, memo: kopf.Memo
) -> reconcile.PassResult:
    try:
        parsed = models.TopicSpec.model_validate(dict(spec))
    except pydantic.ValidationError as exc:
        _invalid(body, patch, meta, exc)
    async with _locks[("topic", meta["namespace"], meta["name"])]:
        result = await reconcile.reconcile_topic(
            name=meta["name"],
            namespace=meta["namespace"],
            generation=meta.get("generation"),
            spec=parsed,
            previous_status=dict(status),
            kube=memo.kube,
            controller=ControllerClient(controller_url(), memo.session),
            make_admin=_admin_factory(memo),
        )
    patch.status.update(result.status)
    _emit(body, result.events)
    return result


@kopf.on.create(*TOPIC)
@kopf.on.update(*TOPIC, field="spec")
@kopf.on.resume(*TOPIC)
async def topic_changed(
    body: kopf.Body,
    spec: kopf.Spec,
    meta: kopf.Meta,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    result = await _topic_pass(body, spec, meta, status, patch, memo)
    groups = result.status.get("groups") or {}
    if any(g.get("phase") == "Error" for g in groups.values()) and not result.converged:
        # Unreachable brokers: kopf retries with backoff; rejected specs wait for the next edit or timer.
        raise kopf.TemporaryError("topic not applied everywhere yet", delay=15)


@kopf.timer(*TOPIC, interval=TOPIC_INTERVAL, initial_delay=TOPIC_INTERVAL)
async def topic_tick(
    body: kopf.Body,
    spec: kopf.Spec,
    meta: kopf.Meta,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    await _topic_pass(body, spec, meta, status, patch, memo)


@kopf.on.delete(*TOPIC)
async def topic_deleted(body: kopf.Body, spec: kopf.Spec, meta: kopf.Meta, memo: kopf.Memo, **_: Any) -> None:
    try:
        parsed = models.TopicSpec.model_validate(dict(spec))
    except pydantic.ValidationError:
        return  # Never applied, so nothing to delete on the brokers.
    try:
        groups = await reconcile.delete_topic(
            name=meta["name"],
            namespace=meta["namespace"],
            spec=parsed,
            kube=memo.kube,
            controller=ControllerClient(controller_url(), memo.session),
            make_admin=_admin_factory(memo),
        )
    except ApiError as exc:
        if not exc.retriable:
            kopf.warn(body, reason="TopicDeleteRejected", message=str(exc))
            return
        raise kopf.TemporaryError(f"cannot delete the topic yet: {exc}", delay=15) from exc
    kopf.info(body, reason="TopicDeleted", message=f"deleted from {', '.join(groups) or 'no group'}")
