import re

import pandas as pd
import pytest

from autoparallel.errors import UserError
from autoparallel.io import load_model
from autoparallel.search import run
from autoparallel.space import load_space


@pytest.fixture(scope="module")
def search_512(gpt175b, h100):
    return run.search(gpt175b, h100, 512, 2048, load_space())


def test_ranks_are_dense_and_sorted(search_512):
    feasible = search_512.feasible
    assert list(feasible["rank"][:5]) == [1, 2, 3, 4, 5]
    assert feasible["tokens_per_s_per_gpu"].is_monotonic_decreasing
    assert (search_512.ranked.loc[~search_512.ranked.fits, "reason"] != "").all()


def test_in_sample_published_nemo_layout_is_feasible_and_in_the_top_5_percent(search_512):
    """In sample: NeMo's GPT-3 175B rows on 512 H100 are among those the H100 constants were fitted
    on, so this checks the search ranks a layout of the fit well, not that it generalises
    (test_validate's leave-one-model-out figures do)."""
    f = search_512.feasible
    published = f[(f.tp == 4) & (f.pp == 8) & (f.vp == 6) & (f.cp == 1) & (f.mbs == 2)
                  & (f.precision == "fp8-delayed")]
    assert not published.empty
    best_rank = int(published["rank"].min())
    assert best_rank <= 0.05 * len(f), f"rank {best_rank} of {len(f)}"


def test_rank_out_of_range_is_a_user_error(search_512):
    with pytest.raises(UserError, match="out of range"):
        search_512.entry(10**9)


def test_nothing_fits_says_why_and_smallest_need(h100):
    model = load_model("llama3.1-405b")
    space = load_space().pinned(tp=1, pp=1, cp=1)
    with pytest.raises(UserError, match=r"no layout of llama3.1-405b fits on 4 x h100-sxm: with tp pinned to 1 and "
                                        r"pp pinned to 1 and cp pinned to 1: the smallest memory need is "
                                        r"\d+\.\d GiB against a limit of 79.7 GiB"):
        run.search(model, h100, 4, 252, space)


def test_nothing_fits_names_the_fewest_gpus_that_fit(gpt175b, h100):
    """GPT-3 175B on 8 GPUs said "try more GPUs" and no number: it names the count (of 16, 32, 64...)
    at which the same search fits a layout and half of it still does not, with that half's need,
    and what the least-memory layout of the count asked spends its memory on."""
    import re

    from autoparallel.search.diagnose import out_of_memory
    from autoparallel.search.grid import evaluate
    from autoparallel.space import generate_with_sources
    space = load_space()
    with pytest.raises(UserError) as caught:
        run.search(gpt175b, h100, 8, 2048, space)
    message = str(caught.value)
    found = re.search(r"the smallest memory need is ([\d.]+) GiB against a limit of 79.7 GiB \(TP\d+ PP\d+ CP\d+ DP\d+: "
                      r"([\d.]+) GiB of weights, gradients and optimizer state, [\d.]+ of activations\); layouts fit "
                      r"on (\d+) GPUs \((\d+) still need ([\d.]+) GiB\): search --gpus \3$", message)
    assert found, message
    assert float(found[2]) > 79.7 and "try more GPUs" not in message  # the state alone is over the limit
    fewest, half = int(found[3]), int(found[4])
    assert half == fewest // 2 and fewest > 8
    assert not run.search(gpt175b, h100, fewest, 2048, space).feasible.empty
    ranked = evaluate(gpt175b, h100, generate_with_sources(gpt175b, h100, half, 2048, space)[0], space.memory_fraction,
                      settings=space.cost_settings())
    assert not ranked["fits"].any()
    assert f"{out_of_memory(ranked)['peak_memory_gib'].min():.1f}" == found[5]


def test_nothing_fits_for_long_sequences_says_the_activations_are_the_need(gpt175b, h100):
    """At 4M-token sequences the least need is mostly activations, which more GPUs do not shard here:
    the message said "more GPUs shard that state further" (the state was 41.5 of 209 GiB)."""
    import dataclasses
    import re
    with pytest.raises(UserError) as caught:
        run.search(dataclasses.replace(gpt175b, seq_length=4_000_000), h100, 64, 2048, load_space())
    message = str(caught.value)
    state, activations = map(float, re.search(r"([\d.]+) GiB of weights, gradients and optimizer state, ([\d.]+) of "
                                              r"activations\); the activations of 4,000,000-token sequences are most "
                                              r"of it: a shorter --seq-length$", message).groups())
    assert activations > state and "more GPUs" not in message


def test_gpu_count_no_layout_can_use(gpt175b, h100):
    with pytest.raises(UserError, match="no valid layout of gpt3-175b for 7 GPUs"):
        run.search(gpt175b, h100, 7, 2048, load_space())


