"""The FerryMQ Kubernetes operator (kopf): BrokerGroup and Topic custom resources.

``ferrymq operator [kopf run options]`` calls :func:`main`.
"""

from __future__ import annotations

import random

HANDLERS_MODULE = "ferrymq.operator.handlers"


def kopf_args(argv: list[str]) -> list[str]:
    """`kopf run` arguments: our handlers module, plus a random peering priority unless one is given.

    Replicas with equal priorities would all freeze; distinct priorities make the highest
    one active and the others hot standbys (kopf peering).
    """
    args = ["run", "--module", HANDLERS_MODULE]
    if not any(a in ("--dev", "--standalone") or a.startswith(("--priority", "-p")) for a in argv):
        args.append(f"--priority={random.randint(100, 1_000_000)}")
    return [*args, *argv]


def main(argv: list[str]) -> int:
    """Run the operator until it is stopped; returns the exit code."""
    import click
    from kopf import cli

    try:
        cli.main.main(args=kopf_args(argv), prog_name="ferrymq operator", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        return 1
    return 0
