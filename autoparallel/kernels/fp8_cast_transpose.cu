// Cast + transpose: one read of X gives FP8 X (row-major, for fprop) and FP8 X^T (row-major,
// i.e. X column-major, for dgrad / wgrad with torch._scaled_mm), and folds |X| into an amax.
//
// A block of 256 threads walks 64x64 tiles. Phase 1: thread (r, k) loads 16 elements of row r
// with 16-byte loads, casts them, stores the 16 FP8 bytes to X's row-major output and to a
// 64x64-byte shared tile. Phase 2: thread (c, j) gathers tile bytes [16j, 16j+16) of column c
// and writes them to X^T with one 16-byte store; the four threads of one c are adjacent, so each
// 64-byte segment of an X^T row is written whole by one warp instruction (full 32-byte sectors;
// with j the slow index each store half-filled a sector, 63 % of HBM peak on an H100). The
// tile's 16-byte chunks are XOR-swizzled by (row / 16) % 4, so phase 2's byte reads, rows 16
// apart across j, land in different banks. Shapes whose dims are not multiples of 16 (or
// misaligned pointers) take a plain per-element kernel.
#include "fp8_common.cuh"

namespace ap {
namespace {

constexpr int kTile = 64;
constexpr int kThreads = 256;

template <typename T, int FMT>
__global__ void cast_transpose_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                      ScaleSource src, uint8_t* __restrict__ out,
                                      uint8_t* __restrict__ out_t, unsigned* __restrict__ amax,
                                      float* __restrict__ scale_inv) {
  __shared__ uint4 tile[kTile][kTile / kChunk];
  __shared__ unsigned shared[32];
  const float s = src.get(fp8_max(FMT));
  if (scale_inv && blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = 1.0f / s;
  const int64_t tiles_x = (cols + kTile - 1) / kTile;
  const int64_t tiles = tiles_x * ((rows + kTile - 1) / kTile);
  const int r = threadIdx.x >> 2, k = threadIdx.x & 3;      // phase 1
  const int c = threadIdx.x >> 2, j = threadIdx.x & 3;      // phase 2
  unsigned local = 0u;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t row0 = t / tiles_x * kTile, col0 = t % tiles_x * kTile;
    const int64_t row = row0 + r, col = col0 + kChunk * k;
    if (row < rows && col < cols) {
      float v[kChunk];
      load16(x + row * cols + col, v);
      local = max(local, max_abs16(v));
      const uint4 q = cast16<FMT>(v, s);
      *reinterpret_cast<uint4*>(out + row * cols + col) = q;
      tile[r][k ^ ((r >> 4) & 3)] = q;
    }
    __syncthreads();
    const int64_t trow = col0 + c, tcol = row0 + kChunk * j;
    if (trow < cols && tcol < rows) {
      // rows 16j.. of column c: chunk c / 16, swizzled by j (= row / 16)
      const uint8_t* bytes =
          reinterpret_cast<const uint8_t*>(tile) + ((((c >> 4) ^ j) << 4) | (c & 15));
      unsigned w[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        w[q] = 0u;
#pragma unroll
        for (int b = 0; b < 4; ++b)
          w[q] |= unsigned(bytes[(kChunk * j + 4 * q + b) * kTile]) << (8 * b);
      }
      *reinterpret_cast<uint4*>(out_t + trow * rows + tcol) = make_uint4(w[0], w[1], w[2], w[3]);
    }
    __syncthreads();
  }
  if (amax) block_amax_to(local, shared, threadIdx.x, blockDim.x, amax);
}

// Any shape: one element per thread and step, both outputs written directly.
template <typename T, int FMT>
__global__ void cast_transpose_scalar_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                             ScaleSource src, uint8_t* __restrict__ out,
                                             uint8_t* __restrict__ out_t,
                                             unsigned* __restrict__ amax,
                                             float* __restrict__ scale_inv) {
  __shared__ unsigned shared[32];
  const float s = src.get(fp8_max(FMT));
  if (scale_inv && blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = 1.0f / s;
  unsigned local = 0u;
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const float v = load(x, i);
    local = max(local, abs_bits(v));
    const uint8_t q = cast_fp8<FMT>(v * s);
    out[i] = q;
    out_t[(i % cols) * rows + i / cols] = q;
  }
  if (amax) block_amax_to(local, shared, threadIdx.x, blockDim.x, amax);
}

