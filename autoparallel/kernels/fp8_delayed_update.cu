// Delayed scaling's once-per-step bookkeeping for every FP8 tensor of a model in one launch:
// amax over the history window, the new scale, and the history roll (TransformerEngine's
// layout: column 0 is this step's amax; after the update it moves to the end and column 0 is
// cleared for the next step). Hundreds of tiny per-tensor launches become one.
#include "fp8_common.cuh"

namespace ap {
namespace {

constexpr int64_t kMaxLen = 8192;  // 32 KiB of shared memory for one staged row (< the 48 KiB default)

__global__ void delayed_update_kernel(float* __restrict__ history, float* __restrict__ scale,
                                      const float* __restrict__ fmax, int64_t len, int margin,
                                      int most_recent) {
  extern __shared__ float row_copy[];
  __shared__ unsigned shared[32];
  float* row = history + (int64_t)blockIdx.x * len;
  unsigned local = 0u;
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
    row_copy[j] = row[j];
    local = max(local, abs_bits(row_copy[j]));
  }
  const unsigned window = block_max(local, shared);  // block_max synchronises the block
  const float amax = most_recent ? row_copy[0] : __uint_as_float(window);
  if (threadIdx.x == 0)
    scale[blockIdx.x] = compute_scale(amax, fmax[blockIdx.x], margin, scale[blockIdx.x]);
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x)
    row[j] = j == 0 ? 0.0f : (j == len - 1 ? row_copy[0] : row_copy[j + 1]);
}

}  // namespace
}  // namespace ap

extern "C" int ap_delayed_scaling_update(float* history, float* scale, const float* fp8_max,
                                         int64_t n, int64_t len, int margin, int most_recent,
                                         cudaStream_t stream) {
  if (n == 0) return 0;
  if (len < 1 || len > ap::kMaxLen || n > 2147483647LL)
    return static_cast<int>(cudaErrorInvalidValue);
  ap::delayed_update_kernel<<<static_cast<unsigned>(n), 256, len * sizeof(float), stream>>>(
      history, scale, fp8_max, len, margin, most_recent);
  return ap::last_error();
}
