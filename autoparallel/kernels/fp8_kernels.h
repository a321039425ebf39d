/* C launcher API of autoparallel's FP8 kernels (CUDA only: no torch headers, so nvcc can build
 * the .cu files on any machine; the torch binding is fp8_binding.cpp).
 *
 * Conventions shared with autoparallel/model/reference.py, each kernel's oracle:
 *   in_dtype  0 = float32, 1 = bfloat16 (contiguous, row-major)
 *   fmt       0 = float8_e4m3fn (max 448), 1 = float8_e5m2 (max 57344)
 *   casts     fp32 x * scale, round to nearest even, saturate to +-max (inf too), NaN stays NaN
 *   scale     fp8_max / amax * 2^-margin; an amax of 0, inf or NaN keeps the previous scale (1)
 *   amax      max |x| over the tensor, NaN if any element is NaN (written as float)
 * Every launcher returns a cudaError_t as int (0 = success) and is asynchronous on `stream`.
 */
#ifndef AUTOPARALLEL_FP8_KERNELS_H
#define AUTOPARALLEL_FP8_KERNELS_H

#include <stdint.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* amax only (the first half of current scaling). */
int ap_amax(const void* x, int in_dtype, int64_t n, float* amax_out, cudaStream_t stream);

/* Delayed scaling in one read: cast with a known device scale and record this tensor's amax. */
int ap_cast_amax(const void* x, int in_dtype, int64_t n, const float* scale, int fmt,
                 uint8_t* out, float* amax_out, cudaStream_t stream);

/* Current scaling: amax pass, then a cast pass that derives scale (and 1/scale) on the device;
 * no host round trip between them. */
int ap_current_scale_cast(const void* x, int in_dtype, int64_t n, int fmt, int margin,
                          uint8_t* out, float* scale_inv_out, float* amax_out,
                          cudaStream_t stream);

/* One read of a [rows, cols] tensor -> FP8 in both layouts ([rows, cols] and [cols, rows]),
 * plus amax: the operands of fprop and of dgrad / wgrad in one pass. */
int ap_cast_transpose(const void* x, int in_dtype, int64_t rows, int64_t cols,
                      const float* scale, int fmt, uint8_t* out, uint8_t* out_t,
                      float* amax_out, cudaStream_t stream);

/* 1x128 tiles along the last dim (DeepSeek-V3 activations / gradients); a ragged last tile is
 * allowed. scale_inv is [rows, ceil(cols / 128)]. */
int ap_blockwise_cast_1x128(const void* x, int in_dtype, int64_t rows, int64_t cols, int fmt,
                            uint8_t* out, float* scale_inv, cudaStream_t stream);

/* 128x128 blocks (weights). scale_inv is [ceil(rows / 128), ceil(cols / 128)]. */
int ap_blockwise_cast_128x128(const void* x, int in_dtype, int64_t rows, int64_t cols, int fmt,
                              uint8_t* out, float* scale_inv, cudaStream_t stream);

/* Delayed-scaling update of n tensors in one launch, in place. history is [n, len] (column 0 =
 * this step's amax), scale [n], fp8_max [n]. Per row: amax = max(row) or row[0] (most_recent),
 * new scale unless amax is 0 / non-finite, roll the row left by one, zero column 0.
 * len must be <= 8192 (the row is staged in shared memory). */
int ap_delayed_scaling_update(float* history, float* scale, const float* fp8_max, int64_t n,
                              int64_t len, int margin, int most_recent, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
