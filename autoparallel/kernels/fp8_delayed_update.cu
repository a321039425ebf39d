// Delayed scaling's once-per-step bookkeeping for every FP8 tensor of a model in one launch:
// amax over the history window, the new scale and its inverse, and the history roll.
//
// Layout (TransformerEngine's): history is [len, n], row 0 this step's amax of each of the n
// tensors, rows 1.. the earlier steps, oldest first. Row 0 is contiguous, so the amax all-reduce
// across ranks is one collective on it, and here thread i owns column i: at every step of its
// walk down the column the warp reads and writes 32 consecutive floats (coalesced). A
// non-finite amax in row 0 (a step that saw inf or NaN) is recorded as 0 before anything else.
// scale_inv is strided (inv_stride floats apart): the caller gives each value its own 16-byte
// slot, the alignment cuBLASLt wants of the scale pointers of an FP8 GEMM.
#include "fp8_common.cuh"

namespace ap {
namespace {

constexpr int kThreads = 128;

__global__ void delayed_update_kernel(float* __restrict__ history, float* __restrict__ scale,
                                      float* __restrict__ scale_inv, int64_t inv_stride,
                                      const float* __restrict__ fmax, int64_t n, int64_t len,
                                      int margin, int most_recent) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  float now = history[i];
  if (!isfinite(now)) now = 0.0f;
  unsigned window = abs_bits(now);
  // Roll up by one: row j takes row j + 1, the last row takes this step's amax, then row 0
  // clears (the oldest step, now in row 0, leaves the window).
  for (int64_t j = 0; j + 1 < len; ++j) {
    const float next = history[(j + 1) * n + i];
    window = max(window, abs_bits(next));
    history[j * n + i] = next;
  }
  history[(len - 1) * n + i] = now;
  history[i] = 0.0f;  // with len == 1 the only row is cleared too
  const float amax = most_recent ? now : __uint_as_float(window);
  const float s = compute_scale(amax, fmax[i], margin, scale[i]);
  scale[i] = s;
  scale_inv[i * inv_stride] = 1.0f / s;
}

}  // namespace
}  // namespace ap

extern "C" int ap_delayed_scaling_update(float* history, float* scale, float* scale_inv,
                                         int64_t scale_inv_stride, const float* fp8_max, int64_t n,
                                         int64_t len, int margin, int most_recent,
                                         cudaStream_t stream) {
  if (n == 0) return 0;
  if (len < 1) return static_cast<int>(cudaErrorInvalidValue);
  ap::delayed_update_kernel<<<ap::blocks_for(n, ap::kThreads, 2147483647), ap::kThreads, 0,
                              stream>>>(history, scale, scale_inv, scale_inv_stride, fp8_max, n,
                                        len, margin, most_recent);
  return ap::last_error();
}
