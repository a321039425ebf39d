// Blockwise FP8 casts (DeepSeek-V3): each 1x128 tile or 128x128 block gets its own scale from
// its own amax, computed and applied in the same kernel (one read of the input, no separate
// amax pass).
//
// Scale layouts are the ones torch._scaled_mm takes without a copy: 1x128 scales of a
// [rows, cols] tensor are [rows, cols/128] stored outer-dim-major (tile column by tile column,
// index tile * rows + row); 128x128 scales are [rows/128, cols/128] row-major.
//
// Vectorised kernels need dims that are multiples of 16 and 16-byte aligned pointers (the
// launchers check); other shapes take the per-element kernels at the end of the anonymous
// namespace (1x128 and 128x128), and the cast-transpose refuses them (the torch binding then
// runs the PyTorch reference).
#include "fp8_common.cuh"

namespace ap {
namespace {

constexpr int kBlock = 128;
constexpr int kThreads = 256;
constexpr int kLanesPerTile = kBlock / kChunk;  // 8 threads cover one 1x128 tile

// 1x128 tiles along rows: 8 consecutive lanes per tile, 16 elements each (16-byte loads, one
// 16-byte store), tile amax by shuffles among the 8 lanes.
template <typename T, int FMT>
__global__ void cast_1x128_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                  uint8_t* __restrict__ out, float* __restrict__ scale_inv) {
  const int64_t tiles_per_row = (cols + kBlock - 1) / kBlock;
  const int64_t jobs = rows * tiles_per_row * kLanesPerTile;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const int lane = threadIdx.x & 31;
  // Whole warps iterate together so that every lane takes part in the shuffles.
  for (int64_t base = blockIdx.x * (int64_t)blockDim.x + (threadIdx.x & ~31); base < jobs;
       base += stride) {
    const int64_t job = base + lane, tile = job / kLanesPerTile;
    const int64_t row = tile / tiles_per_row, tc = tile % tiles_per_row;
    const int64_t col = tc * kBlock + (job % kLanesPerTile) * kChunk;
    const bool valid = job < jobs && col < cols;
    float v[kChunk];
    if (valid) load16(x + row * cols + col, v);
    unsigned local = valid ? max_abs16(v) : 0u;
    local = warp_max(local, kLanesPerTile);
    const float s = compute_scale(__uint_as_float(local), fp8_max(FMT), 0, 1.0f);
    if (valid) *reinterpret_cast<uint4*>(out + row * cols + col) = cast16<FMT>(v, s);
    if (job < jobs && job % kLanesPerTile == 0) scale_inv[tc * rows + row] = 1.0f / s;
  }
}

// 128x128 blocks: one thread block per block; each thread keeps 4 chunks of 16 in registers,
// so the input is read once: block amax, then the cast from registers.
template <typename T, int FMT>
__global__ void cast_128x128_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                    uint8_t* __restrict__ out, float* __restrict__ scale_inv) {
  __shared__ unsigned shared[32];
  constexpr int kJobs = kBlock * kLanesPerTile / kThreads;  // 4 chunks per thread
  const int64_t blocks_x = (cols + kBlock - 1) / kBlock;
  const int64_t blocks = blocks_x * ((rows + kBlock - 1) / kBlock);
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const int64_t row0 = b / blocks_x * kBlock, col0 = b % blocks_x * kBlock;
    float v[kJobs][kChunk];
    bool valid[kJobs];
    unsigned local = 0u;
#pragma unroll
    for (int p = 0; p < kJobs; ++p) {
      const int job = threadIdx.x + kThreads * p;
      const int64_t row = row0 + (job / kLanesPerTile), col = col0 + (job % kLanesPerTile) * kChunk;
      valid[p] = row < rows && col < cols;
      if (valid[p]) {
        load16(x + row * cols + col, v[p]);
        local = max(local, max_abs16(v[p]));
      }
    }
    local = block_max(local, shared);
    const float s = compute_scale(__uint_as_float(local), fp8_max(FMT), 0, 1.0f);
#pragma unroll
    for (int p = 0; p < kJobs; ++p) {
      const int job = threadIdx.x + kThreads * p;
      const int64_t row = row0 + (job / kLanesPerTile), col = col0 + (job % kLanesPerTile) * kChunk;
      if (valid[p]) *reinterpret_cast<uint4*>(out + row * cols + col) = cast16<FMT>(v[p], s);
    }
    if (threadIdx.x == 0) scale_inv[b] = 1.0f / s;
  }
}

