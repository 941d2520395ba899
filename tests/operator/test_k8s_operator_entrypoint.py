"""`ferrymq operator` entry point and kopf wiring (no cluster: kopf is never started)."""

from __future__ import annotations

import kopf

from ferrymq import operator as fmq_operator
from ferrymq.operator import handlers


def test_kopf_args_add_handlers_module_and_a_priority() -> None:
    args = fmq_operator.kopf_args(["--namespace=mq"])
    assert args[:3] == ["run", "--module", "ferrymq.operator.handlers"]
    assert any(a.startswith("--priority=") for a in args) and args[-1] == "--namespace=mq"


def test_kopf_args_keep_an_explicit_priority() -> None:
    args = fmq_operator.kopf_args(["--priority=5", "-A"])
    assert [a for a in args if a.startswith("--priority")] == ["--priority=5"]
    assert not any(a.startswith("--priority=") for a in fmq_operator.kopf_args(["--dev"]))


def test_main_help_exits_zero(capsys: object) -> None:
    assert fmq_operator.main(["--help"]) == 0


def test_main_bad_option_is_an_error() -> None:
    assert fmq_operator.main(["--no-such-option"]) != 0


def test_handlers_are_registered_for_both_resources() -> None:
    registry = kopf.get_default_registry()
    ids = {h.id for h in registry._changing.get_all_handlers()}
    assert {"broker_group_changed", "topic_changed", "topic_deleted"} <= ids
    timers = {h.id for h in registry._spawning.get_all_handlers()}
    assert {"broker_group_tick", "topic_tick"} <= timers
    assert handlers.BG == ("ferrymq.io", "v1alpha1", "brokergroups")


def test_ferrymq_operator_command_hands_its_arguments_to_kopf(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import ferrymq.operator
    from ferrymq import cli

    seen: list[list[str]] = []
    monkeypatch.setattr(ferrymq.operator, "main", lambda argv: seen.append(argv) or 0)
    assert cli.main(["operator", "--namespace=ferrymq", "--peering=ferrymq"]) == 0
    assert sorted(seen[0]) == ["--namespace=ferrymq", "--peering=ferrymq"]
