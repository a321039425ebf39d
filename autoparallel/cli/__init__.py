"""The ``autoparallel`` command: one module per subcommand, each owning its arguments.

Every user mistake surfaces as a ``UserError`` (or an argparse error): one line on stderr, exit
code 2, no traceback and no usage dump. Modules import the library lazily, inside the command
that needs it, so ``autoparallel --help`` and the cost-model commands never import torch.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import textwrap
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from autoparallel import __version__
from autoparallel.cli import (calibrate, combos, estimate, export, fp8_check, infer, presets, report, runs, search,
                              validate)
from autoparallel.errors import UserError

PROG = "autoparallel"


class Formatter(argparse.HelpFormatter):
    """Help that reads at the terminal's width. argparse cannot wrap one word, and a choice list
    (``{bf16,fp16,...}``) or a ``--x | --no-x`` pair is one: a usage with such a line too wide
    becomes the command's positionals and required options and ``[options]`` (all of them are
    listed below it), and a ``--x, --no-x`` pair too wide for one line puts ``--no-x`` on the next.
    Lines break between words only, never at a word's hyphen: argparse's textwrap broke
    ``--fp8-dot-product-attention`` into ``--fp8-dot-product-`` / ``attention``, ``tensorrt-llm``
    into ``tensorrt-`` / ``llm``: a flag no longer copied whole from the help."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(self._whitespace_matcher.sub(" ", text).strip(), width, break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return textwrap.fill(self._whitespace_matcher.sub(" ", text).strip(), width, initial_indent=indent,
                             subsequent_indent=indent, break_on_hyphens=False)

    def _format_usage(self, usage, actions, groups, prefix) -> str:
        text = super()._format_usage(usage, actions, groups, prefix)
        if usage is not None or max(map(len, text.splitlines())) <= self._width:
            return text
        needed = [a for a in actions if a.required or not a.option_strings]
        words = self._format_actions_usage(needed, []).split()
        return super()._format_usage(" ".join([self._prog, *words, "[options]"]), actions, groups, prefix)

    def add_argument(self, action) -> None:
        """As argparse, but a subcommand's name is measured at the indent it is printed at: argparse
        measures it one indent short, so the longest names (calibrate, fp8-check) went on a line of
        their own above their help."""
        super().add_argument(action)
        if action.help is not argparse.SUPPRESS and isinstance(action, argparse._SubParsersAction):
            names = [self._format_action_invocation(a) for a in action._get_subactions()]
            self._action_max_length = max(self._action_max_length, max(map(len, names), default=0)
                                          + self._current_indent + self._indent_increment)

    def _format_action_invocation(self, action) -> str:
        text = super()._format_action_invocation(action)
        if self._current_indent + len(text) <= self._width or ", " not in text:
            return text
        return (",\n" + " " * self._current_indent).join(text.split(", "))


class Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line (exit 2) instead of the usage text.

    A flag is taken only as spelled whole (``allow_abbrev`` off, for every subcommand too: argparse
    makes each with this class): argparse's prefix matching took ``--max-ttft 100`` as
    ``--max-ttft-ms`` without a word, and a prefix that stops matching one flag when another is
    added breaks scripts; a prefix now gets the did-you-mean hint (``_close_flags``).

    A value that starts with '-' and a digit (``--tokens -5T``, ``--gpu-hour-cost -1e3``) or is
    ``-inf``/``-nan`` is a value, so that its type says what is wrong with it; argparse takes
    only ``-5`` and ``-.5`` for numbers and calls the rest a missing argument."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", Formatter)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-(\d|\.\d|inf$|nan$|infinity$)", re.IGNORECASE)

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        self._given = _flags_as_values(list(sys.argv[1:] if args is None else args))  # for error()'s hint
        return super().parse_known_args(self._given, namespace)

    def error(self, message: str) -> None:  # type: ignore[override]
        """``message`` in one line; where a required flag is missing because it was given shortened
        (``runs import LOG --gp h100``: argparse stops at the missing ``--gpu`` before it reports
        words it did not take), the words it did not take and the flag they look like too."""
        if message.startswith("the following arguments are required"):
            unknown = [a for a in getattr(self, "_given", []) if a.startswith("--")
                       and a.split("=")[0] not in self._option_string_actions]
            if unknown:
                message += f"; unrecognized arguments: {' '.join(unknown)}{_close_flags(self, unknown)}"
        command = self.prog.removeprefix(PROG).strip()
        from autoparallel.report.fit import for_stderr
        sys.stderr.write(for_stderr(f"{PROG}: error: {command + ': ' if command else ''}{message} "
                                    f"(see `{self.prog} --help`)") + "\n")
        sys.exit(2)

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        """As argparse, but a word no parser took is reported by the command it was given to
        (`models --all`: see `autoparallel models --help`), not by the top-level parser."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            parser = self._command_parser(parsed)
            parser.error(f"unrecognized arguments: {' '.join(extras)}{_close_flags(parser, extras)}")
        return parsed

    def _command_parser(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        """The innermost (sub)command parser that ``parsed`` went through."""
        parser: argparse.ArgumentParser = self
        while True:
            sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
            name = getattr(parsed, sub.dest, None) if sub else None
            if name not in (sub.choices if sub else {}):
                return parser
            parser = sub.choices[name]


# Options whose value is itself flags: argparse took `--sbatch-args '--exclusive'` (the help's own
# example) for two options and said "expected one argument"; only `--sbatch-args=--exclusive` worked.
FLAG_VALUED = ("--sbatch-args",)


def _flags_as_values(argv: list[str]) -> list[str]:
    """``argv`` with each ``FLAG_VALUED`` option joined to the word after it (``--opt=value``)."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] in FLAG_VALUED and i + 1 < len(argv):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


