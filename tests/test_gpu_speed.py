"""A family GPU's sustained tensor speed (``Efficiency.gpu_speed``): a factor on the tensor-core
peaks of the GPU it is keyed by (GEMMs, the attention's GEMMs), nothing else; fitted by the dense
calibrate only where the rows pin it."""

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from autoparallel import io
from autoparallel.costmodel import calibrate, gemm
from autoparallel.costmodel import layer_time as lt
from autoparallel.costmodel import stages as st
from autoparallel.costmodel.candidates import candidates
from autoparallel.costmodel.estimate import plan_columns
from autoparallel.specs.hardware import Efficiency, HardwareSpec
from autoparallel.specs.plan import Plan

REL = 1e-12


def _faster(hw, speed, name=None):
    return dataclasses.replace(hw, efficiency=dataclasses.replace(hw.efficiency, gpu_speed={name or hw.name: speed}))


def _cands(model, hw, **knobs):
    base = dict(tp=4, pp=8, vp=2, cp=2, dp=4, mbs=1, gbs=64, sp=True, precision="bf16", recompute="none",
                tp_comm_overlap=False, fp8_bf16_edge_layers=0, grad_reduce_in_fp32=False)
    return candidates(model, hw, plan_columns([Plan(**{**base, **knobs})]))


def test_the_factor_scales_the_gemm_peaks_of_its_own_gpu_only(hw):
    fast = _faster(hw, 1.25)
    assert gemm.bf16_peak(fast) == pytest.approx(1.25 * 989e12, rel=REL)
    for fraction in (0.0, 0.5, 1.0):
        assert gemm.peak(fast, fraction) == pytest.approx(1.25 * gemm.peak(hw, fraction), rel=REL)
    other = _faster(hw, 1.25, name="gb300")  # keyed by another GPU of the family: no effect here
    assert gemm.tensor_speed(other) == 1.0 and gemm.peak(other, 0.5) == gemm.peak(hw, 0.5)
    assert gemm.efficiency(fast, 1e9) == gemm.efficiency(hw, 1e9)  # a peak, not an efficiency


def test_the_factor_speeds_up_the_gemms_and_the_attention_math_not_hbm_or_links(gpt175b, hw):
    fast = _faster(hw, 1.25)
    x, y = _cands(gpt175b, hw, precision="fp8-delayed"), _cands(gpt175b, fast, precision="fp8-delayed")
    assert lt.linear_time(y, 1e9)[0] == pytest.approx(lt.linear_time(x, 1e9)[0] / 1.25, rel=REL)
    assert lt.attention_time(y)[0] == pytest.approx(lt.attention_time(x)[0] / 1.25, rel=REL)  # GEMM-bound on H100
    # The output layer: its GEMMs faster, the loss's passes over the logits (HBM) not.
    logit_gemms = 3 * 2 * 1024 * 12288 * 50304 / 4 / (989e12 * gemm.efficiency(hw, 2 * 1024 * 12288 * 50304 / 4))
    assert st.logits_time(x)[0] - st.logits_time(y)[0] == pytest.approx(logit_gemms * (1 - 1 / 1.25), rel=1e-9)
    # Memory-bound kernels, casts and collectives keep their time.
    unfused_x, unfused_y = (_cands(gpt175b, h, flash_attention=False) for h in (hw, fast))
    assert lt.softmax_time(unfused_y)[0] == lt.softmax_time(unfused_x)[0] > 0
    assert lt.fp8_cast_time(y, False)[0] == lt.fp8_cast_time(x, False)[0] > 0
    dense_x, dense_y = lt.layers(x).dense, lt.layers(y).dense
    for term in ("tp_comm", "fp8_cast", "amax_reduction"):
        assert dense_y[term][0] == dense_x[term][0] > 0, term
    assert dense_y["compute"][0] < dense_x["compute"][0]


def test_the_softmax_exponentials_keep_their_speed(gpt175b, hw):
    # Ten times the tensor cores: the SFUs' exponentials bound the flash attention core instead.
    x = _cands(gpt175b, _faster(hw, 10.0))
    exponentials = 2048 * 2048 * 96 / 2 / 8
    assert lt.attention_time(x)[0] == pytest.approx(exponentials / 4.2e12 / hw.attention_peak_share(x.s_local[0]), rel=REL)


def test_the_router_and_experts_gemms_take_the_factor(hw):
    mixtral = io.load_model("mixtral-8x7b")
    knobs = dict(tp=2, pp=1, vp=1, cp=1, dp=4, ep=4, gbs=16)
    x, y = _cands(mixtral, hw, **knobs), _cands(mixtral, _faster(hw, 1.25), **knobs)
    assert lt.router_time(y)[0][0] == pytest.approx(lt.router_time(x)[0][0] / 1.25, rel=REL)
    assert lt.routed_experts_time(y)[0] == pytest.approx(lt.routed_experts_time(x)[0] / 1.25, rel=REL)


def test_a_negative_or_zero_speed_is_refused():
    with pytest.raises(ValueError, match="gpu_speed"):
        Efficiency(gpu_speed={"gb200": 0.0})


def _rows(counts):
    return [SimpleNamespace(hardware=SimpleNamespace(name=g), software="nemo 25.11", id=f"{g}-{i}")
            for g, n in counts.items() for i in range(n)]


