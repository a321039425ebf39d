// Blockwise FP8 casts (DeepSeek-V3): each 1x128 tile or 128x128 block gets its own scale from
// its own amax, computed and applied in the same kernel (one read, no separate amax pass).
#include "fp8_common.cuh"

namespace ap {
namespace {

constexpr int kBlock = 128;

// One warp per 1x128 tile; lane l handles elements l, l+32, l+64, l+96 (coalesced).
template <typename T, int FMT>
__global__ void cast_1x128_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                  int64_t tiles_per_row, uint8_t* __restrict__ out,
                                  float* __restrict__ scale_inv) {
  const int lane = threadIdx.x & 31;
  const int64_t tile = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (tile >= rows * tiles_per_row) return;  // whole warps exit together
  const int64_t row = tile / tiles_per_row, col0 = (tile % tiles_per_row) * kBlock;
  float v[4];
  unsigned local = 0u;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int64_t col = col0 + lane + 32 * k;
    v[k] = col < cols ? load(x, row * cols + col) : 0.0f;
    local = max(local, abs_bits(v[k]));
  }
  local = warp_max(local);
  const float s = compute_scale(__uint_as_float(local), fp8_max(FMT), 0, 1.0f);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int64_t col = col0 + lane + 32 * k;
    if (col < cols) out[row * cols + col] = cast_fp8<FMT>(v[k] * s);
  }
  if (lane == 0) scale_inv[tile] = 1.0f / s;
}

// One thread block (256 threads) per 128x128 block: amax pass, then the cast pass re-reads the
// 32-64 KiB block, which is still in L1/L2.
template <typename T, int FMT>
__global__ void cast_128x128_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                    uint8_t* __restrict__ out, float* __restrict__ scale_inv) {
  __shared__ unsigned shared[32];
  const int64_t row0 = (int64_t)blockIdx.y * kBlock, col0 = (int64_t)blockIdx.x * kBlock;
  unsigned local = 0u;
  for (int i = threadIdx.x; i < kBlock * kBlock; i += blockDim.x) {
    const int64_t row = row0 + i / kBlock, col = col0 + i % kBlock;
    if (row < rows && col < cols) local = max(local, abs_bits(load(x, row * cols + col)));
  }
  local = block_max(local, shared);
  const float s = compute_scale(__uint_as_float(local), fp8_max(FMT), 0, 1.0f);
  for (int i = threadIdx.x; i < kBlock * kBlock; i += blockDim.x) {
    const int64_t row = row0 + i / kBlock, col = col0 + i % kBlock;
    if (row < rows && col < cols) out[row * cols + col] = cast_fp8<FMT>(load(x, row * cols + col) * s);
  }
  if (threadIdx.x == 0) scale_inv[blockIdx.y * gridDim.x + blockIdx.x] = 1.0f / s;
}

template <typename T, int FMT>
int launch_1x128(const T* x, int64_t rows, int64_t cols, uint8_t* out, float* scale_inv,
                 cudaStream_t stream) {
  if (rows == 0 || cols == 0) return 0;
  const int64_t tiles_per_row = (cols + kBlock - 1) / kBlock;
  const int warps = 8;
  const int64_t blocks = (rows * tiles_per_row + warps - 1) / warps;
  if (blocks > 2147483647LL) return static_cast<int>(cudaErrorInvalidConfiguration);
  cast_1x128_kernel<T, FMT><<<static_cast<unsigned>(blocks), warps * 32, 0, stream>>>(
      x, rows, cols, tiles_per_row, out, scale_inv);
  return last_error();
}

template <typename T, int FMT>
int launch_128x128(const T* x, int64_t rows, int64_t cols, uint8_t* out, float* scale_inv,
                   cudaStream_t stream) {
  if (rows == 0 || cols == 0) return 0;
  const int64_t gx = (cols + kBlock - 1) / kBlock, gy = (rows + kBlock - 1) / kBlock;
  if (gy > 65535) return static_cast<int>(cudaErrorInvalidConfiguration);
  dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
  cast_128x128_kernel<T, FMT><<<grid, 256, 0, stream>>>(x, rows, cols, out, scale_inv);
  return last_error();
}

}  // namespace
}  // namespace ap

#define AP_DISPATCH(LAUNCH)                                                                      \
  do {                                                                                           \
    const float* xf = static_cast<const float*>(x);                                              \
    const __nv_bfloat16* xb = static_cast<const __nv_bfloat16*>(x);                              \
    if (in_dtype == ap::kF32 && fmt == ap::kE4M3) return LAUNCH<float, ap::kE4M3>(xf, rows, cols, out, scale_inv, stream); \
    if (in_dtype == ap::kF32 && fmt == ap::kE5M2) return LAUNCH<float, ap::kE5M2>(xf, rows, cols, out, scale_inv, stream); \
    if (in_dtype == ap::kBF16 && fmt == ap::kE4M3) return LAUNCH<__nv_bfloat16, ap::kE4M3>(xb, rows, cols, out, scale_inv, stream); \
    if (in_dtype == ap::kBF16 && fmt == ap::kE5M2) return LAUNCH<__nv_bfloat16, ap::kE5M2>(xb, rows, cols, out, scale_inv, stream); \
    return static_cast<int>(cudaErrorInvalidValue);                                              \
  } while (0)

extern "C" int ap_blockwise_cast_1x128(const void* x, int in_dtype, int64_t rows, int64_t cols,
                                       int fmt, uint8_t* out, float* scale_inv,
                                       cudaStream_t stream) {
  AP_DISPATCH(ap::launch_1x128);
}

extern "C" int ap_blockwise_cast_128x128(const void* x, int in_dtype, int64_t rows, int64_t cols,
                                         int fmt, uint8_t* out, float* scale_inv,
                                         cudaStream_t stream) {
  AP_DISPATCH(ap::launch_128x128);
}