@pytest.mark.parametrize("pins, why", [
    ({"cutedsl_fused_grouped_mlp": True, "precision": "bf16"},
     r"with cutedsl_fused_grouped_mlp pinned to true and precision pinned to bf16: the CuTe-DSL fused grouped MLP"),
    ({"fp8_attention": True, "precision": "bf16"},
     r"with fp8_attention pinned to true and precision pinned to bf16: FP8 attention \(--fp8-dot-product-attention\)"),
    ({"ep": 64}, r"with ep pinned to 64: ep\*etp=64 does not divide the 32 GPUs of a pipeline stage"),
    ({"tp_overlap_rs_pipeline": True, "tp_comm_overlap": False},
     r"with tp_overlap_rs_pipeline pinned to true and tp_comm_overlap pinned to false: the pipelined forward "
     r"reduce-scatter \(--tp-overlap-rs-pipeline\) is a userbuffers method"),
    ({"fp8_attention": True, "precision": "fp8-delayed", "cp": 2, "transformer_engine_version": "1.6"},
     r"with fp8_attention pinned to true and cp pinned to 2 and transformer_engine_version pinned to 1.6: FP8 "
     r"attention under context parallelism needs TransformerEngine >= 1\.10"),
    ({"precision": "fp8-current", "transformer_engine_version": "1.10"},
     r"with precision pinned to fp8-current and transformer_engine_version pinned to 1.10: fp8-current needs "
     r"TransformerEngine >= 2\.2, the first release with its recipe"),
])
def test_a_pinned_knob_that_rules_out_every_layout_is_named(pins, why):
    """The MoE structure rules and the feature rules each knob pinned on brings name the knob and the
    rule, not the most common reasons of layouts the user never asked for (session 36: the ep*etp
    split and the FP8-attention / fused-MLP rules had no pattern in search.diagnose)."""
    from autoparallel.io import load_hardware
    with pytest.raises(UserError, match=why):
        run.search(load_model("qwen3-30b-a3b"), load_hardware("b200"), 32, 512, load_space().pinned(**pins),
                   pinned=pins)


def test_feasible_is_the_fitting_rows_whether_or_not_they_come_first(search_512):
    """``SearchResult.feasible`` slices a ranked frame's first rows (its fitting rows come first) and
    filters any other frame: both are exactly ``ranked[ranked.fits]``, index and columns included."""
    ranked = search_512.ranked
    assert search_512.feasible.equals(ranked[ranked["fits"]])
    assert not ranked["fits"].all()  # rejected rows follow, so the slice stops before them
    shuffled = run.SearchResult(search_512.model, search_512.hardware, 512, 2048, search_512.space,
                                ranked.sample(frac=1.0, random_state=0))
    assert shuffled.feasible.equals(shuffled.ranked[shuffled.ranked["fits"]])


def test_rank_gathers_every_column_as_the_frame_would(search_512):
    """``grid.rank`` takes each column in the order on its own (thread pool): the same frame as
    sorting the whole frame, for every dtype a candidates table holds (str, bool, int, float, Int64)."""
    import numpy as np

    from autoparallel.search.grid import rank
    frame = search_512.ranked.drop(columns="rank").sample(frac=1.0, random_state=1).reset_index(drop=True)
    frame["measured"] = pd.array(np.where(np.arange(len(frame)) % 3, np.arange(len(frame)), -1), dtype="Int64")
    frame.loc[frame["measured"] < 0, "measured"] = pd.NA
    ranked = rank(frame)
    order = np.lexsort((-np.nan_to_num(frame["tokens_per_s_per_gpu"].to_numpy(float), nan=-1.0),
                        ~frame["fits"].to_numpy(bool)))
    expected = frame.iloc[order].reset_index(drop=True)
    assert ranked.drop(columns="rank").equals(expected)
    assert list(ranked.dtypes.drop("rank")) == list(frame.dtypes)


def test_rank_copies_only_columns_of_one_value_bit_for_bit():
    """``grid.rank`` copies a column whose rows are one value instead of gathering it: 0.0 and -0.0
    compare equal but are two values, and a column of them is gathered."""
    import numpy as np

    from autoparallel.search.grid import rank
    frame = pd.DataFrame({"fits": [True, True, False], "tokens_per_s_per_gpu": [1.0, 3.0, np.nan],
                          "zeros": [0.0, -0.0, 0.0], "nans": [np.nan] * 3, "one": [7, 7, 7]})
    ranked = rank(frame)
    assert list(np.signbit(ranked["zeros"])) == [True, False, False]
    assert ranked.drop(columns="rank").equals(frame.iloc[[1, 0, 2]].reset_index(drop=True))