def test_only_gpus_with_enough_rows_beside_enough_donor_rows_get_a_factor():
    assert calibrate.gpu_factors_to_fit(_rows({"b200": 8, "gb200": 6, "gb300": 3}), "b200") == ["gb200", "gb300"]
    assert calibrate.gpu_factors_to_fit(_rows({"b200": 8, "gb200": 6, "gb300": 2}), "b200") == ["gb200"]
    assert calibrate.gpu_factors_to_fit(_rows({"b200": 4, "gb200": 6, "gb300": 3}), "b200") == []
    assert calibrate.gpu_factors_to_fit(_rows({"b200": 8, "gb200": 6}), None) == []


def test_the_fit_recovers_each_pinned_gpus_speed_and_leaves_the_others_out(monkeypatch):
    # Rows whose prediction is gemm_max x the GPU's speed: the donor's rows pin gemm_max (0.6), the
    # GB200 rows its speed (1.1); GB300's two rows are too few: its factor is not fitted, and the
    # one the start held is dropped (its rows priced at the donor's speed, as they run here).
    true_speed = {"b200": 1.0, "gb200": 1.1, "gb300": 1.0}

    def predict(p, eff):
        g = p.hardware.name
        return {"predicted": 1000 * eff.gemm_max * eff.gpu_speed.get(g, 1.0), "measured": 600 * true_speed[g]}
    # The fit reads each row's log error (``measured_runs.log_error``: log of predict_row's predicted / measured).
    monkeypatch.setattr(calibrate, "log_error", lambda p, eff: np.log(predict(p, eff)["predicted"]
                                                                      / predict(p, eff)["measured"]))
    rows = _rows({"b200": 6, "gb200": 3, "gb300": 2})
    result = calibrate.fit(rows, Efficiency(gpu_speed={"gb300": 1.2}), donor="b200")
    assert result.values["gemm_max"] == pytest.approx(0.6, rel=1e-4)
    assert result.values["gpu_speed"] == {"gb200": pytest.approx(1.1, rel=1e-4)}
    assert "gpu gb200" in result.fitted and not result.at_bounds
    # Without the donor named (a fit of one GPU's own rows), no factor.
    assert calibrate.fit(rows, Efficiency(), donor=None).values["gpu_speed"] == {}


def test_the_factors_are_written_and_read_back(tmp_path):
    path = tmp_path / "gpu.yaml"
    path.write_text("name: gpu\nbf16_tflops: 100\nmemory_gib: 80\nhbm_tbps: 2\nnvlink_domain: 8\n"
                    "nvlink_gbps: 600\ninternode_gbps: 25\n")
    calibrate.write_block(path, {"gpu_speed": {"gb200": 1.0234, "gb300": 1.2345}}, Efficiency(), "note", "rows")
    hw = io.from_dict(HardwareSpec, io.read_yaml(path), str(path))
    assert hw.efficiency.gpu_speed == {"gb200": 1.023, "gb300": 1.234}
    assert calibrate.uncalibrated(hw.efficiency).gpu_speed == {}
    assert np.isclose(gemm.tensor_speed(hw), 1.0)  # the donor itself runs at its own speed


