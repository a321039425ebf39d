"""The ``autoparallel`` command: one module per subcommand, each owning its arguments.

Every user mistake surfaces as a ``UserError`` (or an argparse error): one line on stderr, exit
code 2, no traceback and no usage dump. Modules import the library lazily, inside the command
that needs it, so ``autoparallel --help`` and the cost-model commands never import torch.
"""

from __future__ import annotations

import argparse
import sys

from autoparallel import __version__
from autoparallel.cli import (calibrate, estimate, export, fp8_check, infer, presets, report, runs, search,
                              validate)
from autoparallel.errors import UserError

PROG = "autoparallel"


class Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line (exit 2) instead of the usage text."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{PROG}: error: {self.prog.removeprefix(PROG).strip() or 'usage'}: {message} "
                         f"(see `{self.prog} --help`)\n")
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    from autoparallel.profiling import commands as profiling_commands  # no torch import here

    p = Parser(prog=PROG, description="Find the fastest parallel layout for LLM training and serving.")
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in (search, estimate, export, infer, report, validate, runs, calibrate, fp8_check, presets):
        command.add_parser(sub)
    profiling_commands.add_profile_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except UserError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    return 0
