"""One GPU type and the network around it, as datasheet peaks plus fitted efficiencies.

Peaks come from datasheets (DESIGN.md §4). What a real job achieves is lower and is described
by the calibrated constants in ``Efficiency``: they are fitted by ``autoparallel calibrate`` and
stored in the hardware YAML with a comment naming the data they came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from autoparallel.specs.names import check_name


@dataclass(frozen=True)
class Efficiency:
    """Fitted fractions of peak; the defaults are uncalibrated first guesses."""

    # GEMM efficiency = gemm_max / (1 + gemm_half_gflop / gemm_gflop): small per-GPU GEMMs
    # (high TP, small micro-batch) reach a smaller fraction of peak.
    gemm_max: float = 0.75
    gemm_half_gflop: float = 5.0
    # FP8 GEMMs reach a smaller fraction of their (doubled) peak than BF16 GEMMs do.
    fp8_gemm_relative: float = 1.0
    # Attention core (flash or fused softmax) as a fraction of the BF16 peak.
    attention: float = 0.45
    # Memory-bound kernels (norms, activations, casts, optimizer) as a fraction of HBM bandwidth.
    hbm: float = 0.7
    # Bytes of elementwise HBM traffic per token and hidden unit in one layer's forward pass.
    elementwise_bytes_per_token_hidden: float = 60.0
    # Achieved fraction of link bandwidth for large collectives (NCCL bus bandwidth / peak).
    nvlink: float = 0.75
    internode: float = 0.8
    # Fraction of DP gradient reduce / param gather traffic hidden behind compute when overlapped,
    # and of TP traffic hidden when TP communication overlap (userbuffers) is on.
    dp_overlap: float = 0.9
    tp_overlap: float = 0.8
    cp_overlap: float = 0.7
    # Fraction of pipeline point-to-point traffic hidden when the schedule is interleaved.
    pp_overlap: float = 0.5
    # Fixed CPU / launch overhead per micro-batch per layer (seconds); CUDA graphs remove it.
    layer_overhead_s: float = 30e-6
    # Fixed cost of one training step outside the pipeline schedule (seconds): Megatron's
    # train_step zeroes the gradient buffers, syncs the gradient norm and the loss over every rank
    # (the host waits for the slowest), launches the optimizer's multi-tensor kernels and runs the
    # host loop (timers, logging, the next batch) while the GPU queue is empty.
    step_overhead_s: float = 0.0
    # Mixture of experts (``costmodel.moe``): the share of link bandwidth an expert-parallel
    # all-to-all reaches; the share of it the 1F1B all-to-all overlap can hide; the relative
    # spread of an EP rank's routed tokens under dropless routing; the host's time to issue one call
    # per local expert (``layer_time.moe_expert_calls``: TransformerEngine's GroupedLinear runs one
    # cuBLAS GEMM per expert, and under a quantized recipe one quantize per expert, each from
    # Python), which the GPU waits for in the forward of a plain schedule and in both passes under
    # the 1F1B all-to-all overlap (``layer_time.combined_host_stall``), on top of
    # ``layer_overhead_s``. The experts' GEMMs themselves run at the dense GEMM efficiency
    # (``gemm_max`` / ``gemm_half_gflop``) of one expert's GEMM.
    alltoall: float = 0.6
    ep_overlap: float = 0.8
    moe_load_imbalance: float = 0.1
    moe_expert_call_s: float = 30e-6
    # Speed of older software releases relative to the newest one the constants were fitted on
    # (NeMo container -> factor on throughput): the same layout runs faster release by release,
    # so the constants describe the newest release and the validation scales the older rows.
    release_speed: dict[str, float] = field(default_factory=dict)
    # Sustained tensor-core speed of the other GPUs that take these constants (``efficiency_from``)
    # relative to the GPU they belong to (preset name -> factor on the BF16 / FP8 / FP4 peaks of
    # the GEMMs and of the attention's GEMMs; not HBM, not links, not the SFUs): the same datasheet
    # peak runs at the clocks each GPU's power limit sustains (GB300 1.4 kW, GB200 1.2 kW, B200 1 kW).
    gpu_speed: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Reached fractions of a peak: above 1 (or 0, which divides) would be a faster-than-peak
        # GPU. Hidden fractions of traffic may be 0 (nothing hidden) up to 1 (all of it).
        for key in ("gemm_max", "fp8_gemm_relative", "attention", "hbm", "nvlink", "internode"):
            if not 0 < getattr(self, key) <= 1:
                raise ValueError(f"efficiency.{key} must be in (0, 1], got {getattr(self, key)}")
        for key in ("dp_overlap", "tp_overlap", "cp_overlap", "pp_overlap"):
            if not 0 <= getattr(self, key) <= 1:
                raise ValueError(f"efficiency.{key} must be in [0, 1], got {getattr(self, key)}")
        for key in ("release_speed", "gpu_speed"):
            for name, value in getattr(self, key).items():
                if not value > 0:
                    raise ValueError(f"efficiency.{key}[{name!r}] must be positive, got {value}")


# The links a hardware preset's ``scale_up_link`` can name, as `autoparallel hardware` prints them.
SCALE_UP_LINKS = {"nvlink": "NVLink", "pcie": "PCIe", "host": "host", "xgmi": "xGMI"}
# The links that join a domain as a direct full mesh, no switch: AMD Instinct's Infinity Fabric
# (xGMI), one link from each GPU to each of the other ``nvlink_domain - 1`` (``comm.scale_up_bandwidth``).
MESH_LINKS = ("xgmi",)


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    bf16_tflops: float
    memory_gib: float
    hbm_tbps: float
    nvlink_domain: int  # GPUs that share one NVLink / NVSwitch domain
    nvlink_gbps: float  # per GPU, bidirectional datasheet figure (GB/s)
    internode_gbps: float  # per GPU, unidirectional (GB/s): 400 Gb/s NDR = 50 GB/s
    fp8_tflops: float | None = None
    # GPUs in one host (what torchrun's --nproc-per-node and NeMo's devices count); not the NVLink
    # domain: a GB200 NVL72 rack is one domain of 18 trays with 4 GPUs each.
    gpus_per_node: int = 8
    fp4_tflops: float | None = None
    # The highest SM clock the board runs (MHz; nvidia-smi -q's max_clocks sm_clock). Where a GPU
    # that takes another's constants (``efficiency_from``) and its donor both state it, the GPU's
    # tensor cores run at the donor's FLOP/s per SM per clock (``clock_limited_speed``): SMs x that
    # clock set the tensor peak, not a datasheet figure quoted at whatever clock each product's
    # sheet chose (B200 2.25 PF BF16 is 148 SMs x 8,192 FLOP/clk at 1.86 GHz, GB200 2.5 PF the same
    # SMs at 2.06 GHz, GB300 2.5 PF 160 SMs at 1.91 GHz; their max clocks 1,965 / 2,062 / 2,070 MHz).
    max_sm_clock_mhz: float | None = None
    # Sustained FP8 GEMM throughput a published benchmark measured (TFLOP/s; cuBLASLt on a large square
    # GEMM after a long warm-up, so at the clocks the power limit holds, not the boost clock), and the
    # preset measured by the same benchmark that it is read against (``measured_speed``): where both are
    # stated, the tensor speed is that measured ratio, not the SMs x max clock rule.
    measured_fp8_gemm_tflops: float | None = None
    measured_against: str = ""
    # The same benchmark's FP8 GEMM rates at every shape it ran on both GPUs, one row each:
    # [m, n, k, this GPU's TFLOP/s, the reference's TFLOP/s] (``measured_size_speed``). Where stated,
    # an FP8 GEMM runs at the measured ratio at its own size (``gemm.size_speed``), not at the one
    # shape ``measured_fp8_gemm_tflops`` was read at: the MI300X's sustained rate falls past 8192^3
    # where the H100's still climbs. Stated with ``measured_against``.
    measured_fp8_gemm_shapes: tuple[tuple[float, ...], ...] = ()
    # The reference's rate in the benchmark that measured this GPU, where that is not the benchmark
    # the reference's own ``measured_fp8_gemm_tflops`` comes from: AMD's table measured the MI325X
    # against the MI300X, Azure's the MI300X against the H100. None: the reference's own figure.
    measured_reference_fp8_gemm_tflops: float | None = None
    # The same for BF16 GEMMs, where a benchmark that measured both GPUs' BF16 rates says the BF16 tensor
    # speed is not the FP8 one (``measured_bf16_speed``): stated with ``measured_against``.
    measured_bf16_gemm_tflops: float | None = None
    measured_reference_bf16_gemm_tflops: float | None = None
    # The same for HBM: a streaming benchmark's bandwidth on this GPU and on the reference, measured by
    # one benchmark (TB/s; ``measured_hbm_speed``): stated with ``measured_against``.
    measured_hbm_tbps: float | None = None
    measured_reference_hbm_tbps: float | None = None
    # The tensor speed against the donor, set by ``io.load_hardware`` (never a YAML key):
    # ``measured_speed`` where ``measured_against`` names a sibling or the donor itself, else
    # ``clock_limited_speed``.
    clock_speed: float = 1.0
    # The FP8 GEMMs' speed by size as a factor on ``clock_speed``: (GEMM FLOPs, factor) points, read
    # between them in log(FLOPs) and held beyond them (``gemm.size_speed``). Set by ``io.load_hardware``
    # from ``measured_fp8_gemm_shapes`` (``measured_size_speed``), or the reference's where this GPU is
    # measured against one that has them at a single figure (the MI325X against the MI300X); never a
    # YAML key. Empty: one speed at every size.
    fp8_gemm_size_speed: tuple[tuple[float, float], ...] = ()
    # The BF16 tensor speed against the donor where ``measured_bf16_gemm_tflops`` sets it
    # (``measured_bf16_speed``, by ``io.load_hardware``, never a YAML key); None: ``clock_speed``.
    bf16_clock_speed: float | None = None
    # The HBM bandwidth's factor on ``hbm_tbps`` against the donor where ``measured_hbm_tbps`` sets it
    # (``measured_hbm_speed``, by ``io.load_hardware``, never a YAML key); the training cost model's
    # achievable bandwidth is hbm_tbps x this x the donor's fitted ``Efficiency.hbm``.
    hbm_speed: float = 1.0
    # cuDNN's fused attention, BF16, causal, head dimension 128, as a published benchmark measured it on
    # this GPU or one of the same SMs (its YAML says which), one row per sequence length: [batch, tokens,
    # query heads, forward ms, backward ms]. Where stated, the attention core is priced at the share of
    # peak each row implies (``measured_attention_efficiency``) at the sequence length a CP rank's kernel
    # runs (per-score time read between the rows in log(tokens), held beyond them), instead of the fitted
    # ``Efficiency.attention``, which the fit then no longer sees: the kernel is slower per score at
    # short sequences.
    measured_attention_ms: tuple[tuple[float, ...], ...] = ()
    # The part of every row's forward + backward ms that is the benchmark's host-side dispatch, not the
    # kernel, where its timer encloses it (CUDA events around PyTorch's call): subtracted from each row.
    measured_attention_host_ms: float = 0.0
    # Those shares as (tokens, share) points, set by ``io.load_hardware`` (never a YAML key): from this
    # preset's own measurement or, for a GPU that takes another's constants (``efficiency_from``), the
    # donor's, as the fitted one is shared; empty: the fitted ``Efficiency.attention``
    # (``attention_peak_share``).
    attention_efficiency: tuple[tuple[float, float], ...] = ()
    # Exponentials per second of the special function units (MUFU.EX2), in units of 10^12: the
    # softmax of flash attention waits on them between its two GEMMs. SMs x 16 per clock x boost
    # clock, or NVIDIA's figure (Blackwell 5, Blackwell Ultra 10.7).
    exp_tera_per_s: float = 4.2
    # GPU <-> host memory, per GPU and direction (GB/s): PCIe Gen5 x16 on x86 hosts, NVLink-C2C
    # on Grace superchips. Prices activation offloading.
    host_link_gbps: float = 55.0
    # The network cards reach the GPU over that same PCIe link (x86 DGX/HGX: GPUDirect RDMA through
    # the shared PCIe switch), so offloading gets only what network traffic leaves of it.
    network_shares_host_link: bool = True
    mxfp8: bool = False  # Blackwell block-scaled FP8
    # Streaming multiprocessors: DeepEP / HybridEP kernels take some of them from compute.
    sm_count: int = 132
    nvlink_latency_us: float = 5.0
    internode_latency_us: float = 10.0
    # What joins the GPUs of one ``nvlink_domain`` (a key of ``SCALE_UP_LINKS``): NVLink / NVSwitch,
    # or PCIe on a card without NVLink (L40S: the domain is one server's PCIe switch, priced at its
    # ``nvlink_gbps`` all the same), or Infinity Fabric (AMD Instinct), a direct full mesh
    # (``MESH_LINKS``) whose ``nvlink_gbps`` is the GPU's links to all its peers together: a
    # collective over fewer GPUs of the domain gets only the links to its members
    # (``comm.scale_up_bandwidth``). The mesh aside, only what `autoparallel hardware` shows.
    scale_up_link: str = "nvlink"
    # Who makes the GPU: validate reports the rows of a GPU not made by NVIDIA, whose constants are
    # borrowed from an NVIDIA family (``efficiency_from``), as kinds of their own ("lora-amd").
    vendor: str = "nvidia"
    reserve_gib: float = 4.0  # CUDA context, NCCL buffers, allocator fragmentation
    efficiency: Efficiency = field(default_factory=Efficiency)
    # A GPU without published runs of its own takes the fitted constants of a similar one.
    efficiency_from: str = ""
    aliases: tuple[str, ...] = ()
    source: str = ""
    calibrated_on: str = ""

    def __post_init__(self) -> None:
        check_name(self.name)
        for key in ("bf16_tflops", "memory_gib", "hbm_tbps", "nvlink_domain", "nvlink_gbps",
                    "internode_gbps", "gpus_per_node"):
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be positive, got {getattr(self, key)}")
        for key in ("fp8_tflops", "fp4_tflops", "max_sm_clock_mhz", "measured_fp8_gemm_tflops",
                    "measured_reference_fp8_gemm_tflops", "measured_bf16_gemm_tflops",
                    "measured_reference_bf16_gemm_tflops", "bf16_clock_speed", "measured_hbm_tbps",
                    "measured_reference_hbm_tbps"):
            if getattr(self, key) is not None and getattr(self, key) <= 0:
                raise ValueError(f"{key} must be positive (or left out), got {getattr(self, key)}")
        if self.scale_up_link not in SCALE_UP_LINKS:
            raise ValueError(f"scale_up_link must be one of {', '.join(SCALE_UP_LINKS)}, got {self.scale_up_link!r}")
        if self.scale_up_mesh and self.nvlink_domain < 2:
            raise ValueError(f"a {self.scale_up_link} mesh joins at least 2 GPUs, got nvlink_domain={self.nvlink_domain}")
        for row in self.measured_fp8_gemm_shapes:
            if len(row) != 5 or min(row) <= 0:
                raise ValueError("measured_fp8_gemm_shapes rows are [m, n, k, TFLOP/s, reference TFLOP/s], all"
                                 f" positive, got {list(row)}")
        if self.clock_speed <= 0:
            raise ValueError(f"clock_speed must be positive, got {self.clock_speed}")
        if self.hbm_speed <= 0:
            raise ValueError(f"hbm_speed must be positive, got {self.hbm_speed}")
        for row in self.measured_attention_ms:
            if len(row) != 5 or min(row) <= 0:
                raise ValueError("measured_attention_ms rows are [batch, tokens, query heads, forward ms, backward ms],"
                                 f" all positive, got {list(row)}")
            if not 0 <= self.measured_attention_host_ms < row[3] + row[4]:
                raise ValueError(f"measured_attention_host_ms must be >= 0 and below each row's forward + backward ms,"
                                 f" got {self.measured_attention_host_ms} against {list(row)}")
        if any(not 0 < share <= 1 for _, share in self.attention_efficiency):
            raise ValueError(f"attention_efficiency shares must be in (0, 1], got {self.attention_efficiency}")
        if self.reserve_gib >= self.memory_gib:
            raise ValueError(f"reserve_gib={self.reserve_gib} must be below memory_gib={self.memory_gib}")

    @property
    def supports_fp8(self) -> bool:
        return self.fp8_tflops is not None

    @property
    def achievable_hbm(self) -> float:
        """Bytes per second the training cost model's HBM-bound terms move (``Candidates.hbm``): the
        datasheet bandwidth x the measured speed (``hbm_speed``) x the fitted ``efficiency.hbm``."""
        return self.hbm_tbps * 1e12 * self.hbm_speed * self.efficiency.hbm

    def attention_peak_share(self, tokens):
        """The share of peak the attention core reaches at a kernel over ``tokens`` (scalar or array; a CP
        rank's ``s_local``; ``layer_time.attention_time``): measured where a benchmark says
        (``attention_efficiency``: its time per score read between the measured lengths in log(tokens),
        held beyond them), else the fitted ``efficiency.attention`` at every length."""
        if not self.attention_efficiency:
            return self.efficiency.attention + 0.0 * np.asarray(tokens, dtype=float)
        lengths, shares = zip(*self.attention_efficiency)
        return 1.0 / np.interp(np.log(tokens), np.log(lengths), 1.0 / np.array(shares))

    @property
    def scale_up_domain(self) -> str:
        """The GPUs of one ``nvlink_domain`` named by their link, as reasons say it: "8-GPU NVLink
        domain", "8-GPU PCIe domain" (L40S)."""
        return f"{self.nvlink_domain}-GPU {SCALE_UP_LINKS[self.scale_up_link]} domain"

    @property
    def nvlink_unidirectional_gbps(self) -> float:
        return self.nvlink_gbps / 2

    @property
    def scale_up_mesh(self) -> bool:
        """The domain is a direct full mesh (``MESH_LINKS``), not a switch."""
        return self.scale_up_link in MESH_LINKS


# Per causal score element, the attention core's forward as ``layer_time.attention_time`` prices it:
# QK^T and P·V, 2 x 2 x head dim FLOPs at head dimension 128, and one exponential; its backward twice
# the forward (``layer_time.compute_time``: three forwards in all).
ATTENTION_HEAD_DIM = 128
ATTENTION_PASSES = 3.0


def measured_attention_efficiency(hw: HardwareSpec) -> tuple[tuple[float, float], ...]:
    """(tokens, share) at each row of ``measured_attention_ms`` (BF16, causal, head dimension 128): the
    share of ``hw``'s peak at which the cost model's attention core takes the measured forward + backward
    time per causal score element (less ``measured_attention_host_ms``), i.e. the model's time at full
    efficiency, ``ATTENTION_PASSES`` x max(the two GEMMs at the BF16 peak, the exponential at the SFU
    rate), over the measured time."""
    gemms = 2.0 * 2.0 * ATTENTION_HEAD_DIM / (hw.bf16_tflops * 1e12 * (hw.bf16_clock_speed or hw.clock_speed))
    bound = max(gemms, 1.0 / (hw.exp_tera_per_s * 1e12))
    points = sorted((tokens, ATTENTION_PASSES * bound * batch * heads * tokens**2 / 2
                     / ((forward + backward - hw.measured_attention_host_ms) * 1e-3))
                    for batch, tokens, heads, forward, backward in hw.measured_attention_ms)
    if len({t for t, _ in points}) < len(points):
        raise ValueError(f"{hw.name}: measured_attention_ms names two rows of the same tokens")
    return tuple(points)


def clock_limited_speed(hw: HardwareSpec, donor: HardwareSpec) -> float:
    """The factor on ``hw``'s datasheet tensor peaks that gives it ``donor``'s tensor FLOP/s per SM
    per clock at its own SM count and max SM clock: (SMs x clock / donor's) / (bf16 peak / donor's).
    GPUs of one architecture (Blackwell and Blackwell Ultra: the same SM and 5th-generation tensor
    core, 8,192 dense BF16 FLOP per SM per clock, NVFP4 aside, whose 1.5x per SM the FP4 peaks
    carry) differ in SM count and clocks; their datasheets quote the same 2.5 PF BF16 for GB200
    (148 SMs) and GB300 (160 SMs) at different clocks, so two GPUs priced at their datasheet
    peaks run at different shares of the SMs x clock they have. GB300 over GB200: 160 x 2,070 /
    (148 x 2,062) = 1.085 at equal datasheet peaks; GB200 over B200: 2,062 / 1,965 = 1.049 where
    the datasheets say 1.11. 1 where either clock is not stated."""
    if not hw.max_sm_clock_mhz or not donor.max_sm_clock_mhz:
        return 1.0
    return ((hw.sm_count * hw.max_sm_clock_mhz) / (donor.sm_count * donor.max_sm_clock_mhz)
            / (hw.bf16_tflops / donor.bf16_tflops))


def measured_speed(hw: HardwareSpec, reference: HardwareSpec) -> float:
    """The factor on ``hw``'s datasheet tensor peaks from a benchmark that measured both ``hw`` and
    ``reference`` (``measured_fp8_gemm_tflops``, and the reference's figure in that benchmark:
    ``measured_reference_fp8_gemm_tflops`` where hw states it, else the reference's own):
    ``reference``'s own speed against the donor they share (``clock_speed``; 1 where ``reference`` is
    that donor, whose fitted constants hold its own sustained rate) times the measured sustained FP8
    GEMM ratio over the datasheet FP8 ratio. Two GPUs can quote the same datasheet peak (GB200 and
    GB300 both 5 PF FP8; MI300X and MI325X both 2.6 PF) yet sustain different rates under a long GEMM
    load, where each runs at the clock its power limit holds (GB200 1,200 W, GB300 1,400 W; MI300X
    750 W, MI325X 1,000 W), which neither the datasheet nor the max SM clock states: Azure's cuBLASLt
    FP8 8192^3 GEMM, 10,000 warm-up iterations, sustains 3,286 TFLOP/s on GB300 and 2,782 on GB200
    (1.18x), where ``clock_limited_speed`` gives 1.085x; AMD's hipBLASLt FP8 GEMM 1,519 on MI325X at a
    median 1,464 MHz and 1,273 on MI300X at 1,230 MHz (1.19x), both quoted at 2,100 MHz."""
    datasheet = (hw.fp8_tflops or hw.bf16_tflops) / (reference.fp8_tflops or reference.bf16_tflops)
    return reference.clock_speed * measured_ratio(hw, reference, "measured_fp8_gemm_tflops") / datasheet


def measured_ratio(hw: HardwareSpec, reference: HardwareSpec, field: str) -> float:
    """``hw``'s measured figure ``field`` over the reference's in the same benchmark: the
    ``measured_reference_*`` figure where hw states it (the reference's own is another benchmark's),
    else the reference's own ``field``; both must be stated."""
    tail = field.removeprefix("measured_")
    against = getattr(hw, f"measured_reference_{tail}") or getattr(reference, field)
    if not getattr(hw, field) or not against:
        raise ValueError(f"{hw.name} is measured against {reference.name}: both must state {field}"
                         f" (or hw the reference's figure, measured_reference_{tail})")
    return getattr(hw, field) / against


def measured_size_speed(hw: HardwareSpec, reference: HardwareSpec) -> tuple[tuple[float, float], ...]:
    """The FP8 GEMMs' speed by size as a factor on ``hw``'s ``clock_speed`` (``measured_speed``, the ratio at
    ``measured_fp8_gemm_tflops``'s shape): at each shape of ``measured_fp8_gemm_shapes`` (GEMM FLOPs 2mnk),
    the measured ratio there over that one. The donor's own size curve (``gemm.efficiency``: the H100's
    rate rising with size) already prices the reference; this is the measured ratio to it at each size.
    Azure's FP8 GEMMs have the MI300X at 0.948x the H100 at 8192^3 (1.10 TFLOP), 0.850x at 6144 x 12288^2
    (1.86), 0.785x at 16384^3 (8.80): under a longer, denser GEMM the 750 W limit holds a lower clock."""
    anchor = measured_ratio(hw, reference, "measured_fp8_gemm_tflops")
    points = sorted((2.0 * m * n * k, rate / against / anchor) for m, n, k, rate, against in hw.measured_fp8_gemm_shapes)
    if len({f for f, _ in points}) < len(points):
        raise ValueError(f"{hw.name}: measured_fp8_gemm_shapes names two shapes of the same FLOPs")
    return tuple(points)


def measured_bf16_speed(hw: HardwareSpec, reference: HardwareSpec) -> float:
    """The factor on ``hw``'s datasheet BF16 peak from a benchmark that measured the BF16 GEMM rate of
    both ``hw`` and ``reference`` (``measured_bf16_gemm_tflops``; the reference's figure in that
    benchmark: ``measured_reference_bf16_gemm_tflops`` where hw states it, else the reference's own):
    the reference's BF16 speed (its ``bf16_clock_speed``, else ``clock_speed``) times the measured ratio
    over the datasheet BF16 ratio, as ``measured_speed`` reads FP8. The FP8 ratio need not be the BF16
    one: the same torch ``matmul`` BF16 sweep (stas00/ml-engineering, Maximum Achievable Matmul FLOPS)
    has the MI300X at 668.4 TFLOP/s against the H100's 794.5 (0.84x), where Azure's FP8 GEMM has it
    at 1,222.9 against 1,290.1 (0.95x) at a datasheet ratio of 1.32 in both precisions."""
    speed = reference.bf16_clock_speed or reference.clock_speed
    return speed * measured_ratio(hw, reference, "measured_bf16_gemm_tflops") / (hw.bf16_tflops / reference.bf16_tflops)


def measured_hbm_speed(hw: HardwareSpec, reference: HardwareSpec) -> float:
    """The factor on ``hw``'s datasheet HBM bandwidth from a streaming benchmark that measured both ``hw``
    and ``reference`` (``measured_hbm_tbps``; the reference's figure in that benchmark:
    ``measured_reference_hbm_tbps`` where hw states it, else the reference's own): the reference's own
    factor (``hbm_speed``; 1 for the donor, whose fitted ``Efficiency.hbm`` holds its own achievable
    share) times the measured ratio over the datasheet ratio, as ``measured_speed`` reads the GEMMs. Two
    GPUs reach different shares of their datasheet bandwidth: Azure's BabelStream Triad (one build of
    one fork, 5 runs each) reaches 4.10 TB/s of the MI300X's 5.3 (77 %) and 2.97 of the H100's 3.35
    (89 %), so the H100's fitted share, read at the MI300X's datasheet figure, overstates it by 1.15x."""
    return reference.hbm_speed * measured_ratio(hw, reference, "measured_hbm_tbps") / (hw.hbm_tbps / reference.hbm_tbps)
