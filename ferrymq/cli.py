"""The ``ferrymq`` command. Each subcommand parses its arguments and hands over to the module that
does the work; commands whose issue has not landed yet say so and exit non-zero."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

# subcommand -> the issue that brings it; removed from here as each lands
NOT_BUILT: dict[str, str] = {}


class CliError(Exception):
    """A one-line error for the user; exit status 1."""


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _run_async(coro: Any) -> None:
    # A server process: what is imported by now lives as long as the process, so the cyclic collector
    # need not traverse it again and again; and the hot paths allocate many short-lived acyclic objects
    # (frames, msgpack lists) that reference counting frees, which would trigger a collection every 700.
    gc.freeze()
    gc.set_threshold(10_000, 20, 20)
    try:
        import uvloop

        uvloop.run(coro)
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(coro)


# ---- standalone ---------------------------------------------------------------------------------------
def cmd_standalone(args: argparse.Namespace) -> int:
    from ferrymq.standalone import build_config, run

    cfg = build_config(args.data_dir, args.host, args.http_port, args.tcp_port, args.flush, args.config)
    _run_async(run(cfg))
    return 0


# ---- broker -------------------------------------------------------------------------------------------
def cmd_broker(args: argparse.Namespace) -> int:
    from ferrymq.broker.main import config_from_args, run

    _run_async(run(config_from_args(args)))
    return 0


# ---- controller ---------------------------------------------------------------------------------------
def cmd_controller(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from ferrymq.common.errors import FerryError
    from ferrymq.controller.config import ControllerConfig
    from ferrymq.controller.main import run

    overrides = {"listen": args.listen, "store": args.store, "advertise_address": args.advertise_address,
                 "controller_broker_heartbeat_timeout": args.heartbeat_timeout_ms,
                 "enable_elect_unclean_master": True if args.enable_elect_unclean_master else None,
                 "scan_interval": args.scan_interval_ms, "switch_timeout": args.switch_timeout_ms,
                 "leader_lease_seconds": args.lease_seconds}
    try:
        if args.config:
            cfg = ControllerConfig.from_file(args.config, **overrides)
        else:
            cfg = ControllerConfig(**{k: v for k, v in overrides.items() if v is not None})
        _run_async(run(cfg))
    except ValidationError as exc:
        e = exc.errors()[0]
        raise CliError(f"bad setting {'.'.join(map(str, e['loc']))}: {e['msg']}") from exc
    except (FerryError, ValueError, OSError) as exc:
        raise CliError(str(exc)) from exc
    return 0


# ---- topic admin --------------------------------------------------------------------------------------
def http_call(method: str, url: str, body: Any = None, timeout: float = 30) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            return json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        try:
            err = json.loads(exc.read())["error"]
            raise CliError(f"{err['code']}: {err['message']}") from exc
        except (ValueError, KeyError, TypeError):
            raise CliError(f"HTTP {exc.code} from {url}") from exc
    except urllib.error.URLError as exc:
        raise CliError(f"cannot reach {url}: {exc.reason}") from exc


def cmd_topic(args: argparse.Namespace) -> int:
    """Topic admin through the client's Admin: against a standalone server, a broker, or a controller
    (then every broker group's master, or --group only)."""
    from ferrymq.client.admin import AsyncAdmin
    from ferrymq.client.errors import ClientError

    async def run() -> Any:
        async with AsyncAdmin(args.server) as admin:
            if args.action == "create":
                rq = args.read_queues or 8
                return await admin.create_topic(args.name, read_queues=rq, write_queues=args.write_queues or rq,
                                                perm=args.perm or "RW", message_type=args.message_type or "NORMAL",
                                                group=args.group)
            if args.action == "update":
                return await admin.update_topic(args.name, read_queues=args.read_queues,
                                                write_queues=args.write_queues, perm=args.perm, group=args.group)
            if args.action == "describe":
                return await admin.describe_topic(args.name, group=args.group)
            await admin.delete_topic(args.name, group=args.group)
            return None

    try:
        out = asyncio.run(run())
    except ClientError as exc:
        raise CliError(f"{exc.code}: {exc.message}") from exc
    print(json.dumps(out, indent=2) if out is not None else f"topic {args.name} deleted")
    return 0


# ---- operator -----------------------------------------------------------------------------------------
def cmd_operator(args: argparse.Namespace) -> int:
    try:
        from ferrymq.operator import main as operator_main
    except ImportError as exc:  # kopf and kubernetes come with the `operator` extra
        raise CliError(f"the operator needs the 'operator' extra (pip install 'ferrymq[operator]'): {exc}") from exc
    return operator_main(list(args.kopf_args))


# ---- pipeline -----------------------------------------------------------------------------------------
def cmd_pipeline(args: argparse.Namespace) -> int:
    from ferrymq.pipeline.jobs import JobError, run

    try:
        print(json.dumps(run([args.job, *args.rest])))
    except JobError as exc:
        raise CliError(str(exc)) from exc
    return 0


# ---- dead-letter queues (issue #4) ---------------------------------------------------------------------
def cmd_dlq(args: argparse.Namespace) -> int:
    import urllib.parse

    base = f"{args.server.rstrip('/')}/v1/groups/{urllib.parse.quote(args.group, safe='')}/dlq"
    if args.action == "list":
        out = http_call("GET", f"{base}/messages?offset={args.offset}&maxMessages={args.max}")
        for m in out["messages"]:
            p = m["properties"]
            print(json.dumps({"msgId": m["msgId"], "queueOffset": m["queueOffset"],
                              "originTopic": p.get("RETRY_TOPIC"), "originMsgId": p.get("ORIGIN_MESSAGE_ID"),
                              "reconsumeTimes": m["reconsumeTimes"], "storeTimestamp": m["storeTimestamp"],
                              "tags": m["tags"], "keys": m["keys"], "body": m.get("body", m["bodyBase64"])}))
    else:
        if not args.msg_id:
            raise CliError("resend needs --msg-id (one or more)")
        for msg_id in args.msg_id:
            print(json.dumps(http_call("POST", f"{base}/resend", {"msgId": msg_id})))
    return 0


# ---- produce / consume (the client SDK over TCP) ----------------------------------------------------------
def cmd_produce(args: argparse.Namespace) -> int:
    from ferrymq.client.cli_tools import produce
    from ferrymq.client.errors import ClientError

    try:
        return produce(args.server, args.topic, tags=args.tags, keys=args.keys, count=args.count, body=args.body,
                       batch=args.batch)
    except ClientError as exc:
        raise CliError(f"{exc.code}: {exc.message}") from exc


def cmd_consume(args: argparse.Namespace) -> int:
    from ferrymq.client.cli_tools import consume
    from ferrymq.client.errors import ClientError

    try:
        return consume(args.server, args.topic, group=args.group, from_=args.from_, tags=args.tags,
                       max_messages=args.max_messages, idle_exit_seconds=args.idle_exit_seconds,
                       orderly=args.orderly, broadcast=args.broadcast)
    except ClientError as exc:
        raise CliError(f"{exc.code}: {exc.message}") from exc


# ---- parser -------------------------------------------------------------------------------------------
def _not_built(name: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        raise CliError(f"'ferrymq {name}' is not built yet; it arrives with {NOT_BUILT[name]}")

    return run


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ferrymq", description="FerryMQ: a clustered message broker "
                                "in the lineage of Apache RocketMQ 5 (controller mode).")
    p.add_argument("--log-level", default=os.environ.get("FERRYMQ_LOG_LEVEL", "INFO"))
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        if name in NOT_BUILT:
            help_text = f"{help_text} [not built yet: {NOT_BUILT[name]}]"
        sp = sub.add_parser(name, help=help_text, description=help_text)
        sp.set_defaults(func=_not_built(name) if name in NOT_BUILT else None)
        return sp

    sp = add("standalone", "embedded default: a controller and a one-replica broker group 'standalone'")
    sp.add_argument("--data-dir", default=os.environ.get("FERRYMQ_DATA_DIR", "./ferrymq-data"))
    sp.add_argument("--host", default="127.0.0.1")
    sp.add_argument("--http-port", type=int, default=8080)
    sp.add_argument("--tcp-port", type=int, default=10911)
    sp.add_argument("--flush", choices=["sync", "async"], default="async")
    sp.add_argument("--config", help="YAML/JSON map of broker settings (RocketMQ keys)")
    sp.set_defaults(func=cmd_standalone)

    sp = add("broker", "one broker replica; its role comes from the controller")
    sp.add_argument("--group", required=True)
    sp.add_argument("--data-dir", required=True)
    sp.add_argument("--http-port", type=int, required=True)
    sp.add_argument("--tcp-port", type=int, required=True)
    sp.add_argument("--ha-port", type=int, required=True)
    sp.add_argument("--controller", required=True)
    # No defaults here: unset flags leave the --config file (or the built-in defaults) in force.
    sp.add_argument("--flush", choices=["sync", "async"])
    sp.add_argument("--replication", choices=["sync", "async"])
    sp.add_argument("--in-sync-replicas", type=int)
    sp.add_argument("--min-in-sync-replicas", type=int, default=None)
    sp.add_argument("--config")
    sp.add_argument("--name", help="stable replica name (default $FERRYMQ_NAME or the hostname)")
    sp.add_argument("--host", help="listen address (default $FERRYMQ_LISTEN_HOST or 0.0.0.0)")
    sp.add_argument("--advertise-host", help="address peers and clients dial (default $FERRYMQ_ADVERTISE_HOST)")
    sp.set_defaults(func=cmd_broker)

    sp = add("controller", "the controller: SyncStateSets, epochs, elections, routes")
    sp.add_argument("--listen", required=True, help="HOST:PORT")
    sp.add_argument("--store", required=True, help="file:///path, etcd://h:p[,h:p], kubernetes://ns/name")
    sp.add_argument("--config", help="YAML/JSON map of controller settings (controllerBrokerHeartbeatTimeout, "
                    "enableElectUncleanMaster, switchTimeout, scanInterval, leaderLeaseSeconds, ...)")
    sp.add_argument("--advertise-address", help="URL other controllers redirect to (default http://HOST:PORT)")
    sp.add_argument("--heartbeat-timeout-ms", type=int, help="controllerBrokerHeartbeatTimeout (default 10000)")
    sp.add_argument("--enable-elect-unclean-master", action="store_true",
                    help="when no SyncStateSet member is alive, elect any alive replica (may lose messages)")
    sp.add_argument("--scan-interval-ms", type=int, help="ms between expiry scans (default 500)")
    sp.add_argument("--switch-timeout-ms", type=int, help="ms before a graceful switch is abandoned (default 10000)")
    sp.add_argument("--lease-seconds", type=int, help="leadership lease, etcd/kubernetes (default 10)")
    sp.set_defaults(func=cmd_controller)

    sp = add("operator", "the kopf operator (arguments after it go to `kopf run`, e.g. --namespace=NS)")
    sp.add_argument("kopf_args", nargs=argparse.REMAINDER)
    sp.set_defaults(func=cmd_operator)

    sp = add("topic", "topic admin")
    sp.add_argument("action", choices=["create", "describe", "update", "delete"])
    sp.add_argument("name")
    sp.add_argument("--server", default=os.environ.get("FERRYMQ_SERVER", "http://127.0.0.1:8080"))
    sp.add_argument("--read-queues", type=int)
    sp.add_argument("--write-queues", type=int)
    sp.add_argument("--perm")
    sp.add_argument("--message-type", choices=["NORMAL", "FIFO", "DELAY", "TRANSACTION"])
    sp.add_argument("--group", help="only this broker group (with a controller URL)")
    sp.set_defaults(func=cmd_topic)

    sp = add("produce", "command-line producer")
    sp.add_argument("topic")
    sp.add_argument("--tags")
    sp.add_argument("--keys")
    sp.add_argument("--count", type=int, default=1)
    sp.add_argument("--body", help="message body (UTF-8); default 'message <i>'")
    sp.add_argument("--batch", action="store_true", help="send all --count messages in one batch")
    sp.add_argument("--server", default=os.environ.get("FERRYMQ_SERVER", "http://127.0.0.1:8080"))
    sp.set_defaults(func=cmd_produce)

    sp = add("consume", "command-line consumer")
    sp.add_argument("topic")
    sp.add_argument("--group", required=True)
    sp.add_argument("--from", dest="from_", choices=["earliest", "latest"], default="latest",
                    help="where a group without committed offsets starts")
    sp.add_argument("--tags", default="*", help="tag filter, e.g. 'a||b'")
    sp.add_argument("--max-messages", type=int, help="exit after printing this many messages")
    sp.add_argument("--idle-exit-seconds", type=float, help="exit when nothing arrived for this long")
    sp.add_argument("--orderly", action="store_true")
    sp.add_argument("--broadcast", action="store_true")
    sp.add_argument("--server", default=os.environ.get("FERRYMQ_SERVER", "http://127.0.0.1:8080"))
    sp.set_defaults(func=cmd_consume)

    sp = add("dlq", "dead-letter queues: list a group's dead messages, re-send chosen ones to their topic")
    sp.add_argument("action", choices=["list", "resend"])
    sp.add_argument("--group", required=True)
    sp.add_argument("--msg-id", action="append", help="message id to re-send (repeatable)")
    sp.add_argument("--offset", type=int, default=0, help="list from this DLQ offset")
    sp.add_argument("--max", type=int, default=32, help="list at most this many")
    sp.add_argument("--server", default=os.environ.get("FERRYMQ_SERVER", "http://127.0.0.1:8080"))
    sp.set_defaults(func=cmd_dlq)

    sp = add("pipeline", "Spark jobs: archive a topic to Parquet, replay an archive")
    sp.add_argument("job", choices=["archive", "replay"])
    sp.add_argument("rest", nargs=argparse.REMAINDER, help="the job's options; JOB --help lists them")
    sp.set_defaults(func=cmd_pipeline)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    # Options after `operator` belong to `kopf run`; argparse would reject the ones it does not know.
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        if args.command != "operator":
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        args.kopf_args = [*unknown, *args.kopf_args]
    _setup_logging(args.log_level)
    try:
        return int(args.func(args) or 0)
    except CliError as exc:
        print(f"ferrymq {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (`| head`); nothing left to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