// 1x128 tiles along rows AND along columns from one read: a 128x128 tile is staged in shared
// memory (in the input type), row amaxes come from the load, column amaxes from a pass down the
// columns; then the rowwise cast writes X row-major and the columnwise cast writes X^T
// row-major with its own 1x128 scales (tiles along X's rows), as the wgrad GEMM wants them.
//
// Bank conflicts: a 16-byte shared access is served 8 threads at a time. In the load and the
// rowwise cast 8 consecutive threads own one row's 8 chunks of 16 elements; each thread visits
// its chunk's kVectors 16-byte pieces in an order rotated by (lane / (8 / kVectors)), so the 8
// threads of a step always touch 8 distinct 16-byte bank groups. The column passes read 32
// consecutive elements of one row per warp step: conflict-free as well.
template <typename T, int FMT>
__global__ void cast_transpose_1x128_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                            uint8_t* __restrict__ out, float* __restrict__ scale_inv,
                                            uint8_t* __restrict__ out_t,
                                            float* __restrict__ scale_inv_t) {
  extern __shared__ uint4 staged[];  // kBlock x kBlock elements of T
  __shared__ unsigned row_amax[kBlock];
  __shared__ unsigned col_amax[kThreads / kBlock][kBlock];
  constexpr int kV = Chunk16<T>::kVectors;
  constexpr int kJobs = kBlock * kLanesPerTile / kThreads;  // 4 row chunks per thread
  constexpr int kRowSplit = kThreads / kBlock;               // 2 threads per column
  const T* tile = reinterpret_cast<const T*>(staged);
  const int64_t tiles_x = (cols + kBlock - 1) / kBlock;
  const int64_t tiles = tiles_x * ((rows + kBlock - 1) / kBlock);
  const int k = threadIdx.x % kLanesPerTile;
  const int rot = k / (kLanesPerTile / kV);
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t row0 = t / tiles_x * kBlock, col0 = t % tiles_x * kBlock;
#pragma unroll
    for (int p = 0; p < kJobs; ++p) {  // load, stage, row amax
      const int r = (threadIdx.x + kThreads * p) / kLanesPerTile;
      const int64_t row = row0 + r, col = col0 + k * kChunk;
      Chunk16<T> c;
      unsigned local = 0u;
      if (row < rows && col < cols) {
        c = load_chunk(x + row * cols + col);
        float v[kChunk];
        to_float(c, v);
        local = max_abs16(v);
      } else {
#pragma unroll
        for (int q = 0; q < kV; ++q) c.raw[q] = make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
      for (int i = 0; i < kV; ++i) {
        const int q = (i + rot) % kV;
        staged[(r * kLanesPerTile + k) * kV + q] = c.raw[q];
      }
      local = warp_max(local, kLanesPerTile);
      if (k == 0) row_amax[r] = local;
    }
    __syncthreads();
    {  // column amax: thread (c, h) scans rows [h * 64, h * 64 + 64) of column c
      const int c = threadIdx.x % kBlock, h = threadIdx.x / kBlock;
      unsigned local = 0u;
      for (int r = h * (kBlock / kRowSplit); r < (h + 1) * (kBlock / kRowSplit); ++r)
        local = max(local, abs_bits(load(tile, r * kBlock + c)));
      col_amax[h][c] = local;
    }
    __syncthreads();
#pragma unroll
    for (int p = 0; p < kJobs; ++p) {  // rowwise cast
      const int r = (threadIdx.x + kThreads * p) / kLanesPerTile;
      const int64_t row = row0 + r, col = col0 + k * kChunk;
      const float s = compute_scale(__uint_as_float(row_amax[r]), fp8_max(FMT), 0, 1.0f);
      if (row < rows && col < cols) {
        Chunk16<T> c;
#pragma unroll
        for (int i = 0; i < kV; ++i) {
          const int q = (i + rot) % kV;
          c.raw[q] = staged[(r * kLanesPerTile + k) * kV + q];
        }
        float v[kChunk];
        to_float(c, v);
        *reinterpret_cast<uint4*>(out + row * cols + col) = cast16<FMT>(v, s);
        if (k == 0) scale_inv[(col0 / kBlock) * rows + row] = 1.0f / s;
      }
    }
#pragma unroll
    for (int p = 0; p < kJobs; ++p) {  // columnwise cast: 16 rows of one column per job
      const int job = threadIdx.x + kThreads * p;
      const int c = job % kBlock, j = job / kBlock;
      const int64_t trow = col0 + c, tcol = row0 + j * kChunk;
      unsigned amax = 0u;
#pragma unroll
      for (int h = 0; h < kRowSplit; ++h) amax = max(amax, col_amax[h][c]);
      const float s = compute_scale(__uint_as_float(amax), fp8_max(FMT), 0, 1.0f);
      if (trow < cols && tcol < rows) {
        float v[kChunk];
#pragma unroll
        for (int i = 0; i < kChunk; ++i) v[i] = load(tile, (j * kChunk + i) * kBlock + c);
        *reinterpret_cast<uint4*>(out_t + trow * rows + tcol) = cast16<FMT>(v, s);
        if (j == 0) scale_inv_t[(row0 / kBlock) * cols + trow] = 1.0f / s;
      }
    }
    __syncthreads();
  }
}

