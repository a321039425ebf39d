"""A hybrid Mamba-Transformer's Mamba-2 (M) layers in serving: each sequence's fixed-size state,
how the engines fit it beside the KV cache, and the Mamba work of one forward pass.

**State per sequence and M layer on one GPU** (vLLM, vllm-project/vllm@02d71083
``vllm/model_executor/layers/mamba/mamba_utils.py``, ``MambaStateShapeCalculator.mamba2_state_shape``):
the conv state ``(conv_kernel - 1) x (d_inner + 2·groups'·state_dim) / tp`` (groups' = the groups,
plus ``tp - groups`` when TP does not divide them: ``extra_groups_for_head_shards`` replicates a
group to every rank of its heads) and the SSM state ``heads / tp x head_dim x state_dim``. Dtypes
(``MambaStateDtypeCalculator._mamba_state_dtype``): the conv state in the model's dtype
(``mamba_cache_dtype`` auto: BF16, also under an FP8 KV cache), the SSM state in
``mamba_ssm_cache_dtype``, which vLLM sets for NemotronH to the HF config's value or FP32
("Only float32 is known to have no accuracy issues by default": ``NemotronHForCausalLMConfig`` in
``vllm/model_executor/models/config.py`` of vLLM main, read in the code index; older releases
defaulted to FP16). SGLang and TensorRT-LLM are priced with the same dtypes (an assumption:
their defaults were not read).

**Pool** (``admission``): vLLM's hybrid KV-cache manager gives every layer one page size
(vllm-project/vllm@1936cf38 ``vllm/model_executor/models/config.py``,
``HybridAttentionMambaModelConfig``, without prefix caching): the attention block grows to
``16 x ceil(mamba page / (16 x one token's K/V of one layer))`` tokens and the Mamba page is padded
to it; the layers are put in groups of ``min(attention layers, M layers)`` (the larger count when
within 1.25x of the smaller; ``_get_kv_cache_groups_uniform_page_size`` in
``vllm/v1/core/kv_cache_utils.py``, read in the code index), every group's layers share one block
id, and the pool is ``pool / (page x group size)`` blocks. A request holds one block per Mamba
group and ``ceil(tokens / block)`` per attention group. SGLang (``MambaPool``) and TensorRT-LLM
(its Mamba cache manager) keep the states in a pool of their own beside the token-paged KV cache:
priced as each request taking its states plus its KV blocks from the one pool (an assumption).

**Work of one pass per M layer and GPU** (``pass_work``): prefill tokens run the training
forward's kernels (``costmodel.mamba``: the SSD chunked scan's FLOPs and bytes, the causal conv1d
and the grouped norm, read and write per token), and each prefilling sequence reads its state
and writes it back; a decoding sequence runs ``causal_conv1d_update`` and
``selective_state_update`` (vLLM ``vllm/model_executor/layers/mamba/mamba_mixer2.py``): each
reads its conv and SSM states and writes them back, memory-bound, ``STATE_UPDATE_FLOPS`` per SSM
state element, plus its token's in_proj output read, the scan output written and the gated
norm's pass. The in / out projections are GEMMs of the pass (``inference.pass_work``).
"""

from __future__ import annotations


import numpy as np

from autoparallel.costmodel import mamba

CONV_STATE_BYTES = 2.0  # the model's dtype, BF16
SSM_STATE_BYTES = 4.0  # FP32: vLLM's NemotronH mamba_ssm_cache_dtype
#: selective_state_update per SSM state element: decay x state + dt·B·x (3) and C·state (2).
STATE_UPDATE_FLOPS = 5.0
#: Engines whose sources serve Nemotron-H / Nemotron 3 (vLLM ``models/nemotron_h.py``, SGLang
#: ``python/sglang/srt/models/nemotron_h.py``, TensorRT-LLM's PyTorch backend
#: ``tensorrt_llm/_torch/models/modeling_nemotron_h.py``); TensorRT-LLM 0.10's engine builder and
#: FasterTransformer have no Mamba layer.
HYBRID_ENGINES = ("vllm", "sglang", "tensorrt-llm")
#: Engines that unify the page size of attention and Mamba layers (``admission``).
UNIFIED_PAGE_ENGINES = ("vllm",)
#: vLLM's attention block alignment and its grouping slack (``admission``).
BLOCK_ALIGNMENT = 16
GROUP_SLACK = 1.25


def local_groups(model, tp) -> np.ndarray:
    """B/C groups on one TP rank, vLLM's replication included (``extra_groups_for_head_shards``)."""
    tp = np.asarray(tp, dtype=float)
    g = float(model.mamba_num_groups)
    return np.where(np.mod(g, tp) == 0, g, tp) / tp


def state_bytes(model, tp) -> np.ndarray:
    """Conv and SSM state of one sequence in one M layer on one GPU (module docstring)."""
    tp = np.asarray(tp, dtype=float)
    n = model.mamba_state_dim
    conv = (model.mamba_conv_kernel - 1) * (model.mamba_inner / tp + 2.0 * local_groups(model, tp) * n)
    ssm = model.mamba_heads / tp * model.mamba_head_dim * n
    return conv * CONV_STATE_BYTES + ssm * SSM_STATE_BYTES


