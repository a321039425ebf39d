// Device helpers shared by the FP8 kernels: 16-byte vector loads and stores, the saturating
// cast, amax as ordered bits reduced per warp by shuffles, scales derived on the device.
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

// Every vectorised kernel moves 16 input elements per thread and step: 32 B of bf16 (two 16-byte
// loads) or 64 B of fp32 (four), and writes their 16 FP8 bytes with one 16-byte store.
constexpr int kChunk = 16;

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

// Max over the `width` lanes of each aligned lane group (width a power of two <= 32).
__device__ __forceinline__ unsigned warp_max(unsigned v, int width = 32) {
  for (int offset = width >> 1; offset > 0; offset >>= 1)
    v = max(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Block-wide max of `v` over a block of `threads` threads with flat index `flat`; every thread
// gets the result. `shared` holds >= 32 words. Synchronises the block.
__device__ __forceinline__ unsigned block_max(unsigned v, unsigned* shared, int flat, int threads) {
  const int lane = flat & 31, warp = flat >> 5;
  const int warps = (threads + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : 0u;
  return warp_max(v);
}

__device__ __forceinline__ unsigned block_max(unsigned v, unsigned* shared) {
  return block_max(v, shared, threadIdx.x, blockDim.x);
}

// One atomic per block: the block's max goes into a running amax (kept as ordered bits).
__device__ __forceinline__ void block_amax_to(unsigned v, unsigned* shared, int flat, int threads,
                                              unsigned* amax) {
  v = block_max(v, shared, flat, threads);
  if (flat == 0 && v) atomicMax(amax, v);
}

// scale = fp8_max / amax * 2^-margin, or `previous` when amax is 0, inf or NaN.
__device__ __forceinline__ float compute_scale(float amax, float fmax, int margin, float previous) {
  if (!(amax > 0.0f) || isinf(amax)) return previous;
  return ldexpf(fmax / amax, -margin);
}

// The scale a cast uses: given (delayed scaling), or derived from an amax already on the device
// (current scaling's second pass), so no host round trip sits between the two launches.
struct ScaleSource {
  const float* scale;      // used when not null
  const unsigned* amax;    // else scale = fp8_max / amax * 2^-margin
  int margin;
  __device__ __forceinline__ float get(float fmax) const {
    return scale ? *scale : compute_scale(__uint_as_float(*amax), fmax, margin, 1.0f);
  }
};

// 16 consecutive elements of T are sizeof(T) 16-byte vectors: 2 for bf16, 4 for fp32.
template <typename T>
struct Chunk16 {
  static constexpr int kVectors = static_cast<int>(sizeof(T));
  uint4 raw[kVectors];
};

// The 16 elements of a chunk as fp32 (vector q holds elements [q * 16 / kVectors, ...)).
__device__ __forceinline__ void to_float(const Chunk16<float>& c, float (&v)[kChunk]) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    v[4 * q] = __uint_as_float(c.raw[q].x); v[4 * q + 1] = __uint_as_float(c.raw[q].y);
    v[4 * q + 2] = __uint_as_float(c.raw[q].z); v[4 * q + 3] = __uint_as_float(c.raw[q].w);
  }
}

__device__ __forceinline__ void to_float(const Chunk16<__nv_bfloat16>& c, float (&v)[kChunk]) {
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const unsigned words[4] = {c.raw[q].x, c.raw[q].y, c.raw[q].z, c.raw[q].w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      v[8 * q + 2 * w] = __uint_as_float(words[w] << 16);             // low bf16
      v[8 * q + 2 * w + 1] = __uint_as_float(words[w] & 0xffff0000u);  // high bf16
    }
  }
}

// 16 consecutive elements through 16-byte loads; p must be 16-byte aligned.
template <typename T>
__device__ __forceinline__ Chunk16<T> load_chunk(const T* p) {
  Chunk16<T> c;
  const uint4* q = reinterpret_cast<const uint4*>(p);
#pragma unroll
  for (int k = 0; k < Chunk16<T>::kVectors; ++k) c.raw[k] = q[k];
  return c;
}

template <typename T>
__device__ __forceinline__ void load16(const T* p, float (&v)[kChunk]) {
  to_float(load_chunk(p), v);
}

// Cast 16 values (times `s`) and pack them into one 16-byte vector.
template <int FMT>
__device__ __forceinline__ uint4 cast16(const float (&v)[kChunk], float s) {
  unsigned w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k)
    w[k] = unsigned(cast_fp8<FMT>(v[4 * k] * s)) | unsigned(cast_fp8<FMT>(v[4 * k + 1] * s)) << 8 |
           unsigned(cast_fp8<FMT>(v[4 * k + 2] * s)) << 16 |
           unsigned(cast_fp8<FMT>(v[4 * k + 3] * s)) << 24;
  return make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ unsigned max_abs16(const float (&v)[kChunk]) {
  unsigned m = 0u;
#pragma unroll
  for (int k = 0; k < kChunk; ++k) m = max(m, abs_bits(v[k]));
  return m;
}

__host__ __device__ inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

inline int blocks_for(int64_t n, int threads, int cap = 65535) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  return static_cast<int>(b < cap ? b : cap);
}

inline int last_error() { return static_cast<int>(cudaGetLastError()); }

}  // namespace ap
