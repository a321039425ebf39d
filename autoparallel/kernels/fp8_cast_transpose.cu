// Cast + transpose: one read of X gives FP8 X (row-major, for fprop) and FP8 X^T (row-major,
// i.e. X column-major, for dgrad / wgrad with torch._scaled_mm), plus amax for delayed scaling.
#include "fp8_common.cuh"

namespace ap {
namespace {

constexpr int kTile = 32;
constexpr int kRowsPerPass = 8;  // blockDim = (32, 8): each thread casts 4 elements of a tile

template <typename T, int FMT>
__global__ void cast_transpose_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                      const float* __restrict__ scale, uint8_t* __restrict__ out,
                                      uint8_t* __restrict__ out_t, unsigned* __restrict__ amax) {
  __shared__ uint8_t tile[kTile][kTile + 4];  // padding avoids shared-memory bank conflicts
  __shared__ unsigned shared[32];
  const float s = *scale;
  const int64_t row0 = (int64_t)blockIdx.y * kTile, col0 = (int64_t)blockIdx.x * kTile;
  unsigned local = 0u;
  for (int r = threadIdx.y; r < kTile; r += kRowsPerPass) {
    const int64_t row = row0 + r, col = col0 + threadIdx.x;
    if (row < rows && col < cols) {
      const float v = load(x, row * cols + col);
      local = max(local, abs_bits(v));
      const uint8_t q = cast_fp8<FMT>(v * s);
      out[row * cols + col] = q;
      tile[r][threadIdx.x] = q;
    }
  }
  __syncthreads();
  for (int c = threadIdx.y; c < kTile; c += kRowsPerPass) {
    const int64_t col = col0 + c, row = row0 + threadIdx.x;
    if (row < rows && col < cols) out_t[col * rows + row] = tile[threadIdx.x][c];
  }
  // block_max needs a flat thread index: reuse it through a 1-D view of the 2-D block.
  const int flat = threadIdx.y * kTile + threadIdx.x;
  local = warp_max(local);
  if ((flat & 31) == 0) shared[flat >> 5] = local;
  __syncthreads();
  if (flat < 32) {
    unsigned v = flat < (kTile * kRowsPerPass) / 32 ? shared[flat] : 0u;
    v = warp_max(v);
    if (flat == 0 && v) atomicMax(amax, v);
  }
}

template <typename T, int FMT>
int launch(const T* x, int64_t rows, int64_t cols, const float* scale, uint8_t* out,
           uint8_t* out_t, float* amax_out, cudaStream_t stream) {
  cudaError_t err = cudaMemsetAsync(amax_out, 0, sizeof(float), stream);
  if (err != cudaSuccess) return static_cast<int>(err);
  if (rows == 0 || cols == 0) return 0;
  const int64_t gx = (cols + kTile - 1) / kTile, gy = (rows + kTile - 1) / kTile;
  if (gy > 65535) return static_cast<int>(cudaErrorInvalidConfiguration);
  dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), block(kTile, kRowsPerPass);
  cast_transpose_kernel<T, FMT><<<grid, block, 0, stream>>>(
      x, rows, cols, scale, out, out_t, reinterpret_cast<unsigned*>(amax_out));
  return last_error();
}

}  // namespace
}  // namespace ap

extern "C" int ap_cast_transpose(const void* x, int in_dtype, int64_t rows, int64_t cols,
                                 const float* scale, int fmt, uint8_t* out, uint8_t* out_t,
                                 float* amax_out, cudaStream_t stream) {
  using namespace ap;
  const float* xf = static_cast<const float*>(x);
  const __nv_bfloat16* xb = static_cast<const __nv_bfloat16*>(x);
  if (in_dtype == kF32 && fmt == kE4M3) return launch<float, kE4M3>(xf, rows, cols, scale, out, out_t, amax_out, stream);
  if (in_dtype == kF32 && fmt == kE5M2) return launch<float, kE5M2>(xf, rows, cols, scale, out, out_t, amax_out, stream);
  if (in_dtype == kBF16 && fmt == kE4M3) return launch<__nv_bfloat16, kE4M3>(xb, rows, cols, scale, out, out_t, amax_out, stream);
  if (in_dtype == kBF16 && fmt == kE5M2) return launch<__nv_bfloat16, kE5M2>(xb, rows, cols, scale, out, out_t, amax_out, stream);
  return static_cast<int>(cudaErrorInvalidValue);
}
