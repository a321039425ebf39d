/* C launcher API of the fused SwiGLU kernels (swiglu.cu; no torch headers, like fp8_kernels.h).
 *
 *   h      [rows, 2F] contiguous, row-major: gate = h[:, :F], up = h[:, F:] (the MLP's first
 *          Linear's output, as torch.chunk(h, 2, -1) splits it)
 *   dtype  0 = float32, 1 = bfloat16 (h, y, dy and dh share it)
 *   forward   y[rows, F] = silu(gate) * up, the SiLU rounded to dtype before the product
 *   backward  dh[rows, 2F] = [dy * up * s * (1 + gate * (1 - s)) | dy * gate * s],
 *             s = sigmoid(gate), in FP32 with each operation rounded on its own
 * 16-byte aligned pointers and F a multiple of 16 / sizeof(dtype) take the vector path, others a
 * per-element one. Returns a cudaError_t as int (0 = success); asynchronous on `stream`.
 */
#ifndef AUTOPARALLEL_SWIGLU_H
#define AUTOPARALLEL_SWIGLU_H

#include <stdint.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

int ap_swiglu_forward(const void* h, int dtype, int64_t rows, int64_t f, void* y,
                      cudaStream_t stream);

int ap_swiglu_backward(const void* h, const void* dy, int dtype, int64_t rows, int64_t f,
                       void* dh, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
