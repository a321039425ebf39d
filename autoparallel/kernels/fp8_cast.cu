// Tensorwise FP8 casts: amax, delayed scaling's fused cast + amax, current scaling's
// amax -> scale -> cast without a host round trip.
#include "fp8_common.cuh"

namespace ap {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void amax_kernel(const T* __restrict__ x, int64_t n, unsigned* __restrict__ amax) {
  __shared__ unsigned shared[32];
  unsigned local = 0u;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    local = max(local, abs_bits(load(x, i)));
  local = block_max(local, shared);
  if (threadIdx.x == 0 && local) atomicMax(amax, local);
}

// Delayed scaling: the scale is known before the tensor is read, so one pass casts and
// records the amax that feeds the next step's scale.
template <typename T, int FMT>
__global__ void cast_amax_kernel(const T* __restrict__ x, int64_t n, const float* __restrict__ scale,
                                 uint8_t* __restrict__ out, unsigned* __restrict__ amax) {
  __shared__ unsigned shared[32];
  const float s = *scale;
  unsigned local = 0u;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const float v = load(x, i);
    local = max(local, abs_bits(v));
    out[i] = cast_fp8<FMT>(v * s);
  }
  local = block_max(local, shared);
  if (threadIdx.x == 0 && local) atomicMax(amax, local);
}

// Current scaling's second pass: the scale is derived from the amax the first pass left on the
// device, by every block alike, so no host synchronisation sits between the two launches.
template <typename T, int FMT>
__global__ void scale_cast_kernel(const T* __restrict__ x, int64_t n, const unsigned* __restrict__ amax,
                                  int margin, uint8_t* __restrict__ out, float* __restrict__ scale_inv) {
  const float s = compute_scale(__uint_as_float(*amax), fp8_max(FMT), margin, 1.0f);
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = 1.0f / s;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    out[i] = cast_fp8<FMT>(load(x, i) * s);
}

template <typename T>
int launch_amax(const T* x, int64_t n, float* amax_out, cudaStream_t stream) {
  cudaError_t err = cudaMemsetAsync(amax_out, 0, sizeof(float), stream);
  if (err != cudaSuccess) return static_cast<int>(err);
  if (n == 0) return 0;
  amax_kernel<T><<<blocks_for(n, kThreads, 1024), kThreads, 0, stream>>>(
      x, n, reinterpret_cast<unsigned*>(amax_out));
  return last_error();
}

template <typename T, int FMT>
int launch_cast_amax(const T* x, int64_t n, const float* scale, uint8_t* out, float* amax_out,
                     cudaStream_t stream) {
  cudaError_t err = cudaMemsetAsync(amax_out, 0, sizeof(float), stream);
  if (err != cudaSuccess) return static_cast<int>(err);
  if (n == 0) return 0;
  cast_amax_kernel<T, FMT><<<blocks_for(n, kThreads, 4096), kThreads, 0, stream>>>(
      x, n, scale, out, reinterpret_cast<unsigned*>(amax_out));
  return last_error();
}

template <typename T, int FMT>
int launch_current(const T* x, int64_t n, int margin, uint8_t* out, float* scale_inv,
                   float* amax_out, cudaStream_t stream) {
  int err = launch_amax<T>(x, n, amax_out, stream);
  if (err) return err;
  scale_cast_kernel<T, FMT><<<blocks_for(n, kThreads, 4096), kThreads, 0, stream>>>(
      x, n, reinterpret_cast<const unsigned*>(amax_out), margin, out, scale_inv);
  return last_error();
}

}  // namespace
}  // namespace ap

using ap::kBF16;
using ap::kE4M3;
using ap::kE5M2;
using ap::kF32;

extern "C" int ap_amax(const void* x, int in_dtype, int64_t n, float* amax_out,
                       cudaStream_t stream) {
  if (in_dtype == kF32) return ap::launch_amax(static_cast<const float*>(x), n, amax_out, stream);
  if (in_dtype == kBF16)
    return ap::launch_amax(static_cast<const __nv_bfloat16*>(x), n, amax_out, stream);
  return static_cast<int>(cudaErrorInvalidValue);
}

extern "C" int ap_cast_amax(const void* x, int in_dtype, int64_t n, const float* scale, int fmt,
                            uint8_t* out, float* amax_out, cudaStream_t stream) {
  const float* xf = static_cast<const float*>(x);
  const __nv_bfloat16* xb = static_cast<const __nv_bfloat16*>(x);
  if (in_dtype == kF32 && fmt == kE4M3) return ap::launch_cast_amax<float, kE4M3>(xf, n, scale, out, amax_out, stream);
  if (in_dtype == kF32 && fmt == kE5M2) return ap::launch_cast_amax<float, kE5M2>(xf, n, scale, out, amax_out, stream);
  if (in_dtype == kBF16 && fmt == kE4M3) return ap::launch_cast_amax<__nv_bfloat16, kE4M3>(xb, n, scale, out, amax_out, stream);
  if (in_dtype == kBF16 && fmt == kE5M2) return ap::launch_cast_amax<__nv_bfloat16, kE5M2>(xb, n, scale, out, amax_out, stream);
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
