"""`stepwatch` command line: one subcommand per module in app/commands/.

Each command module exposes HELP (one line), add_arguments(parser) and run(args) -> exit code, and
imports its heavy dependencies inside run() so that `stepwatch --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from . import __version__

COMMANDS: dict[str, str] = {
    "serve": "stepwatch.commands.serve",
    "check-config": "stepwatch.commands.check_config",
    "score": "stepwatch.commands.score",
    "schema": "stepwatch.commands.schema",
    "healthcheck": "stepwatch.commands.healthcheck",
}


class UsageError(Exception):
    """Bad input named in one line; the CLI prints it and exits 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stepwatch",
        description="OpenTelemetry collector-side streaming evaluator for AI agents.",
    )
    parser.add_argument("--version", action="version", version=f"stepwatch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        command = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(command)
        command.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._run(args))
    except UsageError as exc:
        print(f"stepwatch {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `stepwatch score ... | head`: the reader left; say nothing more and exit like other CLIs.
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