template <typename T, int FMT>
int launch(const T* x, int64_t rows, int64_t cols, ScaleSource src, uint8_t* out, uint8_t* out_t,
           float* amax_out, bool accumulate, float* scale_inv, cudaStream_t stream) {
  if (amax_out && !accumulate) {
    cudaError_t err = cudaMemsetAsync(amax_out, 0, sizeof(float), stream);
    if (err != cudaSuccess) return static_cast<int>(err);
  }
  unsigned* amax = reinterpret_cast<unsigned*>(amax_out);
  const bool vec = rows % kChunk == 0 && cols % kChunk == 0 && aligned16(x) && aligned16(out) &&
                   aligned16(out_t);
  if (vec) {
    const int64_t tiles = ((rows + kTile - 1) / kTile) * ((cols + kTile - 1) / kTile);
    cast_transpose_kernel<T, FMT><<<blocks_for(tiles, 1, 16384), kThreads, 0, stream>>>(
        x, rows, cols, src, out, out_t, amax, scale_inv);
  } else {
    cast_transpose_scalar_kernel<T, FMT><<<blocks_for(rows * cols, kThreads, 4096), kThreads, 0,
                                           stream>>>(x, rows, cols, src, out, out_t, amax,
                                                     scale_inv);
  }
  return last_error();
}

}  // namespace
}  // namespace ap

#define AP_CT_DISPATCH(SRC, AMAX, ACC, SCALE_INV)                                                      \
  do {                                                                                           \
    const float* xf = static_cast<const float*>(x);                                              \
    const __nv_bfloat16* xb = static_cast<const __nv_bfloat16*>(x);                              \
    using namespace ap;                                                                          \
    if (in_dtype == kF32 && fmt == kE4M3) return launch<float, kE4M3>(xf, rows, cols, SRC, out, out_t, AMAX, ACC, SCALE_INV, stream); \
    if (in_dtype == kF32 && fmt == kE5M2) return launch<float, kE5M2>(xf, rows, cols, SRC, out, out_t, AMAX, ACC, SCALE_INV, stream); \
    if (in_dtype == kBF16 && fmt == kE4M3) return launch<__nv_bfloat16, kE4M3>(xb, rows, cols, SRC, out, out_t, AMAX, ACC, SCALE_INV, stream); \
    if (in_dtype == kBF16 && fmt == kE5M2) return launch<__nv_bfloat16, kE5M2>(xb, rows, cols, SRC, out, out_t, AMAX, ACC, SCALE_INV, stream); \
    return static_cast<int>(cudaErrorInvalidValue);                                             \
  } while (0)

extern "C" int ap_cast_transpose(const void* x, int in_dtype, int64_t rows, int64_t cols,
                                 const float* scale, int fmt, uint8_t* out, uint8_t* out_t,
                                 float* amax_out, int accumulate, cudaStream_t stream) {
  const ap::ScaleSource src{scale, nullptr, 0};
  AP_CT_DISPATCH(src, amax_out, accumulate != 0, nullptr);
}

extern "C" int ap_current_scale_cast_transpose(const void* x, int in_dtype, int64_t rows,
                                               int64_t cols, int fmt, int margin, uint8_t* out,
                                               uint8_t* out_t, float* scale_inv_out,
                                               float* amax_out, cudaStream_t stream) {
  int err = ap_amax(x, in_dtype, rows * cols, amax_out, stream);
  if (err) return err;
  // The amax pass above already holds |X|: this pass derives the scale from it and only casts.
  const ap::ScaleSource src{nullptr, reinterpret_cast<const unsigned*>(amax_out), margin};
  AP_CT_DISPATCH(src, nullptr, false, scale_inv_out);
}
