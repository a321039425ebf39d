"""Pipeline stages as Megatron-LM builds and schedules them.

**Which layers a stage holds** (``megatron/core/transformer/transformer_block.py``,
``get_num_layers_to_build``): an even split gives every stage L/pp layers in vp chunks. When L
is not divisible by pp*vp Megatron offers two uneven splits:

- explicit first / last stage sizes (``--decoder-first-pipeline-num-layers``,
  ``--decoder-last-pipeline-num-layers``): the middle stages share the rest evenly; every stage's
  count must be divisible by vp;
- ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split``: the
  embedding (the loss) takes the place of one layer in the first (last) virtual stage, so
  L + 1 or L + 2 "slots" are split evenly and the first (last) stage holds one layer fewer.

Where neither fits (DeepSeek-V3's 61 layers on 16 or 32 virtual stages), Megatron-LM's flexible
``--pipeline-model-parallel-layout`` lists each virtual stage's layers, as Megatron-Bridge's
DeepSeek-V3 recipes do ("Et|(tt|)*30mL"); the split offered is the balanced one: the L + 2 slots
(the embedding and the loss count as one layer each) as even as they go, fuller stages first.
The search offers it to MoE models only (``space``), where NVIDIA's published layouts need it;
for dense models it would add every vp to the search without a published layout that uses it.

**The schedule** (``megatron/core/pipeline_parallel/schedules.py``): 1F1B, interleaved when
vp > 1. Stage i warms up with ``pp - i - 1`` micro-batches (1F1B) or ``2(pp - i - 1) +
(vp - 1)pp`` chunk-micro-batches (interleaved) before its first backward, so at its peak it holds
the activations of one more than that, capped by what the step has (m micro-batches, m*vp
chunk-micro-batches). The first stage therefore holds about pp micro-batches of all its layers
(×(1 + (pp-1)/(pp*vp)) interleaved, Korthikanti et al. §4.2.3); the last stage (vp-1)*pp + 1
chunks, one micro-batch when not interleaved. Which chunks those are matters where a rank's chunks
hold different layers (the embedding or the loss counted in the split, a flexible layout, dense and
MoE layers): the memory step prices the states the schedule really holds, chunk by chunk
(``held_at_peak``), not that count of the rank's average chunk.

A step of m micro-batches whose stages take T_i each (forward + backward of one micro-batch)
runs for about m * max(T_i) at the bottleneck plus the fill and drain of the others,
(sum(T_i) - max(T_i)) / vp: with equal stages the familiar bubble (pp-1)/vp of a stage time.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

#: One uneven split: (first stage layers, last stage layers, embedding counted, loss counted,
#: flexible layout); (0, 0, False, False, "") is the even split.
Split = tuple[int, int, bool, bool, str]
EVEN: Split = (0, 0, False, False, "")


def splits(num_layers: int, pp: int, vp: int, uneven: bool = True, layouts: bool = False,
           mtp: int = 0) -> list[Split]:
    """Every way Megatron-LM accepts to put ``num_layers`` layers on ``pp`` stages of ``vp``
    chunks: the even split when it exists, else (``uneven``) the accounted and explicit splits,
    and where none of them fits (and ``layouts``) the balanced flexible layout (with ``mtp``
    multi-token-prediction layers before the loss).

    Explicit first/last sizes are taken lighter than the middle stages (the first stage holds
    the most activations, the last one the logits): the middle share is the smallest multiple
    of vp not below L/pp, or one vp more. Where none of these fits, the balanced flexible layout.
    """
    if pp == 1:
        return [EVEN] if vp == 1 else []
    chunks = pp * vp
    if num_layers % chunks == 0:
        return [EVEN]
    if not uneven:
        return []
    out: list[Split] = []
    for embedding, loss in ((True, True), (False, True), (True, False)):
        slots = num_layers + embedding + loss
        if slots % chunks == 0 and slots // chunks >= 2:  # every chunk keeps a decoder layer
            out.append((0, 0, embedding, loss, ""))
    if num_layers % vp == 0:
        share = math.ceil(num_layers / pp / vp) * vp
        for middle in (share, share + vp):
            edges = num_layers - (pp - 2) * middle
            first = math.ceil(edges / 2 / vp) * vp
            last = edges - first
            if last >= vp and (first, last, False, False, "") not in out:
                out.append((first, last, False, False, ""))
    if layouts and not out and num_layers + 2 + mtp >= chunks:  # every middle stage keeps a decoder layer
        out.append((0, 0, False, False, rank_balanced_layout(num_layers, pp, vp, mtp)))
    return out


def split_error(num_layers: int, pp: int, vp: int, split: Split) -> str:
    """'' if Megatron-LM accepts this pinned split of ``num_layers`` on ``pp`` stages of ``vp``
    chunks, else why not (TransformerConfig.__post_init__ and validate_args, Megatron-Core 0.15).
    A pinned accounted split may leave the embedding or the loss alone in its chunk, as Megatron
    allows (``get_num_layers_to_build`` asserts only >= 0 layers) and NVIDIA runs Llama 3.1 405B
    on PP16 VP8 (126 + 2 = 128 chunks); ``splits`` offers only splits with a decoder layer in
    every chunk."""
    first, last, embedding, loss, _ = split
    chunks = pp * vp
    explicit, accounted = first > 0 or last > 0, embedding or loss
    if pp == 1 and (explicit or accounted):
        return "an uneven pipeline split needs pp > 1"
    if explicit and accounted:
        return ("num_layers_in_first_pipeline_stage and num_layers_in_last_pipeline_stage cannot be set at the "
                "same time with account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split")
    if explicit:
        for name, n in (("first", first), ("last", last)):
            if n and vp > 1 and n % vp:
                return f"number of layers at {name} stage: {n} must be divisible by virtual pipeline parallel degree {vp}"
        rest, middle = num_layers - first - last, pp - (first > 0) - (last > 0)
        if middle == 0:
            return "" if rest == 0 else f"first + last stage layers ({first} + {last}) must be the {num_layers} layers"
        if rest <= 0 or rest % middle or (rest // middle) % vp:
            return (f"number of layers at middle stage: {rest} must be divisible by the middle pipeline model "
                    f"parallel size {middle}" + (f" and each middle rank's by vp {vp}" if vp > 1 else ""))
        return ""
    slots = num_layers + embedding + loss
    if slots % chunks:
        return f"{num_layers} layers{' + embedding' if embedding else ''}{' + loss' if loss else ''} not divisible by pp*vp={chunks}"
    return ""


def balanced_layout(num_layers: int, stages: int, mtp: int = 0) -> str:
    """Megatron-LM's ``--pipeline-model-parallel-layout`` spreading L layers over ``stages``
    virtual stages with the embedding, each MTP layer and the loss counted as one layer each,
    the fuller stages first: "Et*3|(t*4|)*14t*2L" for 61 layers on 16, "Et|(t*2|)*30mL" for 61
    and one MTP layer on 32 (NVIDIA's DeepSeek-V3 recipe)."""
    return _render(_balanced_decoders(num_layers, stages, mtp), mtp)


def _balanced_decoders(num_layers: int, stages: int, mtp: int) -> list[int]:
    """Decoder layers of each virtual stage of ``balanced_layout``."""
    if stages == 1:
        return [num_layers]
    # The last stage takes an even share of the slots, its head first (no decoder layer if the
    # head fills it); the other stages share the rest, fuller first, the first one holding E.
    last = max((num_layers + 2 + mtp) // stages - 1 - mtp, 0)
    rest = num_layers - last + 1
    slots = [rest // (stages - 1) + (i < rest % (stages - 1)) for i in range(stages - 1)]
    return [n - (i == 0) for i, n in enumerate(slots)] + [last]


def _render(decoders: list[int], mtp: int) -> str:
    head = "m" * mtp + "L"
    if len(decoders) == 1:
        return f"E{_layers(decoders[0])}{head}"
    middle = "".join(_repeat(group) for group in _runs(decoders[1:-1]))
    return f"E{_layers(decoders[0])}|{middle}{_layers(decoders[-1])}{head}"


def rank_balanced_layout(num_layers: int, pp: int, vp: int, mtp: int = 0) -> str:
    """Of ``balanced_layout`` and ``head_light_layout``, the one whose busiest pipeline rank has
    less work, the output layer and loss counted as one layer's work and each MTP module as two
    (its layer and its pass through the output layer and loss); on a tie the balanced one."""
    balanced = balanced_layout(num_layers, pp * vp, mtp)
    lighter = head_light_layout(num_layers, pp, vp, mtp)
    if lighter and _busiest_rank_work(lighter, pp, mtp) < _busiest_rank_work(balanced, pp, mtp):
        return lighter
    return balanced


def _busiest_rank_work(layout: str, pp: int, mtp: int) -> int:
    sizes = layout_stage_sizes(layout)
    work = [sum(sizes[r::pp]) for r in range(pp)]
    work[(len(sizes) - 1) % pp] += 2 * mtp + 1
    return max(work)


def head_light_layout(num_layers: int, pp: int, vp: int, mtp: int = 0) -> str:
    """``balanced_layout`` with one decoder layer moved from the last pipeline rank (which also
    runs the output layer and loss, and each MTP module's layer and second output pass: far more
    than the one layer's slot each is counted as) to the first virtual stage: "Et*4|(t*4|)*14tmL"
    for 61 layers and one MTP layer on pp 16 (NVIDIA's DeepSeek-V3 GB200/GB300 recipes),
    "Et*2|(t*2|)*14t|(t*2|)*15mL" on pp 16 x vp 2. '' where the last rank has no decoder layer
    to give."""
    decoders = _balanced_decoders(num_layers, pp * vp, mtp)
    last_rank = [v for v in range(pp - 1, pp * vp, pp) if decoders[v] > 0 and v > 0]
    if not last_rank:
        return ""
    decoders[last_rank[-1]] -= 1
    decoders[0] += 1
    return _render(decoders, mtp)


def _layers(n: int) -> str:
    return "" if n == 0 else "t" if n == 1 else f"t*{n}"


def _runs(sizes: list[int]) -> list[tuple[int, int]]:
    """Consecutive equal sizes as (size, count)."""
    runs: list[tuple[int, int]] = []
    for n in sizes:
        if runs and runs[-1][0] == n:
            runs[-1] = (n, runs[-1][1] + 1)
        else:
            runs.append((n, 1))
    return runs


def _repeat(run: tuple[int, int]) -> str:
    size, count = run
    return f"{_layers(size)}|" if count == 1 else f"({_layers(size)}|)*{count}"


LAYOUT_SYMBOLS = {"E": "embedding", "t": "decoder layer", "m": "MTP layer", "L": "loss"}
MAX_LAYOUT_LENGTH = 100_000  # unrolled characters: far above any real model, below memory trouble


def layout_stages(layout: str) -> list[str]:
    """The virtual stages of a ``--pipeline-model-parallel-layout`` string, unrolled as Megatron's
    ``PipelineParallelLayerLayout.parse_str_to_list`` unrolls it ("Et|(tt|)*2L" -> Et, tt, tt, L)."""
    text = layout.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        def unroll(x: re.Match) -> str:
            if len(x.group(1)) * int(x.group(2)) > MAX_LAYOUT_LENGTH:
                raise ValueError(f"unrolls to more than {MAX_LAYOUT_LENGTH:,} characters")
            return x.group(1) * int(x.group(2))
        text = re.sub(pattern, unroll, text)
    return text.split("|")


def layout_stage_sizes(layout: str) -> list[int]:
    """Decoder layers of each virtual stage of a layout string."""
    return list(_layout_stage_sizes(layout))


@functools.lru_cache(maxsize=4096)
def _layout_stage_sizes(layout: str) -> tuple[int, ...]:
    """``layout_stage_sizes`` parsed once per string: the cost model asks per chunk of candidates."""
    return tuple(stage.count("t") for stage in layout_stages(layout))


def layout_error(layout: str, num_layers: int, mtp: int) -> str:
    """Why Megatron-LM would refuse ``layout`` for this model (PipelineParallelLayerLayout's
    checks), or "" if it accepts it."""
    shown = ascii(layout)
    if layout.count("(") != layout.count(")"):
        return f"pipeline layout {shown} has unbalanced parentheses"
    if re.search(r"\*0+(?!\d)", layout):
        return f"pipeline layout {shown}: a repeat is (stages)*N or t*N with N a positive integer"
    try:
        stages = layout_stages(layout)
    except ValueError as exc:
        return f"pipeline layout {shown} {exc}"
    flat = "".join(stages)
    bad = sorted(set(flat) - set(LAYOUT_SYMBOLS))
    if bad:
        if set(flat) & set("()*0123456789-"):
            return f"pipeline layout {shown}: a repeat is (stages)*N or t*N with N a positive integer"
        known = ", ".join(f"{k} ({v})" for k, v in LAYOUT_SYMBOLS.items())
        return (f"pipeline layout {shown} has unknown symbol(s) {', '.join(map(ascii, bad))}; known: {known}, "
                "| between stages, commas ignored")  # each quoted: a space was shown as nothing
    if not flat or flat[0] != "E" or flat[-1] != "L" or flat.count("E") != 1 or flat.count("L") != 1:
        return f"pipeline layout {shown} must start with the embedding E and end with the loss L, each once"
    if flat.count("t") != num_layers:
        return f"pipeline layout {shown} has {flat.count('t')} decoder layers (t), the model {num_layers}"
    if flat.count("m") != mtp:
        return f"pipeline layout {shown} has {flat.count('m')} MTP layers (m), the model {mtp} (mtp_num_layers)"
    if "m" in flat and "t" in flat[flat.index("m"):]:
        return f"pipeline layout {shown} places decoder layers after an MTP layer"
    return ""


def stage_layers(num_layers: int, pp, vp, first, last, embedding, loss, layout=None, groups=None):
    """Decoder layers on the first, each middle (the fullest one), and the last stage (arrays, one
    per plan); ``groups``: ``structure(...)`` of the same columns where the caller has it."""
    if layout is not None:
        layout = np.asarray(layout, dtype=object)
        if (layout != "").any():
            return _layout_stage_layers(num_layers, pp, vp, first, last, embedding, loss, layout, groups)
    pp, first, last = (np.asarray(a, dtype=float) for a in (pp, first, last))
    embedding, loss = (np.asarray(a, dtype=float) for a in (embedding, loss))
    even = num_layers / pp
    explicit = (first > 0) | (last > 0)
    middle_stages = np.maximum(pp - (first > 0) - (last > 0), 1.0)
    explicit_middle = (num_layers - first - last) / middle_stages
    accounted = (embedding + loss) > 0
    slots = (num_layers + embedding + loss) / pp
    middle = np.where(explicit, explicit_middle, np.where(accounted, slots, even))
    first_layers = np.where(explicit & (first > 0), first, np.where(accounted, slots - embedding, middle))
    last_layers = np.where(explicit & (last > 0), last, np.where(accounted, slots - loss, middle))
    single = pp == 1
    return (np.where(single, num_layers, first_layers), np.where(single, num_layers, middle),
            np.where(single, num_layers, last_layers))


def factorize(values) -> tuple[np.ndarray, list]:
    """Codes and distinct values of a column of strings (pandas' hash table: fast on millions)."""
    values = np.asarray(values, dtype=object).reshape(-1)
    codes, uniques = pd.factorize(values)  # twice as fast as keeping a missing value as a code
    if len(codes) and codes.min() < 0:  # a None or NaN among them
        codes, uniques = pd.factorize(values, use_na_sentinel=False)
    return codes.astype(np.int64), list(uniques)


def _groups(*columns) -> tuple[np.ndarray, np.ndarray]:
    """Group index of each row over integer columns (one int64 key, hashed) and one row of each
    group (any: its rows agree on every column)."""
    key = np.zeros(np.broadcast(*columns).shape, dtype=np.int64)
    for column in columns:
        column = np.asarray(column, dtype=np.int64)
        key = key * (int(column.max(initial=0)) + 1) + column
    inverse, uniques = pd.factorize(key.reshape(-1))  # a hash table: np.unique's sort costs 4x
    rows = np.empty(len(uniques), dtype=np.int64)
    rows[inverse] = np.arange(len(inverse))
    return inverse, rows


def _per_rank(sizes: list[int], pp: int) -> tuple[float, float, float]:
    """Layers of the first, the fullest middle and the last rank, from per-virtual-stage sizes."""
    ranks = [sum(sizes[r::pp]) for r in range(pp)]
    return ranks[0], max(ranks[1:-1]) if pp > 2 else ranks[0], ranks[-1]


def structure(pp, vp, first, last, embedding, loss, layout, factorized: tuple[np.ndarray, list] | None = None
              ) -> tuple[list[np.ndarray], list, np.ndarray, np.ndarray]:
    """The pipeline-structure columns as flat int64 arrays (the layout as codes into ``names``, the
    last column), each row's structure group and one row of each group: a search's rows have few
    structures (32 in DeepSeek-V3's 1.7 M), so what depends on the structure alone is priced per
    group; computed once per search and handed to ``stage_layers``, ``stage_pattern_counts`` and
    ``held_at_peak``. ``factorized``: ``factorize(layout)`` where the caller has it."""
    layout = np.asarray(layout, dtype=object)
    codes, names = factorized or factorize(layout)
    columns = [np.broadcast_to(np.asarray(a, dtype=np.int64), layout.shape).reshape(-1)
               for a in (pp, vp, first, last, embedding, loss)] + [codes]
    inverse, rows = _groups(*columns)
    return columns, names, inverse, rows


def _layout_stage_layers(num_layers, pp, vp, first, last, embedding, loss, layout, groups=None):
    """``stage_layers`` for columns in which some plans carry a layout string: the layout's stages
    are counted once per structure group."""
    out = [np.broadcast_to(np.array(x, dtype=float), layout.shape).copy()
           for x in stage_layers(num_layers, pp, vp, first, last, embedding, loss)]
    columns, names, inverse, rows = groups or structure(pp, vp, first, last, embedding, loss, layout)
    pp_all, codes = columns[0], columns[-1]
    values = np.array([_per_rank(layout_stage_sizes(names[codes[i]]), int(pp_all[i])) if names[codes[i]]
                       else (np.nan,) * 3 for i in rows]).reshape(-1, 3)[inverse]
    priced = ~np.isnan(values[:, 0])
    for k in range(3):
        out[k].reshape(-1)[priced] = values[priced, k]
    return tuple(out)


def microbatch_group(m, pp):
    """Megatron's --microbatch-group-size-per-virtual-pipeline-stage N for an interleaved
    schedule of m micro-batches: pp (its default) when m is a multiple of pp, else the smallest
    N >= pp that ``schedules.forward_backward_pipelining_with_interleaving`` accepts (the last
    group, m mod N, empty or at least pp). m < pp has none (NaN)."""
    m, pp = np.broadcast_arrays(np.asarray(m, dtype=float), np.asarray(pp, dtype=float))
    out = np.full(m.shape, np.nan)
    pairs, inverse = np.unique(np.stack([m.reshape(-1), pp.reshape(-1)]), axis=1, return_inverse=True)
    sizes = [microbatch_group_size(int(total), int(ranks)) for total, ranks in pairs.T]
    out.reshape(-1)[:] = np.array([np.nan if n is None else n for n in sizes], dtype=float)[inverse.reshape(-1)]
    return out


def microbatch_group_size(m: int, pp: int) -> int | None:
    """``microbatch_group`` of one plan (None where m < pp)."""
    return next((n for n in range(pp, m + 1) if m % n == 0 or m % n >= pp), None)


def inflight_chunks(pp, vp, m, stage):
    """Chunk-micro-batches whose activations stage ``stage`` holds at its peak (micro-batches
    when vp = 1): warm-up plus the one in flight, capped by what the step has. Interleaved, each
    virtual stage runs a group of N micro-batches at a time (``microbatch_group``), so the
    warm-up holds (vp-1) groups."""
    pp, vp, m, stage = (np.asarray(a, dtype=float) for a in (pp, vp, m, stage))
    group = np.array(np.broadcast_to(pp, np.broadcast(pp, vp, m).shape))
    grouped = (vp > 1) & (m % pp != 0) & (m >= pp)  # m < pp: no schedule (space rule); the cap below
    if grouped.any():
        group[grouped] = microbatch_group(np.broadcast_to(m, grouped.shape)[grouped], group[grouped])
    interleaved = (vp - 1) * group + 2 * (pp - 1 - stage) + 1
    plain = pp - stage
    return np.minimum(np.where(vp > 1, interleaved, plain), m * vp)


def _schedule_group(m: int, pp: int, vp: int) -> tuple[int, int]:
    """(N, the size of the last group) of ``get_schedule_table``'s groups of N micro-batches: N as
    ``microbatch_group`` (pp where m < pp); the last group, the first whose end reaches m, takes
    the rest (m - its first micro-batch, at most N)."""
    group = (microbatch_group_size(m, pp) or pp) if vp > 1 else 1
    low = group * max(-(-m // group) - 1, 0)
    return group, m - low


def _chunk_counts(k: np.ndarray, m: int, vp: int, group: int, last_group: int) -> np.ndarray:
    """How many of the first ``k`` entries of ``get_schedule_table(m, vp, group)`` run each
    chunk: (len(k), vp). Regular groups (N micro-batches through chunk 0, then 1, ...) come first,
    the last one (``last_group`` micro-batches) ends the table."""
    k = np.asarray(k, dtype=np.int64)[:, None]
    chunks = np.arange(vp, dtype=np.int64)[None, :]
    period = group * vp
    start = (m - last_group) * vp  # the last group's first entry
    regular = np.minimum(k, start)
    counts = (regular // period) * group + np.clip(regular % period - chunks * group, 0, group)
    return counts + np.clip(k - start - chunks * last_group, 0, last_group) * (k > start)


def alive_chunks(pp: int, vp: int, m: int) -> tuple[np.ndarray, ...]:
    """Chunk-micro-batches each pipeline rank may hold at its peak under Megatron's schedule, per
    chunk: one (states, vp) int array per rank.

    Megatron-LM d98e8a64dd megatron/core/pipeline_parallel/schedules.py: the forwards run in the
    order of ``get_schedule_table`` (lines 989-1016: groups of ``microbatch_group_size_per_vp_stage``
    micro-batches, each through chunk 0, 1, ... in turn), the backwards in the same order with the
    chunk reversed (``get_model_chunk_id``, forward=False: vp - 1 - chunk); rank r warms up with
    ``(pp - r - 1) * 2 + (vp - 1) * N`` forwards (``get_pp_rank_microbatches``, lines 957-970;
    ``pp - r - 1`` without interleaving), then runs one forward and one backward per step, so after
    B backwards it holds the first B + W + 1 forwards less the first B backwards (all m*vp where
    the warm-up is the whole step). Memory only grows in the warm-up and only falls in the
    cool-down, so the peak is one of these states; between two B at which a forward or a backward
    enters a new chunk every count moves by a constant step, so any weighting of the chunks peaks
    at such a B: those states are kept. While both B and B + W + 1 lie in regular groups the
    states repeat with the period N * vp (each chunk gains N forwards and N backwards), so one
    period and the states that reach the last group (shorter where m is not a multiple of N)
    cover them all, as they do for m less whole groups as long as a period and the fullest
    warm-up fit twice before the last group: the states are worked out for the fewest such
    micro-batches."""
    group, last_group = _schedule_group(m, pp, vp)
    period = group * vp
    fullest = (pp - 1) * 2 + (vp - 1) * group + 1 if vp > 1 else pp
    spare = ((m - last_group) * vp - 2 * (period + fullest)) // period
    return _alive_chunks(pp, vp, m - max(spare, 0) * group, group, last_group)


@functools.lru_cache(maxsize=4096)
def _alive_chunks(pp: int, vp: int, m: int, group: int, last_group: int) -> tuple[np.ndarray, ...]:
    """``alive_chunks`` for m micro-batches in groups of ``group``, the last of ``last_group``."""
    total, period = m * vp, group * vp
    start = (m - last_group) * vp
    bounds = np.union1d(np.arange(0, start + 1, group), start + np.arange(vp + 1) * last_group)
    ranks = np.arange(pp)
    warmup = (pp - ranks - 1) * 2 + (vp - 1) * group if vp > 1 else pp - ranks - 1
    held = np.minimum(warmup + 1, total)[:, None]
    last = total - held
    steps = np.concatenate([np.zeros_like(held), last, np.broadcast_to(bounds, (pp, len(bounds))), bounds - held],
                           axis=1)
    keep = (steps >= 0) & (steps <= last) & ((steps <= period) | (steps >= start - held))
    steps, held = steps[keep], np.broadcast_to(held, keep.shape)[keep]
    alive = (_chunk_counts(steps + held, m, vp, group, last_group)
             - _chunk_counts(steps, m, vp, group, last_group)[:, ::-1])
    return tuple(np.split(alive, np.cumsum(keep.sum(axis=1))[:-1]))


def _undominated(points: np.ndarray) -> np.ndarray:
    """The distinct rows of ``points`` (three non-negative int columns below 2**21) that no other
    row is >= in every column."""
    keys = np.unique((points[:, 0] << 42) | (points[:, 1] << 21) | points[:, 2])
    points = np.stack([keys >> 42, (keys >> 21) & (2 ** 21 - 1), keys & (2 ** 21 - 1)], axis=1)
    ge = (points[:, None, :] >= points[None, :, :]).all(axis=2)  # ge[j, i]: row j holds as much as row i
    return points[~(ge & ~np.eye(len(points), dtype=bool)).any(axis=0)]


@functools.lru_cache(maxsize=65536)
def _held_at_peak(pattern: tuple[int, ...], pp: int, vp: int, m: int, first: int, last: int, embedding: bool,
                  loss: bool, layout: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``held_at_peak`` of one structure: for the first rank, the fullest middle rank and the last
    rank, the (layers, MoE layers, edge chunk's micro-batches) of each state that may be its peak,
    as three (states, 3) arrays."""
    sizes = np.asarray(virtual_stage_sizes(len(pattern), pp, vp, first, last, embedding, loss, layout), dtype=np.int64)
    ends = np.cumsum(sizes)
    cumulative = np.concatenate([[0], np.cumsum(pattern)]).astype(np.int64)
    moe = cumulative[ends] - cumulative[ends - sizes]
    states = [np.asarray(held, dtype=np.int64) for held in alive_chunks(pp, vp, m)]
    ranks = []
    for rank in range(pp):
        edge = states[rank][:, 0] if rank == 0 else states[rank][:, -1] if rank == pp - 1 else 0 * states[rank][:, 0]
        moe_layers = states[rank] @ moe[rank::pp]
        ranks.append(np.stack([states[rank] @ sizes[rank::pp] - moe_layers, moe_layers, edge], axis=1))
    assert max(int(r.max()) for r in ranks) < 2 ** 21, "held counts beyond _undominated's packing"
    middle = _undominated(np.concatenate(ranks[1:-1])) if pp > 2 else _undominated(ranks[0])
    return _undominated(ranks[0]), middle, _undominated(ranks[-1])


def held_at_peak(pattern: tuple[int, ...], pp, vp, m, first, last, embedding, loss, layout, groups=None):
    """What the first, the fullest middle and the last pipeline rank may hold at the peak of
    Megatron's schedule (``alive_chunks``), summed over the chunk-micro-batches in flight: for each
    position an array of each of dense layer-micro-batches, MoE layer-micro-batches and
    micro-batches of the edge chunk (the first rank's first chunk: the embedding's inputs; the last
    rank's last chunk: the loss's and the MTP layers'), one row per state that may be the peak
    ((K, plans) arrays, a group's first state repeated up to K); the memory step prices every state
    and keeps the fullest. ``pattern``: 1 per MoE layer, 0
    per dense one. Where a rank's chunks hold different counts (the embedding or the loss counted
    in the split, an uneven or flexible layout), its early chunks are held more often than its late
    ones, which ``inflight_chunks`` / vp micro-batches of the average chunk misses both ways
    (Llama 3.1 405B, PP16 VP4, 126 layers + embedding + loss: rank 0 holds at most 127
    layer-micro-batches, not 138.25; rank 15 98, not 85.75). The middle takes the states of every
    middle rank: priced with the middle rank's model states (the most layers, ``stage_layers``),
    every rank is covered. ``groups``: ``structure(pp, vp, first, last, embedding, loss, layout)``
    where the caller has it (``peaks``, laid out: ``Peaks.held``)."""
    return peaks(pattern, pp, vp, m, first, last, embedding, loss, layout, groups).held()


@dataclass(frozen=True)
class Peaks:
    """``held_at_peak``'s states per group of plans with one pipeline structure and micro-batch
    count, before they are laid out per plan (``held``): ``tables`` for the first, the middle and the
    last rank, each (groups, K, 3) int32 (a group's states, then its first repeated up to K),
    ``lengths`` (groups, 3) each group's own count of states, ``groups`` each plan's (of the plans'
    ``shape``). ``at`` keeps some plans: a search works its groups' states out once and lays them
    out chunk by chunk, each as ``held_at_peak`` on the chunk would (K and the counts the same in
    every group read from the chunk's groups alone)."""

    tables: tuple[np.ndarray, np.ndarray, np.ndarray]
    lengths: np.ndarray
    groups: np.ndarray
    shape: tuple

    def at(self, rows: np.ndarray) -> Peaks:
        """The plans ``rows`` (a 1-D index) alone."""
        return Peaks(self.tables, self.lengths, self.groups.reshape(-1)[rows], (len(rows),))

    def held(self) -> list:
        """``held_at_peak``: per position (dense layer-, MoE layer-, edge chunk) micro-batches, (K,
        plans) arrays, K the most states of the plans' groups."""
        present = np.zeros(len(self.lengths), dtype=bool)
        present[self.groups] = True
        tables, varying = [], []
        for position in range(3):
            table = self.tables[position][:, :int(self.lengths[present, position].max())]
            tables.append(table)
            # a count the same in every group is one (K, 1) column (a dense model's MoE layers, a
            # middle rank's edge chunk); the others are gathered per plan, all in one pass
            varying += [table[:, :, j] for j in range(3) if _varies(table[present, :, j])]
        gathered = np.take(np.concatenate(varying, axis=1), self.groups.reshape(-1), axis=0) if varying else None
        out, column, first = [], 0, np.flatnonzero(present)[0]
        for table in tables:
            k, parts = table.shape[1], []
            for j in range(3):
                if _varies(table[present, :, j]):
                    parts.append(gathered[:, column:column + k].T.reshape(k, *self.shape))
                    column += k
                else:
                    parts.append(table[first, :, j].reshape(k, *(1,) * len(self.shape)))
            out.append(tuple(parts))
        return out


def _varies(counts: np.ndarray) -> bool:
    return bool((counts != counts[:1]).any())


def peaks(pattern: tuple[int, ...], pp, vp, m, first, last, embedding, loss, layout, groups=None) -> Peaks:
    """``held_at_peak``'s states of each group of the plans (``Peaks``); the arguments as there."""
    layout = np.asarray(layout, dtype=object)
    shape = np.broadcast(layout, np.asarray(pp), np.asarray(m)).shape
    m = np.broadcast_to(np.rint(np.asarray(m, dtype=float)), shape).astype(np.int64).reshape(-1)
    columns, names, by_structure, _ = groups or structure(pp, vp, first, last, embedding, loss,
                                                          np.broadcast_to(layout, shape))
    inverse, rows = _groups(by_structure, m)
    columns = [*columns, m]
    per_group = []
    for i in rows:
        p_, v_, f_, l_, e_, o_, code, m_ = (int(c[i]) for c in columns)
        per_group.append(_held_at_peak(pattern, p_, v_, m_, f_, l_, bool(e_), bool(o_), names[code] or ""))
    tables = []
    for position in range(3):
        k = max(len(g[position]) for g in per_group)
        tables.append(np.stack([np.concatenate([g[position], np.repeat(g[position][:1], k - len(g[position]), axis=0)])
                                for g in per_group]).astype(np.int32))  # (groups, K, 3)
    lengths = np.array([[len(g[position]) for position in range(3)] for g in per_group], dtype=np.int64)
    return Peaks(tuple(tables), lengths, inverse.reshape(shape), shape)


# Pipeline schedules Megatron does not run, which only a published row states (the row's
# ``pipeline_schedule`` column; a search never offers them). DualPipe (DeepSeek-V3 report, arXiv
# 2412.19437 §3.2.1, Table 2): each rank holds two model chunks, one per direction of a
# bidirectional pipeline, so 2x the parameters, and PP+1 micro-batches' activations of a stage at
# its peak, where 1F1B holds PP. Which stages and how many of each: rank r holds stage r and stage
# PP-1-r of the PP stages (deepseek-ai/DualPipe 3da1bbe examples/example_dualpipe.py lines 138-141),
# so the two end ranks each hold the first stage (the embedding) and the last (the output head and
# the MTP module, which share the embedding and head there: report §3.2.1); at the peak of
# ``DualPipe.step`` (dualpipe/dualpipe.py lines 358-396, step 4's overlapped F&B) a rank h = min(r,
# PP-1-r) from the end holds PP-h micro-batches of its forward-direction stage and h+1 of the other
# (``dualpipe_chunks``). Its time is priced as interleaved 1F1B (vp 2, as the row pins).
# Its all-to-alls and point-to-point sends run behind the other direction's computation: "both
# all-to-all and PP communication can be fully hidden during execution" (§3.2.1), as issue 22 lets
# DualPipe be priced; its communication kernels still take their SMs from that computation.
DUALPIPE = "dualpipe"
DUALPIPE_PARAMETER_COPIES = 2.0
DUALPIPE_HIDDEN_SHARE = 1.0


def dualpipe_inflight(pp):
    """Micro-batches whose activations (of one stage's layers) a DualPipe rank holds at its peak."""
    return np.asarray(pp, dtype=float) + 1.0


def dualpipe_chunks(pp, half_rank):
    """(micro-batches of its forward-direction stage, of its other stage) a DualPipe rank
    ``half_rank`` = min(r, PP-1-r) from the pipeline's end holds at its peak: PP-h and h+1, PP+1 in
    all (the end ranks: PP of the first stage, one of the last). Replayed chunk by chunk from
    ``DualPipe.step`` (3da1bbe dualpipe/dualpipe.py lines 358-396): step 1 runs 2(PP/2-h-1) forward
    chunks of phase 0, step 2 h+1 of each phase, steps 3-4 a backward for each further forward."""
    pp, h = np.asarray(pp, dtype=float), np.asarray(half_rank, dtype=float)
    return pp - h, h + 1.0


def schedule_time(m, vp, stage_times_max, stage_times_sum):
    """One step of m micro-batches: the bottleneck stage m times, plus fill and drain."""
    return m * stage_times_max + (stage_times_sum - stage_times_max) / vp


def bubble_microbatches(pp, vp):
    """Idle time of a stage per step, in units of one micro-batch's forward+backward on it
    (equal stages)."""
    return (pp - 1) / vp


def inflight_layer_fraction(pp, vp, m):
    """Activations held by the first stage, as a multiple of one micro-batch through ALL layers
    (even split)."""
    pp, vp = np.asarray(pp, dtype=float), np.asarray(vp, dtype=float)
    return inflight_chunks(pp, vp, m, 0) / (pp * vp)


def virtual_stage_sizes(num_layers: int, pp: int, vp: int, first: int, last: int, embedding: bool,
                        loss: bool, layout: str = "") -> list[int]:
    """Decoder layers of each virtual stage v = chunk*pp + rank, in model order: Megatron's
    ``get_transformer_layer_offset`` walks chunk by chunk, each over every rank."""
    if layout:
        return layout_stage_sizes(layout)
    if pp == 1:
        return [num_layers // vp] * vp
    if embedding or loss:
        slots = (num_layers + embedding + loss) // (pp * vp)
        sizes = [slots] * (pp * vp)
        sizes[0] -= embedding
        sizes[-1] -= loss
        return sizes
    explicit_ranks = (first > 0) + (last > 0)
    middle = (num_layers - first - last) // (pp - explicit_ranks) if pp > explicit_ranks else 0
    per_rank = [middle] * pp
    if first:
        per_rank[0] = first
    if last:
        per_rank[-1] = last
    return [per_rank[r] // vp for _ in range(vp) for r in range(pp)]


def stage_pattern_counts(pattern: tuple[int, ...], pp, vp, first, last, embedding, loss, layout, groups=None):
    """For layers flagged 1 in ``pattern`` (MoE layers): how many the first stage, the middle stage
    holding most of them, and the last stage hold (arrays, one per plan; the middle equals the
    first when pp <= 2)."""
    layout = np.asarray(layout, dtype=object)
    columns, names, inverse, rows = groups or structure(pp, vp, first, last, embedding, loss, layout)
    cumulative = np.concatenate([[0], np.cumsum(pattern)])
    counts = np.zeros((len(rows), 3))
    for i, row in enumerate(rows):
        p_, v_, f_, l_, e_, o_, code = (int(c[row]) for c in columns)
        sizes = virtual_stage_sizes(len(pattern), p_, v_, f_, l_, bool(e_), bool(o_), names[code])
        ends = np.cumsum(sizes)
        counts[i] = _per_rank(list(cumulative[ends] - cumulative[ends - np.asarray(sizes)]), p_)
    out = counts[inverse]
    return tuple(out[:, k].reshape(layout.shape) for k in range(3))


def stage_kind_counts(pattern, kinds, pp, vp, first, last, embedding, loss, layout, groups=None):
    """Each layer kind's count (``kinds``: the labels of ``pattern``'s layers, Megatron-LM's
    ``--hybrid-layer-pattern`` symbols, in order of precedence) on the first, one middle and the last
    pipeline rank: a (3, len(kinds), plans) array. A rank holds the contiguous slices of its
    virtual stages (``virtual_stage_sizes``: v = chunk * pp + rank, as ``transformer_block`` and
    ``hybrid_layer_allocation.select_pipeline_segment`` assign them), so its kinds are counted
    from the layers it holds, not the pattern's mix. The middle rank priced is the fullest, then
    the one with most of ``kinds[0]``, then of ``kinds[1]``... (the slowest one as far as the
    kinds' order ranks their cost; ``stage_layers``' and ``stage_pattern_counts``' middle when
    ``kinds[0]`` is the MoE symbol). Counted once per structure group, like them."""
    layout = np.asarray(layout, dtype=object)
    columns, names, inverse, rows = groups or structure(pp, vp, first, last, embedding, loss, layout)
    flags = np.array([[symbol == kind for symbol in pattern] for kind in kinds], dtype=np.int64)
    cumulative = np.concatenate([np.zeros((len(kinds), 1), dtype=np.int64), np.cumsum(flags, axis=1)], axis=1)
    counts = np.zeros((len(rows), 3, len(kinds)))
    for i, row in enumerate(rows):
        p_, v_, f_, l_, e_, o_, code = (int(c[row]) for c in columns)
        sizes = np.asarray(virtual_stage_sizes(len(pattern), p_, v_, f_, l_, bool(e_), bool(o_), names[code]))
        ends = np.cumsum(sizes)
        per_stage = cumulative[:, ends] - cumulative[:, ends - sizes]  # (kinds, virtual stages)
        ranks = np.stack([per_stage[:, r::p_].sum(axis=1) for r in range(p_)])  # (pp, kinds)
        middle = ranks[0]
        if p_ > 2:
            order = np.column_stack([ranks.sum(axis=1), ranks])[1:-1]
            middle = ranks[1 + np.lexsort(order.T[::-1])[-1]]
        counts[i] = (ranks[0], middle, ranks[-1])
    out = counts[inverse]  # (plans, 3, kinds)
    return np.moveaxis(out, 0, -1).reshape((3, len(kinds)) + layout.shape)
