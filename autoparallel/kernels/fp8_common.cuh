// Device helpers shared by the FP8 kernels: loads, the saturating cast, amax as ordered bits.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "fp8_kernels.h"

namespace ap {

constexpr int kF32 = 0;
constexpr int kBF16 = 1;
constexpr int kE4M3 = 0;
constexpr int kE5M2 = 1;

__host__ __device__ constexpr float fp8_max(int fmt) { return fmt == kE4M3 ? 448.0f : 57344.0f; }

__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}

// Round to nearest even with saturation to the finite range; NaN stays NaN.
template <int FMT>
__device__ __forceinline__ uint8_t cast_fp8(float v) {
  return static_cast<uint8_t>(
      __nv_cvt_float_to_fp8(v, __NV_SATFINITE, FMT == kE4M3 ? __NV_E4M3 : __NV_E5M2));
}

// |x| as bits: non-negative floats order like unsigned ints, and NaN (0x7fc00000...) sorts
// above inf, so an integer max propagates NaN the way torch.amax does.
__device__ __forceinline__ unsigned abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

__device__ __forceinline__ unsigned warp_max(unsigned v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Block-wide max of `v`; every thread gets the result. `shared` holds >= 32 words.
__device__ __forceinline__ unsigned block_max(unsigned v, unsigned* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : 0u;
  return warp_max(v);
}

// scale = fp8_max / amax * 2^-margin, or `previous` when amax is 0, inf or NaN.
__device__ __forceinline__ float compute_scale(float amax, float fmax, int margin, float previous) {
  if (!(amax > 0.0f) || isinf(amax)) return previous;
  return ldexpf(fmax / amax, -margin);
}

inline int blocks_for(int64_t n, int threads, int cap = 65535) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  return static_cast<int>(b < cap ? b : cap);
}

inline int last_error() { return static_cast<int>(cudaGetLastError()); }

}  // namespace ap