# Flags as Megatron-LM (what `export --format megatron` writes) and the serving engines (best.yaml's
# commands: vLLM, TensorRT-LLM, SGLang) spell them, typed back to the knob they set here:
# `--micro-batch-size` looked most like `--global-batch-size` to difflib, `--tensor-model-parallel-size`
# like nothing.
OTHER_SPELLINGS = {
    "--tensor-model-parallel-size": "--tp", "--pipeline-model-parallel-size": "--pp",
    "--num-virtual-stages-per-pipeline-rank": "--vp", "--virtual-pipeline-model-parallel-size": "--vp",
    "--context-parallel-size": "--cp", "--expert-model-parallel-size": "--ep",
    "--expert-tensor-parallel-size": "--etp", "--micro-batch-size": "--mbs", "--sequence-parallel": "--sp",
    "--use-distributed-optimizer": "--distributed-optimizer",
    "--tensor-parallel-size": "--tp", "--pipeline-parallel-size": "--pp", "--tp_size": "--tp", "--pp_size": "--pp",
    "--tp-size": "--tp", "--pp-size": "--pp", "--max-num-seqs": "--max-batch", "--max_batch_size": "--max-batch",
    "--max-running-requests": "--max-batch", "--max-num-batched-tokens": "--max-num-tokens",
    "--max_num_tokens": "--max-num-tokens", "--chunked-prefill-size": "--max-num-tokens",
    "--kv-cache-dtype": "--kv-precision",
}


def _close_flags(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """"; did you mean --kv-precision or --weight-precision?" for a flag the command does not take
    but has one like (`infer --precision fp8` named no flag infer takes), or sets under another name
    (``OTHER_SPELLINGS``), else ""."""
    import difflib
    flags = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]
    close = []
    for extra in (e.split("=")[0] for e in extras if e.startswith("--")):
        ours = OTHER_SPELLINGS.get(extra)
        close += [ours] if ours in flags else difflib.get_close_matches(extra, flags, n=2, cutoff=0.75)
    return f"; did you mean {' or '.join(dict.fromkeys(close))}?" if close else ""


def build_parser() -> argparse.ArgumentParser:
    from autoparallel.profiling import commands as profiling_commands  # no torch import here

    p = Parser(prog=PROG, description="Find the fastest parallel layout for LLM training and serving.")
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in (search, estimate, export, infer, report, validate, runs, calibrate, fp8_check, presets):
        command.add_parser(sub)
    profiling_commands.add_profile_parser(sub)
    _describe(p)
    return p


def _describe(parser: argparse.ArgumentParser) -> None:
    """Each subcommand's --help opens with its line of the command list: argparse prints a
    description only where one is given, and none was, so `calibrate --help` never said what it does."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                command = action.choices[choice.dest]
                if command.description is None and choice.help:
                    command.description = choice.help[:1].upper() + choice.help[1:] + "."
                _describe(command)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with _sigterm_interrupts() as received:
        try:
            combos.check_empty(sys.argv[1:] if argv is None else argv, args)
            combos.check_json(args)
            args.func(args)
        except UserError as exc:
            from autoparallel.report.fit import for_stderr
            print(for_stderr(f"{PROG}: error: {' '.join(str(exc).split())}"), file=sys.stderr)  # one line in a pipe
            return 2
        except KeyboardInterrupt as exc:  # what the run kept, if anything, is in the message
            print(f"{PROG}: interrupted" + (f": {exc}" if str(exc) else ""), file=sys.stderr)
            return 128 + received.get("signal", signal.SIGINT)
        except BrokenPipeError:  # `... --json | head`: the reader left; end as a SIGPIPE'd tool does
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error again at exit's flush
            return 128 + signal.SIGPIPE
    return 0


@contextmanager
def _sigterm_interrupts() -> Iterator[dict]:
    """SIGTERM raises KeyboardInterrupt like Ctrl-C does, so that a terminated command cleans up
    (staging folders removed, workers stopped) instead of dying where it stands."""
    received: dict = {}
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def interrupt(signum, _frame):
        received["signal"] = signum
        raise KeyboardInterrupt
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, previous)
