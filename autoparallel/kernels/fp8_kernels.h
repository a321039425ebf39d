/* C launcher API of autoparallel's FP8 kernels (CUDA only: no torch headers, so nvcc can build
 * the .cu files on any machine; the torch binding is fp8_binding.cpp).
 *
 * Conventions shared with autoparallel/model/reference.py, each kernel's oracle:
 *   in_dtype  0 = float32, 1 = bfloat16 (contiguous, row-major)
 *   fmt       0 = float8_e4m3fn (max 448), 1 = float8_e5m2 (max 57344)
 *   casts     fp32 x * scale, round to nearest even, saturate to +-max (inf too), NaN stays NaN
 *   scale     fp8_max / amax * 2^-margin; an amax of 0, inf or NaN keeps the previous scale (1)
 *   amax      max |x| over the tensor, NaN if any element is NaN (written as float); with
 *             `accumulate` the launcher folds it into the value already there (a running max,
 *             how delayed scaling's micro-batches share one history slot) instead of replacing it
 *   1x128 scale_inv of a [rows, cols] tensor: [rows, ceil(cols / 128)] stored outer-dim-major
 *             (index tile * rows + row), the layout torch._scaled_mm takes for 1x128 operands
 * Every launcher returns a cudaError_t as int (0 = success) and is asynchronous on `stream`.
 * Vectorised paths move 16 elements per thread with 16-byte loads and stores where the pointers
 * are 16-byte aligned (and, for 2-D kernels, the dims multiples of 16); others fall back to
 * per-element kernels, except the blockwise cast-transpose, which refuses them.
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
                 uint8_t* out, float* amax_out, int accumulate, cudaStream_t stream);

/* Current scaling: amax pass, then a cast pass that derives scale (and 1/scale) on the device;
 * no host round trip between them. */
int ap_current_scale_cast(const void* x, int in_dtype, int64_t n, int fmt, int margin,
                          uint8_t* out, float* scale_inv_out, float* amax_out,
                          cudaStream_t stream);

/* One read of a [rows, cols] tensor -> FP8 in both layouts ([rows, cols] and [cols, rows]),
 * plus amax: the operands of fprop and of dgrad / wgrad in one pass. */
int ap_cast_transpose(const void* x, int in_dtype, int64_t rows, int64_t cols,
                      const float* scale, int fmt, uint8_t* out, uint8_t* out_t,
                      float* amax_out, int accumulate, cudaStream_t stream);

/* Current scaling in both layouts: amax pass, then the cast-transpose pass with the scale
 * derived on the device. */
int ap_current_scale_cast_transpose(const void* x, int in_dtype, int64_t rows, int64_t cols,
                                    int fmt, int margin, uint8_t* out, uint8_t* out_t,
                                    float* scale_inv_out, float* amax_out, cudaStream_t stream);

/* 1x128 tiles along the last dim (DeepSeek-V3 activations / gradients); a ragged last tile is
 * allowed. scale_inv is [rows, ceil(cols / 128)], outer-dim-major. */
int ap_blockwise_cast_1x128(const void* x, int in_dtype, int64_t rows, int64_t cols, int fmt,
                            uint8_t* out, float* scale_inv, cudaStream_t stream);

/* 1x128 tiles along rows (out, scale_inv as above) and along columns: out_t = FP8 X^T
 * [cols, rows] row-major with scale_inv_t [cols, ceil(rows / 128)], outer-dim-major; one read.
 * Needs rows and cols multiples of 16 and 16-byte aligned pointers (else cudaErrorInvalidValue). */
int ap_blockwise_cast_transpose_1x128(const void* x, int in_dtype, int64_t rows, int64_t cols,
                                      int fmt, uint8_t* out, float* scale_inv, uint8_t* out_t,
                                      float* scale_inv_t, cudaStream_t stream);

/* 128x128 blocks (weights). scale_inv is [ceil(rows / 128), ceil(cols / 128)], row-major. */
int ap_blockwise_cast_128x128(const void* x, int in_dtype, int64_t rows, int64_t cols, int fmt,
                              uint8_t* out, float* scale_inv, cudaStream_t stream);

/* Delayed-scaling update of n tensors in one launch, in place. history is [len, n] (row 0 =
 * this step's amax), scale and fp8_max [n], scale_inv n values scale_inv_stride floats apart.
 * Per column: a non-finite amax in row 0 counts as 0; amax = max(column) or row 0
 * (most_recent); new scale unless that amax is 0 / non-finite, scale_inv = 1 / scale; the
 * column rolls up by one and row 0 is cleared. */
int ap_delayed_scaling_update(float* history, float* scale, float* scale_inv,
                              int64_t scale_inv_stride, const float* fp8_max, int64_t n,
                              int64_t len, int margin, int most_recent, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
