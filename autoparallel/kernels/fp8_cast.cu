// Tensorwise FP8 casts: amax, delayed scaling's fused cast + amax, current scaling's
// amax -> scale -> cast without a host round trip.
//
// Memory-bound, so every thread moves 16 elements per step with 16-byte loads and one 16-byte
// store (kChunk); a tail of fewer than 16 elements, or a misaligned pointer, takes the scalar
// loop. amax is reduced per warp by shuffles, then per block through shared memory, and costs
// one atomic per block.
#include "fp8_common.cuh"

namespace ap {
namespace {

constexpr int kThreads = 256;

// Elements [0, vector_end) go 16 at a time when `vec`; the rest one at a time.
__device__ __forceinline__ int64_t vector_end(int64_t n, bool vec) {
  return vec ? n / kChunk * kChunk : 0;
}

// One pass over x: fold |x| into `amax` (when not null) and, with CAST, write x times the scale
// `src` gives as FP8. For delayed scaling `amax` is this step's slot of the amax history, so
// micro-batches accumulate into it without any other launch; without CAST it is the amax kernel.
template <typename T, int FMT, bool CAST>
__global__ void pass_kernel(const T* __restrict__ x, int64_t n, bool vec, ScaleSource src,
                            uint8_t* __restrict__ out, unsigned* __restrict__ amax,
                            float* __restrict__ scale_inv) {
  __shared__ unsigned shared[32];
  const float s = CAST ? src.get(fp8_max(FMT)) : 1.0f;
  if (CAST && scale_inv && blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = 1.0f / s;
  unsigned local = 0u;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const int64_t tid = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  const int64_t vend = vector_end(n, vec);
  for (int64_t c = tid; c < vend / kChunk; c += stride) {
    float v[kChunk];
    load16(x + c * kChunk, v);
    local = max(local, max_abs16(v));
    if (CAST) reinterpret_cast<uint4*>(out)[c] = cast16<FMT>(v, s);
  }
  for (int64_t i = vend + tid; i < n; i += stride) {
    const float v = load(x, i);
    local = max(local, abs_bits(v));
    if (CAST) out[i] = cast_fp8<FMT>(v * s);
  }
  if (amax) block_amax_to(local, shared, threadIdx.x, blockDim.x, amax);
}

inline int grid(int64_t n) {
  return blocks_for((n + kChunk - 1) / kChunk, kThreads, 8192);
}

template <typename T>
int launch_amax(const T* x, int64_t n, float* amax_out, bool accumulate, cudaStream_t stream) {
  if (!accumulate) {
    cudaError_t err = cudaMemsetAsync(amax_out, 0, sizeof(float), stream);
    if (err != cudaSuccess) return static_cast<int>(err);
  }
  if (n == 0) return 0;
  pass_kernel<T, kE4M3, false><<<grid(n), kThreads, 0, stream>>>(
      x, n, aligned16(x), ScaleSource{nullptr, nullptr, 0}, nullptr,
      reinterpret_cast<unsigned*>(amax_out), nullptr);
  return last_error();
}

template <typename T, int FMT>
int launch_cast(const T* x, int64_t n, ScaleSource src, uint8_t* out, float* amax_out,
                bool accumulate, float* scale_inv, cudaStream_t stream) {
  if (amax_out && !accumulate) {
    cudaError_t err = cudaMemsetAsync(amax_out, 0, sizeof(float), stream);
    if (err != cudaSuccess) return static_cast<int>(err);
  }
  if (n == 0 && !scale_inv) return 0;
  const bool vec = aligned16(x) && aligned16(out);
  pass_kernel<T, FMT, true><<<grid(n), kThreads, 0, stream>>>(
      x, n, vec, src, out, reinterpret_cast<unsigned*>(amax_out), scale_inv);
  return last_error();
}

template <typename T, int FMT>
int launch_current(const T* x, int64_t n, int margin, uint8_t* out, float* scale_inv,
                   float* amax_out, cudaStream_t stream) {
  int err = launch_amax<T>(x, n, amax_out, false, stream);
  if (err) return err;
  ScaleSource src{nullptr, reinterpret_cast<const unsigned*>(amax_out), margin};
  return launch_cast<T, FMT>(x, n, src, out, nullptr, false, scale_inv, stream);
}

}  // namespace
}  // namespace ap

using ap::kBF16;
using ap::kE4M3;
using ap::kE5M2;
using ap::kF32;

extern "C" int ap_amax(const void* x, int in_dtype, int64_t n, float* amax_out,
                       cudaStream_t stream) {
  if (in_dtype == kF32)
    return ap::launch_amax(static_cast<const float*>(x), n, amax_out, false, stream);
  if (in_dtype == kBF16)
    return ap::launch_amax(static_cast<const __nv_bfloat16*>(x), n, amax_out, false, stream);
  return static_cast<int>(cudaErrorInvalidValue);
}

extern "C" int ap_cast_amax(const void* x, int in_dtype, int64_t n, const float* scale, int fmt,
                            uint8_t* out, float* amax_out, int accumulate, cudaStream_t stream) {
  const float* xf = static_cast<const float*>(x);
  const __nv_bfloat16* xb = static_cast<const __nv_bfloat16*>(x);
  const ap::ScaleSource src{scale, nullptr, 0};
  const bool acc = accumulate != 0;
  if (in_dtype == kF32 && fmt == kE4M3) return ap::launch_cast<float, kE4M3>(xf, n, src, out, amax_out, acc, nullptr, stream);
  if (in_dtype == kF32 && fmt == kE5M2) return ap::launch_cast<float, kE5M2>(xf, n, src, out, amax_out, acc, nullptr, stream);
  if (in_dtype == kBF16 && fmt == kE4M3) return ap::launch_cast<__nv_bfloat16, kE4M3>(xb, n, src, out, amax_out, acc, nullptr, stream);
  if (in_dtype == kBF16 && fmt == kE5M2) return ap::launch_cast<__nv_bfloat16, kE5M2>(xb, n, src, out, amax_out, acc, nullptr, stream);
  return static_cast<int>(cudaErrorInvalidValue);
}

extern "C" int ap_current_scale_cast(const void* x, int in_dtype, int64_t n, int fmt, int margin,
                                     uint8_t* out, float* scale_inv_out, float* amax_out,
                                     cudaStream_t stream) {
  const float* xf = static_cast<const float*>(x);
  const __nv_bfloat16* xb = static_cast<const __nv_bfloat16*>(x);
  if (in_dtype == kF32 && fmt == kE4M3) return ap::launch_current<float, kE4M3>(xf, n, margin, out, scale_inv_out, amax_out, stream);
  if (in_dtype == kF32 && fmt == kE5M2) return ap::launch_current<float, kE5M2>(xf, n, margin, out, scale_inv_out, amax_out, stream);
  if (in_dtype == kBF16 && fmt == kE4M3) return ap::launch_current<__nv_bfloat16, kE4M3>(xb, n, margin, out, scale_inv_out, amax_out, stream);
  if (in_dtype == kBF16 && fmt == kE5M2) return ap::launch_current<__nv_bfloat16, kE5M2>(xb, n, margin, out, scale_inv_out, amax_out, stream);
  return static_cast<int>(cudaErrorInvalidValue);
}