// Per-element fallbacks for shapes the vectorised kernels do not take.
template <typename T, int FMT>
__global__ void cast_1x128_scalar_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                         int64_t tiles_per_row, uint8_t* __restrict__ out,
                                         float* __restrict__ scale_inv) {
  const int lane = threadIdx.x & 31;
  const int64_t tile = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (tile >= rows * tiles_per_row) return;  // whole warps exit together
  const int64_t row = tile / tiles_per_row, tc = tile % tiles_per_row, col0 = tc * kBlock;
  float v[4];
  unsigned local = 0u;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int64_t col = col0 + lane + 32 * q;
    v[q] = col < cols ? load(x, row * cols + col) : 0.0f;
    local = max(local, abs_bits(v[q]));
  }
  local = warp_max(local);
  const float s = compute_scale(__uint_as_float(local), fp8_max(FMT), 0, 1.0f);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int64_t col = col0 + lane + 32 * q;
    if (col < cols) out[row * cols + col] = cast_fp8<FMT>(v[q] * s);
  }
  if (lane == 0) scale_inv[tc * rows + row] = 1.0f / s;
}

template <typename T, int FMT>
__global__ void cast_128x128_scalar_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
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

template <typename T>
bool vectorisable(const T* x, int64_t cols, const uint8_t* out) {
  return cols % kChunk == 0 && aligned16(x) && aligned16(out);
}

template <typename T, int FMT>
int launch_1x128(const T* x, int64_t rows, int64_t cols, uint8_t* out, float* scale_inv,
                 cudaStream_t stream) {
  if (rows == 0 || cols == 0) return 0;
  const int64_t tiles_per_row = (cols + kBlock - 1) / kBlock;
  if (vectorisable(x, cols, out)) {
    const int64_t jobs = rows * tiles_per_row * kLanesPerTile;
    cast_1x128_kernel<T, FMT><<<blocks_for(jobs, kThreads, 16384), kThreads, 0, stream>>>(
        x, rows, cols, out, scale_inv);
  } else {
    const int warps = 8;
    const int64_t blocks = (rows * tiles_per_row + warps - 1) / warps;
    if (blocks > 2147483647LL) return static_cast<int>(cudaErrorInvalidConfiguration);
    cast_1x128_scalar_kernel<T, FMT><<<static_cast<unsigned>(blocks), warps * 32, 0, stream>>>(
        x, rows, cols, tiles_per_row, out, scale_inv);
  }
  return last_error();
}