def test_string_columns_from_their_codes_rank_and_price_alike():
    """``space.generate_with_sources``: each string column it hands over is ``values.take(codes)``
    of the frame's own column (same dtype); ``grid.evaluate`` with them (the cost model reading the
    codes, ``rank`` gathering them) gives the frame it gives without, dtypes included."""
    from autoparallel.io import load_hardware
    from autoparallel.search.grid import evaluate
    from autoparallel.space import generate_with_sources

    model, hw, space = load_model("mixtral-8x7b"), load_hardware("h100-sxm"), load_space()
    frame, sources = generate_with_sources(model, hw, 64, model.global_batch_size, space)
    assert {"precision", "recompute", "recompute_modules", "moe_token_dispatcher_type",
            "pipeline_model_parallel_layout"} <= set(sources)
    for name, source in sources.items():
        assert source.column().equals(frame[name].array) and source.column().dtype == frame[name].array.dtype, name
        if source.is_string:  # the codes the cost model reads
            assert source.values.take(source.codes).equals(frame[name].array), name
    with_codes = evaluate(model, hw, frame, space.memory_fraction, sources=sources)
    without = evaluate(model, hw, frame, space.memory_fraction)
    assert with_codes.equals(without)
    assert list(with_codes.dtypes) == list(without.dtypes)


@pytest.mark.parametrize("dtype", [float, bool])
def test_at_rows_gathers_as_its_full_column(dtype):
    """``evaluators.AtRows`` (metrics priced at the valid rows only): ``taken(slots(order))`` is its
    full column (NaN, or False, where not priced) gathered in ``order``, dtype kept; no rows too."""
    import numpy as np

    from autoparallel.search.evaluators import AtRows
    rng = np.random.default_rng(0)
    n = 50
    order = rng.permutation(n)
    for rows in (np.flatnonzero(rng.random(n) < 0.6), np.array([], dtype=np.int64)):
        column = AtRows((rng.random(len(rows)) < 0.5).astype(dtype), rows, n)
        full = column.full()
        missing = np.setdiff1d(np.arange(n), rows)
        assert full.dtype == dtype
        assert np.isnan(full[missing]).all() if dtype is float else not full[missing].any()
        np.testing.assert_array_equal(full[rows], column.values)
        got = column.taken(column.slots(order))
        assert got.dtype == full.dtype
        np.testing.assert_array_equal(got, full.take(order))


def _fits_on(message: str) -> str:
    """The GPU count a memory message names and the command that goes there, as search says it."""
    found = re.search(r"fits? on \d+ GPUs \(\d+ still need [\d.]+ GiB\): \w+ --gpus \d+$", message)
    assert found, message
    return found[0]


def test_a_sampler_search_that_fits_nothing_names_the_gpu_count_as_grid_search_does(gpt175b, h100):
    """`search --strategy optuna --grid-seeds 0` on 8 GPUs said "none of the 18 layouts the study tried
    is feasible (18 x out of memory); search again with more --trials" where grid search names 64
    GPUs (session 52): no trial fits in memory, none of the grid does either, and it names the count
    grid search names, in the same words (``diagnose.fits_on``)."""
    from autoparallel.search import sampler
    settings = sampler.StudySettings(trials=6, seeds_from_grid=0, seed=0)
    with pytest.raises(UserError) as caught:
        run.optuna_search(gpt175b, h100, 8, 2048, load_space(), settings, None, ["test"])
    message = str(caught.value)
    assert message.startswith("none of the") and "and no layout of the grid fits on 8 x h100-sxm; " in message
    with pytest.raises(UserError) as grid:
        run.search(gpt175b, h100, 8, 2048, load_space())
    assert _fits_on(message) == _fits_on(str(grid.value)) and _fits_on(message).endswith("search --gpus 64")


def test_the_fewest_count_searched_from_scratch_is_the_count_asked_where_layouts_fit(gpt175b, h100):
    """``fewest_gpus_that_fit`` without a known need (after a sampler search, or for estimate's flags)
    searches the count asked first: where layouts fit there it is the count (the sampler then says
    "more --trials", not a count), and otherwise the count grid search names."""
    from autoparallel.search.diagnose import MoreGpus
    space = load_space()
    assert run.fewest_gpus_that_fit(gpt175b, h100, 512, 2048, space, None, None) == MoreGpus(512, None)
    with pytest.raises(UserError) as grid:
        run.search(gpt175b, h100, 8, 2048, space)
    more = run.fewest_gpus_that_fit(gpt175b, h100, 8, 2048, space, None, None)
    assert _fits_on(str(grid.value)).endswith(f"search --gpus {more.gpus}") and more.gpus > 8