def test_calibrate_fits_the_family_gpus_speeds_only_when_asked(capsys):
    # B200's family: 8 B200, 6 GB200 and 3 GB300 rows; the shipped preset holds no speeds, so a
    # plain refit fits none (and validate's folds none), --gpu-speed fits both, off their bounds.
    import json

    from autoparallel import cli
    assert calibrate.speed_donor(io.load_hardware("b200")) is None
    assert calibrate.speed_donor(io.load_hardware("b200"), asked=True) == "b200"
    assert cli.main(["calibrate", "--gpu", "b200", "--gpu-speed", "--dry-run", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    speeds = result["fitted"]["gpu_speed"]
    assert set(speeds) == {"gb200", "gb300"}
    low, high = calibrate.GPU_SPEED_BOUNDS
    assert all(low * 1.01 < v < high / 1.01 for v in speeds.values())
    assert not any(h["name"].startswith("gpu ") for h in result["at_bounds"])
    assert result["after_mean_abs_error_pct"] < result["before_mean_abs_error_pct"]


def test_blackwell_ultra_runs_its_sms_at_their_max_clock_not_its_datasheet_peak():
    """GB200 and GB300 state the same 2.5 PF BF16, but GB300 has 160 SMs to 148 at a max SM clock
    of 2,070 MHz to 2,062 (nvidia-smi captures): each priced at B200's FLOP/s per SM per clock
    (as shipped: GB300's measured speed is off, ``measured_against`` not stated)."""
    b200, gb200, gb300 = (io.load_hardware(g) for g in ("b200", "gb200", "gb300"))
    assert b200.clock_speed == 1.0 and gemm.tensor_speed(b200) == 1.0  # the donor itself
    assert gb300.measured_against == "" and gb300.measured_fp8_gemm_tflops == 3286.3
    per_sm_clock = 2250e12 / (148 * 1965e6)
    assert gemm.bf16_peak(gb200) == pytest.approx(per_sm_clock * 148 * 2062e6, rel=REL)
    assert gemm.bf16_peak(gb300) == pytest.approx(per_sm_clock * 160 * 2070e6, rel=REL)
    assert gemm.bf16_peak(gb300) / gemm.bf16_peak(gb200) == pytest.approx(160 * 2070 / (148 * 2062), rel=REL)
    assert 1.08 < gemm.bf16_peak(gb300) / gemm.bf16_peak(gb200) < 1.09
    assert gemm.bf16_peak(gb200) < 2500e12 < gemm.bf16_peak(gb300)
    # Every tensor peak moves by the same factor; the FP4 peaks, both held to the measured 1.81x FP8
    # (gemm.fp4_tflops), keep no datasheet 1.5x of Blackwell Ultra's.
    assert gemm.peak(gb300, 1.0, fp4=True) / gemm.peak(gb200, 1.0, fp4=True) == pytest.approx(
        160 * 2070 / (148 * 2062), rel=REL)
    # No clock stated (B300, the Hopper family): the datasheet peaks.
    assert io.load_hardware("b300").clock_speed == 1.0 and io.load_hardware("h200").clock_speed == 1.0
    # A fitted factor wins over the clock rule.
    fitted = dataclasses.replace(gb300, efficiency=dataclasses.replace(gb300.efficiency, gpu_speed={"gb300": 1.2}))
    assert gemm.tensor_speed(fitted) == 1.2


def _gb300_measured(tmp_path, against="gb200", name="gb300m"):
    """GB300's preset with its measured speed switched on (``measured_against`` stated)."""
    text = Path(io.resolve_preset("hardware", "gb300")).read_text().replace("name: gb300", f"name: {name}")
    path = tmp_path / f"{name}.yaml"
    path.write_text(text.replace("# measured_against: gb200", f"measured_against: {against}"))
    return path


def test_gb300_measured_against_gb200_runs_at_their_measured_sustained_gemm_ratio(tmp_path):
    """GB200 and GB300 state the same 5 PF FP8 (2.5 PF BF16); the same cuBLASLt FP8 8192^3 GEMM after
    10,000 warm-up iterations sustains 3,286.3 TFLOP/s on GB300 and 2,781.5 on GB200 (Azure's
    AI-benchmarking-guide): switched on, every GB300 tensor peak is GB200's x 1.18, not x 1.085."""
    gb200, gb300 = io.load_hardware("gb200"), io.load_hardware(str(_gb300_measured(tmp_path)))
    measured = 3286.3 / 2781.5
    assert gemm.tensor_speed(gb300) == pytest.approx(gemm.tensor_speed(gb200) * measured, rel=REL)
    assert gemm.bf16_peak(gb300) / gemm.bf16_peak(gb200) == pytest.approx(measured, rel=REL)
    assert gemm.peak(gb300, 1.0) / gemm.peak(gb200, 1.0) == pytest.approx(measured, rel=REL)
    assert gemm.peak(gb300, 1.0, fp4=True) / gemm.peak(gb200, 1.0, fp4=True) == pytest.approx(measured, rel=REL)
    assert measured > 1.15 > 160 * 2070 / (148 * 2062)  # not the clock rule's ratio
    # HBM, links and the SFUs keep their figures.
    shipped = io.load_hardware("gb300")
    assert (gb300.hbm_tbps, gb300.nvlink_gbps, gb300.exp_tera_per_s) == (shipped.hbm_tbps, shipped.nvlink_gbps,
                                                                           shipped.exp_tera_per_s)
    # A fitted factor still wins.
    fitted = dataclasses.replace(gb300, efficiency=dataclasses.replace(gb300.efficiency, gpu_speed={gb300.name: 1.2}))
    assert gemm.tensor_speed(fitted) == 1.2


def test_cdna3_runs_at_the_sustained_fp8_gemm_rate_measured_against_the_h100():
    """Azure's AI-benchmarking-guide, FP8 8192^3 GEMM after 10,000 warm-up iterations: hipBLASLt on
    ND MI300X v5 1,222.9 TFLOP/s, cuBLASLt on ND H100 v5 1,290.1. The MI300X's datasheet FP8 peak
    is 2,614.9 to the H100's 1,979 (1.32x), measured 0.948x: every MI300X tensor peak x 0.717 of the
    datasheet, at the H100's constants (the H100, the donor, at speed 1). AMD's own hipBLASLt FP8
    max-achievable FLOPs: MI325X 1,519, MI300X 1,273 (1.19x) at the same 2.1 GHz datasheet peak."""
    h100, mi300x, mi325x = (io.load_hardware(g) for g in ("h100-sxm", "mi300x", "mi325x"))
    assert h100.clock_speed == 1.0 and gemm.tensor_speed(h100) == 1.0
    mi300x_speed = (1222.9 / 1290.1) / (2614.9 / 1979)
    assert 0.717 < mi300x_speed < 0.718
    assert gemm.tensor_speed(mi300x) == pytest.approx(mi300x_speed, rel=REL)
    # The sustained FP8 peaks stand as the measured rates do (the same fitted FP8 share on both).
    assert gemm.peak(mi300x, 1.0) / gemm.peak(h100, 1.0) == pytest.approx(1222.9 / 1290.1, rel=REL)
    mi325x_speed = mi300x_speed * 1519 / 1273
    assert 0.855 < mi325x_speed < 0.857
    assert gemm.tensor_speed(mi325x) == pytest.approx(mi325x_speed, rel=REL)
    assert gemm.peak(mi325x, 1.0) / gemm.peak(mi300x, 1.0) == pytest.approx(1519 / 1273, rel=REL)
    # No CDNA 4 rate measured beside a reference's: the datasheet peaks.
    assert io.load_hardware("mi350x").clock_speed == io.load_hardware("mi355x").clock_speed == 1.0


def test_cdna3_bf16_gemms_run_at_the_sustained_bf16_rate_measured_against_the_h100():
    """One benchmark measured both GPUs' BF16 GEMMs (Stas Bekman's Maximum Achievable Matmul FLOPS table,
    torch.matmul): MI300X 668.4 TFLOP/s, H100 SXM 794.5, 0.841x at a datasheet ratio of 1,307.4 / 989:
    the MI300X's BF16 peak x 0.636, where Azure's FP8 pair gives its FP8 peaks 0.717. The MI325X over the
    MI300X in BF16 from AMD's max-achievable FLOPs table: 843 / 708. The FP8 peaks, the H100 and every
    other preset keep the one speed."""
    h100, mi300x, mi325x = (io.load_hardware(g) for g in ("h100-sxm", "mi300x", "mi325x"))
    fp8_speed = (1222.9 / 1290.1) / (2614.9 / 1979)
    bf16_speed = (668.4 / 794.5) / (1307.4 / 989)
    assert 0.636 < bf16_speed < 0.637
    assert mi300x.bf16_clock_speed == pytest.approx(bf16_speed, rel=REL)
    assert gemm.bf16_speed(mi300x) == pytest.approx(bf16_speed, rel=REL)
    assert gemm.bf16_peak(mi300x) / gemm.bf16_peak(h100) == pytest.approx(668.4 / 794.5, rel=REL)
    assert gemm.tensor_speed(mi300x) == pytest.approx(fp8_speed, rel=REL)  # FP8 unchanged
    assert gemm.peak(mi300x, 1.0) / gemm.peak(h100, 1.0) == pytest.approx(1222.9 / 1290.1, rel=REL)
    # A Linear half in BF16: time adds, each half at its own measured speed.
    half = 1.0 / (0.5 / gemm.peak(mi300x, 1.0) + 0.5 / (1307.4e12 * bf16_speed))
    assert gemm.peak(mi300x, 0.5) == pytest.approx(half, rel=REL)
    assert gemm.bf16_peak(mi325x) == pytest.approx(1307.4e12 * bf16_speed * 843 / 708, rel=REL)
    assert gemm.tensor_speed(mi325x) == pytest.approx(fp8_speed * 1519 / 1273, rel=REL)
    # BF16 attention's GEMMs take the BF16 speed, FP8 attention's the FP8 one (layer_time.attention_time).
    for name in ("h100-sxm", "h200", "b200", "gb200", "gb300", "mi350x", "mi355x"):
        g = io.load_hardware(name)
        assert g.bf16_clock_speed is None and gemm.bf16_speed(g) == gemm.tensor_speed(g)
    fitted = dataclasses.replace(mi300x, efficiency=dataclasses.replace(mi300x.efficiency, gpu_speed={"mi300x": 0.8}))
    assert gemm.bf16_speed(fitted) == 0.8  # a fitted factor still wins


def test_cdna3_hbm_runs_at_the_share_of_its_datasheet_a_stream_benchmark_measured_beside_the_h100():
    """Azure's BabelStream Triad: ND MI300X v5 4.10 TB/s of a 5.3 TB/s datasheet, ND H100 v5 2.97 of 3.35.
    The H100's fitted hbm efficiency (0.7) read at the MI300X's datasheet figure would give it 77 / 89 of
    that share too much: its achievable bandwidth is the H100's x 4.10 / 2.97, i.e. 3.35 x 0.7 x 4.10 /
    2.97 = 3.237 TB/s, not 5.3 x 0.7 = 3.71. No benchmark measured the MI325X's HBM beside a reference:
    its datasheet 6 TB/s x 0.7, as every other preset."""
    h100, mi300x, mi325x = (io.load_hardware(g) for g in ("h100-sxm", "mi300x", "mi325x"))
    speed = (4.10 / 2.97) / (5.3 / 3.35)
    assert 0.872 < speed < 0.873
    assert mi300x.hbm_speed == pytest.approx(speed, rel=REL)
    model = io.load_model("llama2-70b")
    x_mi300x, x_h100, x_mi325x = (_cands(model, g, tp=1, pp=1, vp=1, cp=1, dp=8, sp=False, gbs=8)
                                  for g in (mi300x, h100, mi325x))
    assert x_mi300x.hbm == pytest.approx(3.35e12 * 0.7 * 4.10 / 2.97, rel=REL)
    assert 3.237e12 < x_mi300x.hbm < 3.238e12
    assert x_mi300x.hbm / x_h100.hbm == pytest.approx(4.10 / 2.97, rel=REL)
    assert x_mi325x.hbm == pytest.approx(6.0e12 * 0.7, rel=REL) and mi325x.hbm_speed == 1.0
    # An HBM-bound term follows it: the norm recompute's bytes over the bandwidth, 1 / 0.873 longer.
    slow = lt.norm_recompute_time(x_mi300x)
    fast = lt.norm_recompute_time(_cands(model, dataclasses.replace(mi300x, hbm_speed=1.0), tp=1, pp=1, vp=1,
                                         cp=1, dp=8, sp=False, gbs=8))
    assert float(slow[0] / fast[0]) == pytest.approx(1.0 / speed, rel=1e-9)
    # The tensor speeds are not the HBM's.
    assert gemm.tensor_speed(mi300x) == pytest.approx((1222.9 / 1290.1) / (2614.9 / 1979), rel=REL)
    for name in ("h100-sxm", "h200", "b200", "gb200", "gb300", "mi350x", "mi355x"):
        assert io.load_hardware(name).hbm_speed == 1.0


@pytest.mark.parametrize("measured, derived", [("measured_bf16_gemm_tflops", "bf16_clock_speed"),
                                               ("measured_hbm_tbps", "hbm_speed")])
def test_a_measured_speed_needs_a_reference_and_its_figure(tmp_path, measured, derived):
    """A measured figure with no preset beside it (``io.MEASURED_FIELDS``), or whose reference states no
    figure of its own (``specs.hardware.measured_ratio``), is refused; the speed it derives is never stated."""
    text = Path(io.resolve_preset("hardware", "mi300x")).read_text()

    def preset(name, drop=(), add=""):
        path = tmp_path / f"{name}.yaml"
        path.write_text("\n".join(line for line in text.replace("name: mi300x", f"name: {name}").splitlines()
                                  if not line.startswith(drop)) + "\n" + add)
        return str(path)

    # The figures the loader checks before this one go too, so that this one is the first refused.
    earlier = tuple(io.MEASURED_FIELDS.values())[:tuple(io.MEASURED_FIELDS.values()).index(measured)]
    with pytest.raises(io.SpecError, match=f"{measured} needs measured_against"):
        io.load_hardware(preset("mi300y", ("measured_against", "measured_fp8_gemm_tflops", *earlier)))
    reference = "measured_reference_" + measured.removeprefix("measured_")  # the H100 states none of its own
    with pytest.raises(io.SpecError, match=f"both must state {measured}"):
        io.load_hardware(preset("mi300z", (reference,)))
    with pytest.raises(io.SpecError, match=f"{derived} is derived"):
        io.load_hardware(preset("mi300w", add=f"{derived}: 0.7\n"))
    with pytest.raises(ValueError, match=measured):
        dataclasses.replace(io.load_hardware("mi300x"), **{measured: 0})


def test_serving_prices_the_datasheet_peaks_at_the_harness_clock_not_the_measured_speed():
    """The serving cost model's peaks are the datasheet's (its fitted shares hold the sustained rate,
    for every GPU): AMD's held-out MLPerf Inference rows scale them by the GFX clock the harness locks
    (serve/mlperf.py gfx_clock), never also by the training side's measured speed; the measured speed
    only caps a lock above it (serve/mlperf.py matrix_clock: tests/serve/test_serve_mlperf_amd.py)."""
    from autoparallel.costmodel import inference
    from autoparallel.serve import mlperf
    mi300x = io.load_hardware("mi300x")
    assert mi300x.clock_speed < 1.0
    assert float(inference.quantized_gemm_peak(mi300x, 1.0)) == 2614.9e12
    locked = mlperf.gfx_clock(mi300x, 1400)
    assert locked.fp8_tflops == pytest.approx(2614.9 * 1400 / 2100, rel=REL)
    assert float(inference.quantized_gemm_peak(locked, 1.0)) == pytest.approx(2614.9e12 * 1400 / 2100, rel=REL)


def test_a_measured_speed_needs_both_figures_and_a_shared_donor(tmp_path):
    # measured against H100: neither the donor (B200) nor a GPU on its constants
    with pytest.raises(io.SpecError, match="must be the efficiency_from donor"):
        io.load_hardware(str(_gb300_measured(tmp_path, against="h100-sxm", name="gb300x")))
    # the donor itself may be the reference, but B200 states no measured rate
    with pytest.raises(io.SpecError, match="both must state measured_fp8_gemm_tflops"):
        io.load_hardware(str(_gb300_measured(tmp_path, against="b200", name="gb300z")))
    gb200 = Path(io.resolve_preset("hardware", "gb200")).read_text()
    (tmp_path / "gb200.yaml").write_text("\n".join(line for line in gb200.splitlines()
                                                   if not line.startswith("measured_fp8_gemm_tflops")) + "\n")
    with pytest.raises(io.SpecError, match="both must state measured_fp8_gemm_tflops"):
        io.load_hardware(str(_gb300_measured(tmp_path, against="gb200.yaml", name="gb300y")))
    with pytest.raises(ValueError, match="measured_fp8_gemm_tflops"):
        dataclasses.replace(io.load_hardware("gb300"), measured_fp8_gemm_tflops=0)
    with pytest.raises(ValueError, match="measured_reference_fp8_gemm_tflops"):
        dataclasses.replace(io.load_hardware("mi325x"), measured_reference_fp8_gemm_tflops=-1)


def _preset_stating(tmp_path, preset: str, line: str):
    """A copy of a hardware preset (named ``<preset>x``) with ``line`` added: a derived key stated."""
    text = Path(io.resolve_preset("hardware", preset)).read_text()
    path = tmp_path / f"{preset}x.yaml"
    path.write_text(text.replace(f"name: {preset}", f"name: {preset}x") + line + "\n")
    return path


def test_clock_speed_is_derived_never_stated(tmp_path):
    with pytest.raises(io.SpecError, match="clock_speed is derived"):
        io.load_hardware(str(_preset_stating(tmp_path, "gb300", "clock_speed: 1.5")))
    with pytest.raises(ValueError, match="max_sm_clock_mhz"):
        dataclasses.replace(io.load_hardware("gb300"), max_sm_clock_mhz=0)


def test_the_nvfp4_gemm_is_priced_at_the_measured_fp4_over_fp8_ratio_not_the_datasheet_one():
    """TransformerEngine's B300 GEMM table (pre-quantized, one 5B-model layer): FP8 current
    scaling 6.812 ms, NVFP4 3.764 ms, 1.81x. The datasheet FP4 peak is capped at that ratio
    times the FP8 one: B300 3x (13.5 PF) -> 8.14 PF; B200 2x (9 PF) -> 8.14 PF; a GPU whose
    datasheet ratio is under 1.81 keeps its figure; one with no FP4 figure takes its FP8 one."""
    b200, b300, gb300 = (io.load_hardware(g) for g in ("b200", "b300", "gb300"))
    assert gemm.NVFP4_OVER_FP8_GEMM == pytest.approx(1.8098, abs=1e-4)
    assert gemm.fp4_tflops(b300) == pytest.approx(4500 * 6.812 / 3.764, rel=REL)  # 8144, not 13500
    assert gemm.fp4_tflops(b200) == pytest.approx(4500 * 6.812 / 3.764, rel=REL)
    assert gemm.fp4_tflops(gb300) == pytest.approx(5000 * 6.812 / 3.764, rel=REL)
    low = dataclasses.replace(b200, fp4_tflops=1.5 * 4500)
    assert gemm.fp4_tflops(low) == 1.5 * 4500
    assert gemm.fp4_tflops(dataclasses.replace(b200, fp4_tflops=None)) == 4500
    # The NVFP4 peak on B300 is now 1.81x its FP8 peak (B300 states no clock: speed 1).
    assert gemm.peak(b300, 1.0, fp4=True) / gemm.peak(b300, 1.0) == pytest.approx(6.812 / 3.764, rel=REL)


AZURE_FP8_8192 = 1222.9 / 1290.1  # the shape measured_fp8_gemm_tflops is read at: m = n = k = 8192, 1.10 TFLOP


def test_cdna3_fp8_gemms_run_at_the_ratio_measured_at_their_own_size(gpt175b):
    """Azure's hipBLASLt / cuBLASLt FP8 GEMMs (ND MI300X v5 / ND H100 v5): 0.948x at 8192^3 (1.10 TFLOP),
    0.850x at 6144 x 12288 x 12288 (1.86), 0.785x at 16384^3 (8.80), 0.827x at 32768^3 (70.4). An MI300X FP8
    GEMM runs at the H100's rate at its size times the measured ratio there: exactly at a measured shape,
    linear in log(FLOPs) between two, the end ratio beyond the last; below 8192^3 at 8192^3's (the smaller
    shapes' single runs are listed in mi300x.yaml, not priced)."""
    h100, mi300x, mi325x = (io.load_hardware(g) for g in ("h100-sxm", "mi300x", "mi325x"))
    f8192, f16384, f32768 = (2.0 * n ** 3 for n in (8192, 16384, 32768))
    f6144 = 2.0 * 6144 * 12288 * 12288
    assert gemm.size_speed(mi300x, f8192) == pytest.approx(1.0, rel=REL)
    assert gemm.size_speed(mi300x, f16384) == pytest.approx((1081.4 / 1377.3) / AZURE_FP8_8192, rel=REL)
    # Between 6144 x 12288^2 and 16384^3, at 3.5 TFLOP (the LoRA rows' mean Linear GEMM), by hand:
    # t = ln(3.5e12 / 1.8554e12) / ln(8.7961e12 / 1.8554e12) = 0.4078; ratio 0.8500 - 0.4078 x 0.0648 = 0.8236.
    t = np.log(3.5e12 / f6144) / np.log(f16384 / f6144)
    assert 0.4078 < t < 0.4079
    between = 1148.7 / 1351.4 + t * (1081.4 / 1377.3 - 1148.7 / 1351.4)
    assert 0.823 < between < 0.824
    assert gemm.size_speed(mi300x, 3.5e12) == pytest.approx(between / AZURE_FP8_8192, rel=1e-12)
    # Held beyond the measured shapes, vectorised.
    ends = gemm.size_speed(mi300x, np.array([1e6, 1e15]))
    assert ends == pytest.approx([1.0, (1142.4 / 1382.2) / AZURE_FP8_8192], rel=REL)
    # On top of the H100's own curve: the FP8 peaks at a size stand as the measured rates there.
    for flops, ratio in ((f8192, AZURE_FP8_8192), (f16384, 1081.4 / 1377.3), (3.5e12, between),
                         (f32768 * 10, 1142.4 / 1382.2), (2.0 * 1024 ** 3, AZURE_FP8_8192)):
        assert gemm.peak(mi300x, 1.0, gemm_flops=flops) / gemm.peak(h100, 1.0, gemm_flops=flops) == pytest.approx(
            ratio, rel=REL)
    # BF16 GEMMs keep their own measured speed at every size (no BF16 GEMM was measured on both).
    assert gemm.peak(mi300x, 0.0, gemm_flops=f16384) == pytest.approx(gemm.bf16_peak(mi300x), rel=REL)
    # The MI325X, measured against the MI300X at one figure, takes the MI300X's curve times 1,519 / 1,273.
    assert mi325x.fp8_gemm_size_speed == mi300x.fp8_gemm_size_speed
    assert gemm.peak(mi325x, 1.0, gemm_flops=3.5e12) / gemm.peak(mi300x, 1.0, gemm_flops=3.5e12) == pytest.approx(
        1519 / 1273, rel=REL)
    # A Linear's time reads the curve at its GEMMs' size (all layers FP8: the whole time / the factor).
    flat = dataclasses.replace(mi300x, fp8_gemm_size_speed=())
    x, y = (_cands(gpt175b, h, precision="fp8-delayed") for h in (mi300x, flat))
    size = 2.0 * x.tokens[0] * 1e9 / x.t[0] / lt.GEMMS_PER_LAYER
    assert lt.linear_time(x, 1e9)[0] == pytest.approx(lt.linear_time(y, 1e9)[0] / gemm.size_speed(mi300x, size),
                                                      rel=1e-12)


def test_presets_with_one_measured_figure_keep_one_speed_at_every_size(tmp_path, gpt175b):
    """Every preset but the MI300X and the one measured against it (the MI325X) states one FP8 figure or none:
    its GEMMs at one speed whatever their size, the GEMM peak the candidates hold, bit for bit; GB300's
    measured speed switched on as well."""
    sizes = np.array([1e9, 1.1e12, 3.5e12, 1e14])
    names = sorted(io.preset_files("hardware", shipped_only=True))
    gb300_on = io.load_hardware(str(_gb300_measured(tmp_path)))
    for hw in [io.load_hardware(n) for n in names if n not in ("mi300x", "mi325x")] + [gb300_on]:
        assert hw.fp8_gemm_size_speed == () and not hw.measured_fp8_gemm_shapes, hw.name
        assert gemm.size_speed(hw, sizes) == 1.0
        for q in (0.0, 0.5, 1.0):
            assert np.all(gemm.peak(hw, q, gemm_flops=sizes) == gemm.peak(hw, q)), hw.name
    x = _cands(gpt175b, io.load_hardware("h100-sxm"), precision="fp8-delayed")
    assert lt.sized_peak(x, 3.5e12) is x.gemm_peak


def test_a_measured_size_curve_is_stated_as_shapes_beside_a_reference(tmp_path):
    text = Path(io.resolve_preset("hardware", "mi300x")).read_text().replace("name: mi300x", "name: mi300q")
    derived = tmp_path / "mi300q.yaml"
    derived.write_text(text + "fp8_gemm_size_speed: [[1e12, 1.0]]\n")
    with pytest.raises(io.SpecError, match="fp8_gemm_size_speed is derived"):
        io.load_hardware(str(derived))
    alone = tmp_path / "mi300r.yaml"
    drop = ("measured_against", "measured_bf16_gemm_tflops", "measured_hbm_tbps")
    alone.write_text("\n".join(ln for ln in text.replace("name: mi300q", "name: mi300r").splitlines()
                               if not ln.startswith(drop)) + "\n")
    with pytest.raises(io.SpecError, match="measured_fp8_gemm_shapes needs measured_against"):
        io.load_hardware(str(alone))
    with pytest.raises(ValueError, match=r"\[m, n, k, TFLOP/s, reference TFLOP/s\]"):
        dataclasses.replace(io.load_hardware("mi300x"), measured_fp8_gemm_shapes=((8192, 8192, 8192, 1222.9),))


# cuDNN's fused attention, BF16, causal, head dim 128: tokens -> forward + backward ms. B200 cuDNN 9.10.2,
# batch 1 x 128 query heads (b200.yaml; NVIDIA/cudnn-frontend f937055 sdpa_benchmark_results_NVIDIA_B200.csv),
# whose CUDA events take 0.130 + 0.494 ms at 512 tokens (PyTorch's host dispatch); H200 cuDNN 9.19 kernel
# times, batch 1 x 64 (h100-sxm.yaml; 3929da2 h200_919_only_cudnn).
CUDNN_B200_MS = {2048: 0.262 + 0.895, 4096: 0.613 + 1.938, 8192: 1.816 + 5.815, 16384: 6.475 + 20.466,
                 32768: 24.518 + 77.677, 65536: 98.489 + 327.462, 131072: 417.410 + 1355.987}
B200_HOST_MS = 0.130 + 0.494
CUDNN_H200_MS = {2048: 0.142 + 0.464, 4096: 0.465 + 1.450, 8192: 1.708 + 5.083, 16384: 6.531 + 19.002,
                 32768: 25.566 + 75.688}


def _ps(table, heads, tokens, host_ms=0.0):
    return (table[tokens] - host_ms) * 1e-3 / (heads * tokens**2 / 2) * 1e12


def test_attention_takes_cudnns_measured_time_per_score_by_sequence_length():
    """b200.yaml states cuDNN 9.10.2's fused attention on B200 at 2,048 to 131,072 tokens (BF16, causal, head
    dim 128), less the 0.624 ms its 512-token row takes (the host dispatch its CUDA events enclose): 1.99 ps
    per causal score forward + backward at 2,048, 1.63 at 8,192; h100-sxm.yaml cuDNN 9.19's kernel times on
    H200 (H100's SMs): 4.52 and 3.16. The attention core is priced at the share of peak each implies, at the
    sequence length a CP rank's kernel runs (s / cp), the time per score read between the measured lengths
    in log(tokens) and held beyond them, on every GPU that takes those constants; the fitted
    ``efficiency.attention`` no longer moves it (so the dense fit does not see it), and stays in use at every
    length where no measurement is stated (A100)."""
    for name, table, heads, host, peak, exps in (("b200", CUDNN_B200_MS, 128, B200_HOST_MS, 2250e12, 5.0e12),
                                                 ("h100-sxm", CUDNN_H200_MS, 64, 0.0, 989e12, 4.2e12)):
        hw = io.load_hardware(name)
        assert hw.measured_attention_host_ms == pytest.approx(host, rel=REL), name
        bound = 3 * max(2 * 2 * 128 / peak, 1 / exps)
        assert [t for t, _ in hw.attention_efficiency] == sorted(table), name
        for tokens, share in hw.attention_efficiency:
            assert share == pytest.approx(bound / (_ps(table, heads, tokens, host) * 1e-12), rel=REL), (name, tokens)
        # Between two rows the time per score is linear in log(tokens); outside them, the end row's.
        mid = bound / ((_ps(table, heads, 2048, host) + _ps(table, heads, 4096, host)) / 2 * 1e-12)
        assert hw.attention_peak_share(2048 * 2**0.5) == pytest.approx(mid, rel=1e-9), name
        assert hw.attention_peak_share(1024) == hw.attention_peak_share(2048) < hw.attention_peak_share(4096), name
        longest = max(table)
        assert hw.attention_peak_share(4 * longest) == hw.attention_peak_share(longest), name
    assert _ps(CUDNN_B200_MS, 128, 2048, B200_HOST_MS) == pytest.approx(1.986, abs=5e-4)
    assert _ps(CUDNN_B200_MS, 128, 8192, B200_HOST_MS) == pytest.approx(1.631, abs=5e-4)
    assert _ps(CUDNN_H200_MS, 64, 8192) == pytest.approx(3.162, abs=5e-4)
    b200 = io.load_hardware("b200")
    for name in ("gb200", "gb300", "b300"):
        assert io.load_hardware(name).attention_efficiency == b200.attention_efficiency, name
    assert io.load_hardware("h200").attention_efficiency == io.load_hardware("h100-sxm").attention_efficiency
    a100 = io.load_hardware("a100-sxm-80g")
    assert a100.attention_efficiency == () and a100.attention_peak_share(2048) == a100.efficiency.attention
    # B200, Llama 2 70B (head dim 128), TP1, mbs 1: forward + backward = the measured time per causal score
    # at the kernel's length, 8,192 tokens at cp 1 and 4,096 a rank at cp 2 of the same sequence.
    llama = dataclasses.replace(io.load_model("llama2-70b"), seq_length=8192)
    x = _cands(llama, b200, tp=1, pp=1, vp=1, cp=1, dp=8, gbs=8)
    scores = llama.num_attention_heads * llama.seq_length**2 / 2
    per_score = {t: _ps(CUDNN_B200_MS, 128, t, B200_HOST_MS) * 1e-12 for t in (4096, 8192)}
    assert 3 * lt.attention_time(x)[0] == pytest.approx(scores * per_score[8192], rel=REL)
    halves = _cands(llama, b200, tp=1, pp=1, vp=1, cp=2, dp=4, gbs=8)
    assert 3 * lt.attention_time(halves)[0] == pytest.approx(scores / 2 * per_score[4096], rel=REL)
    refitted = dataclasses.replace(b200, efficiency=dataclasses.replace(b200.efficiency, attention=0.9))
    assert lt.attention_time(_cands(llama, refitted, tp=1, pp=1, vp=1, cp=1, dp=8, gbs=8))[0] == lt.attention_time(x)[0]


def test_the_attention_share_is_derived_never_stated(tmp_path):
    with pytest.raises(io.SpecError, match="attention_efficiency is derived"):
        io.load_hardware(str(_preset_stating(tmp_path, "b200", "attention_efficiency: 0.5")))
    with pytest.raises(ValueError, match=r"\[batch, tokens, query heads, forward ms, backward ms\]"):
        dataclasses.replace(b200 := io.load_hardware("b200"), measured_attention_ms=((1, 2048, 128, 0.262),))
    with pytest.raises(io.SpecError, match="two rows of the same tokens"):
        io.load_hardware(str(_preset_stating(tmp_path, "b200", "measured_attention_ms: [[1, 2048, 128, 0.262, 0.895],"
                                                               " [2, 2048, 64, 0.262, 0.895]]")))
    with pytest.raises(ValueError, match="measured_attention_host_ms must be >= 0 and below"):
        dataclasses.replace(b200, measured_attention_host_ms=1.157)  # the 2,048-token row's whole time
    assert b200.attention_efficiency
