"""YAML <-> specs, strictly: an unknown key, a missing key, a wrong type or a number out of
range is an error that names the file, the key and what was expected.

Every number in autoparallel's YAML is a count, a size, a rate, a latency or a fraction, so
numbers are finite and >= 0 and integers at most ``MAX_COUNT``; each spec's ``__post_init__``
narrows its own fields further (fractions <= 1, top-k <= experts, ...).

Presets live under ``autoparallel/search_spaces/`` (models/, hardware/, spaces/), one YAML file
each, shipped as package data (the checkout's top-level ``search_spaces`` points there), and under
the user's own folder (``resources.user_dir()``); a preset is found by its file name or by one of
its ``aliases``. Anything given as a path is
read as-is, so users can describe their own model or cluster without touching the package.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import os
import stat
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

import yaml

from autoparallel import resources, safefile
from autoparallel.argtypes import MAX_COUNT
from autoparallel.errors import SpecError, UserError
from autoparallel.specs.hardware import (HardwareSpec, clock_limited_speed, measured_attention_efficiency,
                                         measured_bf16_speed, measured_hbm_speed, measured_size_speed, measured_speed)
from autoparallel.specs.model import ModelSpec

T = TypeVar("T")

SEARCH_SPACES = resources.SEARCH_SPACES


def read_yaml(path: Path) -> dict:
    """A YAML file that must hold a mapping; any other content is a one-line SpecError.

    Parsed mappings are kept per file while its stat (size, mtime, ctime, inode) is unchanged:
    ``validate`` resolves presets hundreds of times, and each lookup reads every preset's aliases
    (PyYAML's pure-Python parser made that most of its run time). A file edited in between is read
    again; each caller gets its own copy, so changing it cannot change the next caller's.
    """
    try:
        info = os.stat(path)
    except OSError:
        info = None  # read_bytes says what is wrong with it
    if info is None or not stat.S_ISREG(info.st_mode):
        return _parse_yaml(path)
    key = os.path.abspath(path)
    version = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    cached = _YAML_CACHE.get(key)
    if cached is None or cached[0] != version:
        cached = _YAML_CACHE[key] = (version, _parse_yaml(path))
    return copy.deepcopy(cached[1])


_YAML_CACHE: dict[str, tuple[tuple[int, ...], dict]] = {}


def read_flag_yaml(flag: str, path: str | Path) -> dict:
    """``read_yaml`` of the file a flag names (``--plan``, ``--settings``), each of its errors led by
    the flag: "cannot read x.yaml: No such file or directory" did not say which of the command's
    files x.yaml was."""
    try:
        return read_yaml(Path(path))
    except SpecError as exc:
        raise SpecError(f"{flag}: {exc}") from None
    except UserError as exc:
        raise UserError(f"{flag}: {exc}") from None


def _parse_yaml(path: Path) -> dict:
    raw = safefile.read_bytes(path, "YAML file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not a YAML text file (byte {raw[exc.start]:#04x} at offset {exc.start} "
                        "is not UTF-8)") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {_yaml_problem(exc)}") from None
    except RecursionError:
        raise SpecError(f"{path}: not valid YAML: nested too deeply") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of keys to values, got {_yaml_kind(data)}")
    return data


def _yaml_kind(data) -> str:
    """What a YAML document that is not a mapping holds, in a user's words ("NoneType" was said of
    an empty file)."""
    if data is None:
        return "an empty file"
    return {list: "a list", str: "a plain string", bool: "true / false", int: "a number",
            float: "a number"}.get(type(data), f"a {type(data).__name__}")


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's multi-line message as one line: the problem and where."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return where + " ".join(str(problem).split())


def _type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if get_origin(tp) is tuple:
        return "list"
    if get_origin(tp) is dict:
        return "mapping"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check ``value`` against the annotation ``tp``; return it in the dataclass's type."""
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        errors = []
        for option in get_args(tp):
            try:
                return _coerce(value, option, where)
            except SpecError as exc:
                errors.append((option, exc))
        for option, exc in errors:  # a number out of range: say the range, not just the types
            if option in (int, float) and _is_number(value):
                raise exc
        raise SpecError(f"{where}: expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        if value in get_args(tp):
            return value
        raise SpecError(f"{where}: expected one of {_type_name(tp)}, got {value!r}")
    if origin is dict:
        if not isinstance(value, dict):
            raise SpecError(f"{where}: expected a mapping, got {value!r}")
        key_type, value_type = get_args(tp)
        return {_coerce(str(k), key_type, f"{where}[{k!r}]"): _coerce(v, value_type, f"{where}[{k!r}]")
                for k, v in value.items()}
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise SpecError(f"{where}: expected a list, got {value!r}")
        item = get_args(tp)[0]
        return tuple(_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    if tp is type(None):
        if value is None:
            return None
        raise SpecError(f"{where}: expected null, got {value!r}")
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if not 0 <= value <= MAX_COUNT:
                raise SpecError(f"{where}: expected an integer in 0..{MAX_COUNT}, got {value!r}")
            return value
    elif tp is float:
        if _is_number(value):
            number = float(value) if abs(value) < 1e308 else math.inf
            if not (math.isfinite(number) and number >= 0):
                raise SpecError(f"{where}: expected a finite number >= 0, got {value!r}")
            return number
    elif tp is str:
        if isinstance(value, str):
            return value
    elif dataclasses.is_dataclass(tp):
        if isinstance(value, dict):
            return from_dict(tp, value, where)
    raise SpecError(f"{where}: expected {_type_name(tp)}, got {value!r}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def from_dict(cls: type[T], data: dict, source: str) -> T:
    """Build dataclass ``cls`` from ``data``, naming ``source`` and the key in every error."""
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(key, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else f"; valid keys: {', '.join(known)}"
        raise SpecError(f"{source}: unknown key {key!r}{hint}")
    kwargs = {}
    for name, f in known.items():
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise SpecError(f"{source}: missing required key {name!r} ({_type_name(hints[name])})")
            continue
        value = data[name]
        if name in getattr(cls, "POSITIVE_KEYS", ()) and _is_number(value) and isinstance(value, int) \
                and not 1 <= value <= MAX_COUNT:  # 0 is refused too: quote the range really taken
            raise SpecError(f"{source}: key {name!r}: expected an integer in 1..{MAX_COUNT}, got {value!r}")
        kwargs[name] = _coerce(value, hints[name], f"{source}: key {name!r}")
    try:
        return cls(**kwargs)
    except ValueError as exc:
        raise SpecError(f"{source}: {exc}") from None


def to_dict(obj: Any) -> dict:
    """A dataclass as plain YAML-ready data (tuples as lists)."""
    def plain(v: Any) -> Any:
        if isinstance(v, tuple):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v
    return plain(dataclasses.asdict(obj))


# --- presets ---------------------------------------------------------------------------------

def preset_files(kind: str, shipped_only: bool = False) -> dict[str, Path]:
    """``{preset name: file}`` for one folder of search_spaces/ (models, hardware, spaces).

    The user's own presets (``resources.user_dir()``, written by ``calibrate --as``) come after
    the shipped ones, so a user preset of the same name takes its place (``shipped_only``: the
    package's own files alone).
    """
    files = {}
    for folder in (SEARCH_SPACES / kind, *(() if shipped_only else (resources.user_dir() / kind,))):
        files.update({p.stem: p for p in sorted(folder.glob("*.yaml"))})
    return files


def preset_aliases(kind: str, shipped_only: bool = False) -> dict[str, str]:
    """Lower-cased names and aliases -> preset name. A preset file that cannot be read adds only
    its own name: one broken file must not break every other preset (it is reported when named)."""
    names = {}
    for name, path in preset_files(kind, shipped_only).items():
        names[name.lower()] = name
        try:
            aliases = read_yaml(path).get("aliases") or []
        except UserError:
            continue
        for alias in aliases if isinstance(aliases, list) else []:
            names[str(alias).lower()] = name
    return names


def check_kind(data, where: str, cls: type, others: dict[str, type], expected: str) -> None:
    """A preset file of another kind (``--model`` naming a hardware YAML, ``infer --space training``)
    is named as such, rather than by the first of its keys ``cls`` does not know."""
    if not isinstance(data, dict):
        return  # from_dict says what is wrong with it
    unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
    for label, other in others.items() if unknown else ():
        if unknown <= {f.name for f in dataclasses.fields(other)}:
            raise UserError(f"{where} is {label} (it sets {sorted(unknown)[0]}); {expected}")


def _other_kinds(*labels: str) -> dict[str, type]:
    from autoparallel.serve.space import InferenceSpace
    from autoparallel.space import SearchSpace
    kinds = {"a model preset": ModelSpec, "a hardware preset": HardwareSpec,
             "a search space of `search`": SearchSpace, "a search space of `infer`": InferenceSpace}
    return {label: kinds[label] for label in labels}


SPACE_KINDS = {"search": ("a search space of `infer`", "training, cpu-profiling"),
               "infer": ("a search space of `search`", "inference")}


def check_space_kind(data, name_or_path: str, cls: type, command: str) -> None:
    other, valid = SPACE_KINDS[command]
    check_kind(data, f"--space {name_or_path}", cls, _other_kinds(other, "a model preset", "a hardware preset"),
               f"{command}'s spaces: {valid}, or a YAML of their keys")


def did_you_mean(name: str, valid) -> str:
    """" did you mean 'vllm'?" for a name close to one of ``valid`` (as a misspelt model is told), else "".
    Closer than a preset's 0.5: among a few short names that drew 'sharegpt' for 'chat'."""
    close = difflib.get_close_matches(name.lower(), list(valid), n=1, cutoff=0.75)
    return f" did you mean {close[0]!r}?" if close else ""


def resolve_preset(kind: str, name_or_path: str) -> Path:
    """The YAML file for a preset name, alias or path; a UserError listing valid names if none."""
    candidate = Path(name_or_path)
    singular = {"models": "model", "hardware": "hardware", "spaces": "search space"}[kind]
    path = candidate.suffix in (".yaml", ".yml") or os.sep in name_or_path
    if path and os.path.lexists(candidate):  # a link loop exists, and says so when read
        return candidate
    names = preset_aliases(kind)
    if path:  # it said only "models file 'x.yaml' does not exist": now what would do, as for a name
        wrong, key = f"{singular} file {name_or_path!r} does not exist", candidate.stem.lower()
    else:
        wrong, key = f"unknown {singular} {name_or_path!r}", name_or_path.lower()
        if key in names:
            return preset_files(kind)[names[key]]
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.5)
    hint = f" Did you mean {names[close[0]]!r}?" if close else ""
    # A GPU given as the model (or a model as the GPU) drew a look-alike: --model vr200, "Did you mean gpt3-20b?"
    other = {"models": ("hardware", "a hardware preset: --gpu"), "hardware": ("models", "a model preset: --model")}
    if kind in other and key in preset_aliases(other[kind][0]):
        hint = f" It is {other[kind][1]} {name_or_path}."
    raise UserError(f"{wrong}.{hint} Valid: {', '.join(preset_files(kind))} (or a path to a YAML file)")


def _beside(path: Path, name_or_path: str) -> str:
    """A preset name as it is; a relative YAML path relative to the file that names it."""
    candidate = Path(name_or_path)
    if (candidate.suffix in (".yaml", ".yml") or os.sep in name_or_path) and not candidate.is_absolute():
        return str(path.parent / candidate)
    return name_or_path


def load_model(name_or_path: str) -> ModelSpec:
    path = resolve_preset("models", name_or_path)
    data = read_yaml(path)
    check_kind(data, f"--model {name_or_path}", ModelSpec,
               _other_kinds("a hardware preset", "a search space of `search`", "a search space of `infer`"),
               "give a model preset (`autoparallel models`) or a model YAML")
    return from_dict(ModelSpec, data, str(path))


# Efficiency constants an older `autoparallel calibrate --moe` wrote that the cost model no longer
# has (2026-11-27: the local experts are priced per TransformerEngine call, costmodel/layer_time.py
# moe_expert_calls): a preset that states them still loads, without them, and says so.
RETIRED_EFFICIENCY_KEYS = ("grouped_gemm_max", "grouped_gemm_half_gflop", "moe_expert_overhead_s")


def _drop_retired(data: dict, path: Path) -> dict:
    efficiency = data.get("efficiency")
    retired = [k for k in RETIRED_EFFICIENCY_KEYS if isinstance(efficiency, dict) and k in efficiency]
    if not retired:
        return data
    print(f"autoparallel: warning: {path}: {', '.join(retired)} no longer priced (ignored); refit the MoE "
          "constants with `autoparallel calibrate --moe`", file=sys.stderr)
    return {**data, "efficiency": {k: v for k, v in efficiency.items() if k not in retired}}


# A hardware preset's measured figures (read beside its ``measured_against`` preset's) and the field each
# derives, which a YAML never states: ``specs.hardware.measured_bf16_speed``, ``measured_size_speed``,
# ``measured_hbm_speed``.
MEASURED_FIELDS = {"bf16_clock_speed": "measured_bf16_gemm_tflops",
                   "hbm_speed": "measured_hbm_tbps",
                   "fp8_gemm_size_speed": "measured_fp8_gemm_shapes"}


def load_hardware(name_or_path: str, _chain: tuple[Path, ...] = ()) -> HardwareSpec:
    path = resolve_preset("hardware", name_or_path)
    real = Path(os.path.realpath(path))  # not Path.resolve(): a symlink loop is a RuntimeError there
    if real in _chain:
        names = " -> ".join(p.stem for p in (*_chain, real))
        raise SpecError(f"{_chain[-1]}: efficiency_from makes a cycle ({names}); name a preset with "
                        "its own efficiency block")
    data = _drop_retired(read_yaml(path), path)
    if not _chain:
        check_kind(data, f"--gpu {name_or_path}", HardwareSpec,
                   _other_kinds("a model preset", "a search space of `search`", "a search space of `infer`"),
                   "give a hardware preset (`autoparallel hardware`) or a hardware YAML")
    if "attention_efficiency" in data:
        raise SpecError(f"{path}: attention_efficiency is derived; state measured_attention_ms")
    if "clock_speed" in data:
        raise SpecError(f"{path}: clock_speed is derived from max_sm_clock_mhz, sm_count and the efficiency_from "
                        "donor's; state max_sm_clock_mhz (MHz) instead")
    for derived, measured in MEASURED_FIELDS.items():
        if derived in data:
            raise SpecError(f"{path}: {derived} is derived; state {measured} and measured_against")
        if data.get(measured) is not None and not data.get("measured_against"):
            raise SpecError(f"{path}: {measured} needs measured_against (the preset measured beside it)")
    hw = from_dict(HardwareSpec, data, str(path))
    if hw.efficiency_from:
        if "efficiency" in data:
            raise SpecError(f"{path}: give either efficiency or efficiency_from, not both")
        donor = load_hardware(_beside(path, hw.efficiency_from), (*_chain, real))
        hw = dataclasses.replace(hw, efficiency=donor.efficiency, clock_speed=clock_limited_speed(hw, donor),
                                 attention_efficiency=donor.attention_efficiency,
                                 calibrated_on=f"inherited from {donor.name}: {donor.calibrated_on}")
    if hw.measured_against:
        reference = load_hardware(_beside(path, hw.measured_against), (*_chain, real))
        # A sibling on the same donor's constants, or the donor itself (its speed 1: the constants
        # fitted on it hold its own sustained rate), as the MI300X is read against the H100.
        if not hw.efficiency_from or (reference.efficiency_from != hw.efficiency_from
                                      and reference.name != donor.name):
            raise SpecError(f"{path}: measured_against {reference.name} must be the efficiency_from donor "
                            f"({hw.efficiency_from or 'none stated'}) or take its constants from it")
        try:
            hw = dataclasses.replace(hw, clock_speed=measured_speed(hw, reference),
                                     fp8_gemm_size_speed=(measured_size_speed(hw, reference)
                                                          if hw.measured_fp8_gemm_shapes
                                                          else reference.fp8_gemm_size_speed))
            if hw.measured_bf16_gemm_tflops is not None:
                hw = dataclasses.replace(hw, bf16_clock_speed=measured_bf16_speed(hw, reference))
            if hw.measured_hbm_tbps is not None:
                hw = dataclasses.replace(hw, hbm_speed=measured_hbm_speed(hw, reference))
        except ValueError as e:
            raise SpecError(f"{path}: {e}") from None
    if hw.measured_attention_ms:  # this GPU's own measurement, not the donor's
        try:
            hw = dataclasses.replace(hw, attention_efficiency=measured_attention_efficiency(hw))
        except ValueError as e:
            raise SpecError(f"{path}: {e}") from None
    return hw