def stage_counts(lay) -> dict[str, np.ndarray]:
    """Layers of each pattern symbol on the fullest pipeline stage: the pattern's own mix scaled to
    the stage's layers (an assumption for pp > 1: vLLM splits the layers evenly by count, whose
    stages' mixes differ a little)."""
    model = lay.model
    return {kind: count * lay.stage_layers / model.num_layers for kind, count in model.layer_kind_counts.items()}


def decode_io_bytes(model, tp) -> np.ndarray:
    """A decoding token's activations through the Mamba kernels on one GPU (16 bit): the conv
    update reads x, B, C and writes them convolved; the state update reads them, dt and z and
    writes y; the gated norm reads y and writes its output."""
    channels = model.mamba_conv_channels
    d = model.mamba_inner
    return mamba.BF16 * (2.0 * channels + (channels + model.mamba_heads + d) + d + 2.0 * d) / np.asarray(tp, float)


def sequence_state_bytes(lay) -> np.ndarray:
    """One sequence's Mamba states (every M layer's) on a GPU of the fullest pipeline stage."""
    return stage_counts(lay)["M"] * state_bytes(lay.model, lay.tp)


def pass_work(lay, prefill_tokens, prefilling, decoding) -> tuple[np.ndarray, np.ndarray]:
    """(FLOPs, HBM bytes) of one M layer on one GPU in a pass over ``prefill_tokens`` prompt tokens
    of ``prefilling`` sequences and one token each of ``decoding`` sequences (module docstring)."""
    model, t = lay.model, np.asarray(lay.tp, dtype=float)
    prefill_tokens, prefilling, decoding = (np.asarray(a, dtype=float) for a in (prefill_tokens, prefilling, decoding))
    ssd_flops, ssd_bytes = mamba.ssd_flops_per_token(model)[0], mamba.ssd_bytes_per_token(model)[0]
    per_token = ssd_bytes + mamba.conv_bytes_per_token(model)[0] + mamba.norm_bytes_per_token(model)[0]
    state = state_bytes(model, t)
    ssm_elements = model.mamba_heads / t * model.mamba_head_dim * model.mamba_state_dim
    flops = prefill_tokens * ssd_flops / t + decoding * STATE_UPDATE_FLOPS * ssm_elements
    nbytes = (prefill_tokens * per_token / t + 2.0 * state * (prefilling + decoding)
              + decoding * decode_io_bytes(model, t))
    return flops, nbytes


def _groups(n_attention, n_mamba):
    """vLLM's KV-cache groups: (group size, attention groups, Mamba groups)."""
    small, large = np.minimum(n_attention, n_mamba), np.maximum(n_attention, n_mamba)
    size = np.where(large < small * GROUP_SLACK, large, np.maximum(small, 1.0))
    return size, np.ceil(n_attention / size), np.ceil(n_mamba / size)


def admission(lay, engine, pool, held, model_len) -> tuple[np.ndarray, np.ndarray]:
    """(requests the pool holds, whether one ``model_len`` request fits) for requests holding
    ``held`` tokens of K/V each, their Mamba states beside (module docstring)."""
    counts = stage_counts(lay)
    n_attention, n_mamba = np.ceil(counts["*"]), np.ceil(counts["M"])
    kv_token = lay.kv_bytes_per_token() / np.maximum(lay.attention_layers, 1e-300)  # one attention layer
    state = state_bytes(lay.model, lay.tp)
    if engine.name in UNIFIED_PAGE_ENGINES and lay.model.layer_kind_counts["*"]:  # (without attention: states alone)
        block = np.maximum(engine.kv_block_tokens,
                           BLOCK_ALIGNMENT * np.ceil(state / (BLOCK_ALIGNMENT * kv_token)))
        size, attention_groups, mamba_groups = _groups(n_attention, n_mamba)
        blocks = np.floor(pool / (block * kv_token * size))
        per_request = np.ceil(held / block) * attention_groups + mamba_groups
        longest = np.ceil(model_len / block) * attention_groups + mamba_groups
        return np.floor(blocks / per_request), blocks >= longest
    block = engine.kv_block_tokens
    states = n_mamba * state
    per_request = np.ceil(held / block) * block * kv_token * n_attention + states
    longest = np.ceil(model_len / block) * block * kv_token * n_attention + states
    return np.floor(pool / per_request), pool >= longest


def reserve_states(lay, engine, pool: float, max_running: int, longest: float) -> tuple[int, float]:
    """The traffic simulation's pool of a hybrid model: (running requests, bytes left for the paged
    K/V). The running batch is capped where ``admission`` fits that many requests of ``longest``
    tokens, and their Mamba states are set apart (SGLang's and TensorRT-LLM's Mamba pools are sized
    by the running requests; for vLLM's shared pages an approximation), so the scheduler pages the
    attention layers' K/V alone in the rest."""
    requests, _ = admission(lay, engine, np.asarray(pool, dtype=float), float(longest), float(longest))
    running = int(max(1.0, min(float(max_running), float(np.ravel(requests)[0]))))
    states = running * float(np.ravel(sequence_state_bytes(lay))[0])
    return running, max(pool - states, 0.0)
