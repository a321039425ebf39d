"""The configuration a training log prints at start-up, as Megatron-LM argument names.

Megatron-LM prints every argument after validation (``_print_args`` in
``megatron/training/arguments.py``)::

    ------------------------ arguments ------------------------
      accumulate_allreduce_grads_in_fp32 .............. True
      ...
    -------------------- end of arguments ---------------------

one ``'  {} {} {}'.format(name, '.' * (48 - len(name)), value)`` line per argument, sorted, each
value as ``str()`` prints it (``None``, ``True``, ``4``, ``1e-05``, ``['core_attn']``,
``AttnBackend.auto``). Megatron-Bridge prints its ``ConfigContainer`` as YAML between
``------- Task Configuration -------`` and a line of dashes; ``bridge_names.yaml`` says where
each Megatron-LM argument lives in it. Both come out as one dict, so the rest of the reader
knows one set of names.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from typing import Any

import yaml

from autoparallel import io, resources

MEGATRON_LM = "megatron-lm"
MEGATRON_BRIDGE = "megatron-bridge"

_ARGUMENTS_START = re.compile(r"^-+ arguments -+$")
_ARGUMENTS_END = re.compile(r"^-+ end of arguments -+$")
# Names of 48 characters or more get no dots: "  name  value".
_ARGUMENT = re.compile(r"^  (?P<name>\w+) \.* ?(?P<value>.*)$")
_BRIDGE_START = re.compile(r"^-+ Task Configuration -+$")
_DASHES = re.compile(r"^-{10,}$")
BRIDGE_NAMES = resources.PACKAGE / "runlogs" / "bridge_names.yaml"
# megatron/core/transformer/enums.py: class AttnBackend(enum.Enum)
ATTN_BACKENDS = {1: "flash", 2: "fused", 3: "unfused", 4: "local", 5: "auto"}


def parse_value(text: str) -> Any:
    """One printed value back as Python: None, bool, int, float, a list, else the string."""
    text = text.strip()
    if text in ("None", ""):
        return None
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    if text[:1] in "[(":
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError):
            pass
    return text


def megatron_arguments(lines: Sequence[str]) -> dict[str, Any] | None:
    """The last argument block of a Megatron-LM log (a resumed job prints one per start)."""
    starts = [i for i, line in enumerate(lines) if _ARGUMENTS_START.match(line)]
    if not starts:
        return None
    arguments = {}
    for line in lines[starts[-1] + 1:]:
        if _ARGUMENTS_END.match(line):
            break
        match = _ARGUMENT.match(line)
        if match:
            arguments[match["name"]] = parse_value(match["value"])
    return arguments


def bridge_arguments(lines: Sequence[str]) -> dict[str, Any] | None:
    """The Megatron-LM arguments a Megatron-Bridge log's configuration YAML amounts to."""
    starts = [i for i, line in enumerate(lines) if _BRIDGE_START.match(line)]
    if not starts:
        return None
    block = []
    for line in lines[starts[-1] + 1:]:
        if _DASHES.match(line):
            break
        block.append(line)
    try:
        config = yaml.safe_load("\n".join(block))
    except yaml.YAMLError as exc:
        raise ValueError(f"its Task Configuration is not YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(config, dict):
        raise ValueError("its Task Configuration is empty")
    arguments = {}
    for name, paths in io.read_yaml(BRIDGE_NAMES).items():
        for path in paths:
            found, value = _lookup(config, path)
            if found:
                arguments[name] = value
                break
    model = config.get("model") or {}
    activation = str((model.get("activation_func") or {}).get("_target_", ""))
    arguments["swiglu"] = bool(model.get("gated_linear_unit")) and activation.endswith("silu")
    arguments["squared_relu"] = activation.endswith("squared_relu")
    arguments["group_query_attention"] = model.get("num_query_groups") is not None
    arguments["attention_backend"] = _bridge_attention_backend(model.get("attention_backend"))
    if model.get("share_embeddings_and_output_weights") is not None:
        arguments["untie_embeddings_and_output_weights"] = not model["share_embeddings_and_output_weights"]
    return arguments


def _lookup(config: dict, path: str) -> tuple[bool, Any]:
    node: Any = config
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return False, None
        node = node[key]
    return True, node


def _bridge_attention_backend(value: Any) -> str | None:
    """Bridge prints the enum as a constructor call (``_args_: [5]``); Megatron-LM as
    ``AttnBackend.auto``. Either way, the Megatron-LM form."""
    if isinstance(value, dict) and value.get("_args_"):
        value = value["_args_"][0]
    if isinstance(value, int):
        return f"AttnBackend.{ATTN_BACKENDS.get(value, value)}"
    return None if value is None else f"AttnBackend.{str(value).split('.')[-1]}"


def read_arguments(lines: Sequence[str]) -> tuple[str, dict[str, Any]]:
    """(framework, arguments) of a log; ValueError naming what is missing."""
    arguments = megatron_arguments(lines)
    if arguments:
        return MEGATRON_LM, arguments
    arguments = bridge_arguments(lines)
    if arguments:
        return MEGATRON_BRIDGE, arguments
    raise ValueError('no printed configuration: neither Megatron-LM\'s "arguments" block nor '
                     'Megatron-Bridge\'s "Task Configuration"')