template <typename T, int FMT>
int launch_128x128(const T* x, int64_t rows, int64_t cols, uint8_t* out, float* scale_inv,
                   cudaStream_t stream) {
  if (rows == 0 || cols == 0) return 0;
  const int64_t gx = (cols + kBlock - 1) / kBlock, gy = (rows + kBlock - 1) / kBlock;
  if (vectorisable(x, cols, out)) {
    cast_128x128_kernel<T, FMT><<<blocks_for(gx * gy, 1, 16384), kThreads, 0, stream>>>(
        x, rows, cols, out, scale_inv);
  } else {
    if (gy > 65535) return static_cast<int>(cudaErrorInvalidConfiguration);
    dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
    cast_128x128_scalar_kernel<T, FMT><<<grid, kThreads, 0, stream>>>(x, rows, cols, out, scale_inv);
  }
  return last_error();
}

template <typename T, int FMT>
int launch_transpose_1x128(const T* x, int64_t rows, int64_t cols, uint8_t* out,
                           float* scale_inv, uint8_t* out_t, float* scale_inv_t,
                           cudaStream_t stream) {
  if (rows == 0 || cols == 0) return 0;
  if (rows % kChunk || !vectorisable(x, cols, out) || !aligned16(out_t))
    return static_cast<int>(cudaErrorInvalidValue);
  const int smem = kBlock * kBlock * static_cast<int>(sizeof(T));
  auto kernel = cast_transpose_1x128_kernel<T, FMT>;
  // fp32 tiles need 64 KiB, above the 48 KiB a launch gets without opting in.
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return static_cast<int>(err);
  const int64_t tiles = ((rows + kBlock - 1) / kBlock) * ((cols + kBlock - 1) / kBlock);
  kernel<<<blocks_for(tiles, 1, 16384), kThreads, smem, stream>>>(x, rows, cols, out, scale_inv,
                                                                  out_t, scale_inv_t);
  return last_error();
}

}  // namespace
}  // namespace ap

#define AP_DISPATCH(LAUNCH, ...)                                                                 \
  do {                                                                                           \
    const float* xf = static_cast<const float*>(x);                                              \
    const __nv_bfloat16* xb = static_cast<const __nv_bfloat16*>(x);                              \
    if (in_dtype == ap::kF32 && fmt == ap::kE4M3) return LAUNCH<float, ap::kE4M3>(xf, __VA_ARGS__); \
    if (in_dtype == ap::kF32 && fmt == ap::kE5M2) return LAUNCH<float, ap::kE5M2>(xf, __VA_ARGS__); \
    if (in_dtype == ap::kBF16 && fmt == ap::kE4M3) return LAUNCH<__nv_bfloat16, ap::kE4M3>(xb, __VA_ARGS__); \
    if (in_dtype == ap::kBF16 && fmt == ap::kE5M2) return LAUNCH<__nv_bfloat16, ap::kE5M2>(xb, __VA_ARGS__); \
    return static_cast<int>(cudaErrorInvalidValue);                                              \
  } while (0)

extern "C" int ap_blockwise_cast_1x128(const void* x, int in_dtype, int64_t rows, int64_t cols,
                                       int fmt, uint8_t* out, float* scale_inv,
                                       cudaStream_t stream) {
  AP_DISPATCH(ap::launch_1x128, rows, cols, out, scale_inv, stream);
}

extern "C" int ap_blockwise_cast_128x128(const void* x, int in_dtype, int64_t rows, int64_t cols,
                                         int fmt, uint8_t* out, float* scale_inv,
                                         cudaStream_t stream) {
  AP_DISPATCH(ap::launch_128x128, rows, cols, out, scale_inv, stream);
}

extern "C" int ap_blockwise_cast_transpose_1x128(const void* x, int in_dtype, int64_t rows,
                                                 int64_t cols, int fmt, uint8_t* out,
                                                 float* scale_inv, uint8_t* out_t,
                                                 float* scale_inv_t, cudaStream_t stream) {
  AP_DISPATCH(ap::launch_transpose_1x128, rows, cols, out, scale_inv, out_t, scale_inv_t, stream);
}
