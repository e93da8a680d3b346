"""`contextlog --help` and every subcommand's: each argument says what it is for."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from contextlog.worker.cli import main as cli


def arguments(
    parser: argparse.ArgumentParser, path: str = "contextlog"
) -> Iterator[tuple[str, argparse.Action]]:
    """(command, argument) for every argument of every (sub)command, help flags aside."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield path, argparse.Action([], name, help=helps.get(name))
                yield from arguments(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction):
            yield path, action


def test_every_subcommand_and_argument_has_help() -> None:
    assert len(list(arguments(cli.parser()))) > 80  # the walk reaches every subcommand
    missing = [
        f"{command}: {'/'.join(action.option_strings) or action.dest}"
        for command, action in arguments(cli.parser())
        if not (action.help or "").strip()
    ]
    assert missing == []
