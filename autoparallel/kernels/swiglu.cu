// SwiGLU forward and backward, each one pass over the fused gate/up tensor.
//
// The MLP's first Linear writes h = [gate | up] ([rows, 2F]); eager PyTorch spends two kernels on
// silu(gate) * up and, in the FP32 backward the reference keeps (transformer._SwiGLU), three
// upcasts, six FP32 binary kernels, two downcasts and the concatenation of d(gate) and d(up):
// about 1 ms of a Llama-3-70B TP8 layer on an H100 for ~0.1 ms of bytes. Here each direction is
// one read and one write, with the reference's arithmetic: FP32 math, every product and sum
// rounded on its own (__fmul_rn / __fadd_rn: no FMA contraction, the order PyTorch's separate
// kernels use) and the forward's SiLU rounded to the input dtype before the product, as
// F.silu(gate) * up rounds it. So the outputs match the reference on the same GPU bit for bit,
// up to expf.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "swiglu.h"

namespace ap {
namespace {

constexpr int kThreads = 256;
constexpr int kBytes = 16;  // one vector load / store

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// torch's CUDA sigmoid and silu for float: 1 / (1 + exp(-x)) and x / (1 + exp(-x)).
__device__ __forceinline__ float sigmoid(float x) {
  return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x)));
}

template <typename T>
__device__ __forceinline__ T swiglu(T gate, T up) {
  const float g = to_float(gate);
  const T silu = from_float<T>(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))));
  return from_float<T>(__fmul_rn(to_float(silu), to_float(up)));
}

// d(gate) = dy * up * s * (1 + gate * (1 - s)), d(up) = dy * gate * s, s = sigmoid(gate),
// evaluated left to right as the reference's FP32 tensor expression is.
template <typename T>
__device__ __forceinline__ void swiglu_grad(T dy, T gate, T up, T* dgate, T* dup) {
  const float d = to_float(dy), a = to_float(gate), b = to_float(up);
  const float s = sigmoid(a);
  const float slope = __fadd_rn(1.0f, __fmul_rn(a, __fsub_rn(1.0f, s)));
  *dgate = from_float<T>(__fmul_rn(__fmul_rn(__fmul_rn(d, b), s), slope));
  *dup = from_float<T>(__fmul_rn(__fmul_rn(d, a), s));
}

template <typename T>
struct alignas(kBytes) Vec {
  static constexpr int kN = kBytes / sizeof(T);
  T v[kN];
};

// Element (row, col) of the [rows, F] output pairs with h[row, col] (gate) and h[row, F + col].
template <typename T, bool VEC>
__global__ void forward_kernel(const T* __restrict__ h, int64_t rows, int64_t f,
                               T* __restrict__ y) {
  constexpr int n = VEC ? Vec<T>::kN : 1;
  const int64_t per_row = f / n, total = rows * per_row;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < total; c += stride) {
    const int64_t row = c / per_row, col = (c - row * per_row) * n;
    const T* gate = h + row * 2 * f + col;
    if (VEC) {
      const Vec<T> a = *reinterpret_cast<const Vec<T>*>(gate);
      const Vec<T> b = *reinterpret_cast<const Vec<T>*>(gate + f);
      Vec<T> out;
#pragma unroll
      for (int k = 0; k < n; ++k) out.v[k] = swiglu(a.v[k], b.v[k]);
      *reinterpret_cast<Vec<T>*>(y + row * f + col) = out;
    } else {
      y[row * f + col] = swiglu(gate[0], gate[f]);
    }
  }
}

template <typename T, bool VEC>
__global__ void backward_kernel(const T* __restrict__ h, const T* __restrict__ dy, int64_t rows,
                                int64_t f, T* __restrict__ dh) {
  constexpr int n = VEC ? Vec<T>::kN : 1;
  const int64_t per_row = f / n, total = rows * per_row;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < total; c += stride) {
    const int64_t row = c / per_row, col = (c - row * per_row) * n;
    const int64_t in = row * 2 * f + col;
    if (VEC) {
      const Vec<T> a = *reinterpret_cast<const Vec<T>*>(h + in);
      const Vec<T> b = *reinterpret_cast<const Vec<T>*>(h + in + f);
      const Vec<T> d = *reinterpret_cast<const Vec<T>*>(dy + row * f + col);
      Vec<T> da, db;
#pragma unroll
      for (int k = 0; k < n; ++k) swiglu_grad(d.v[k], a.v[k], b.v[k], &da.v[k], &db.v[k]);
      *reinterpret_cast<Vec<T>*>(dh + in) = da;
      *reinterpret_cast<Vec<T>*>(dh + in + f) = db;
    } else {
      swiglu_grad(dy[row * f + col], h[in], h[in + f], dh + in, dh + in + f);
    }
  }
}

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kBytes == 0; }

int blocks(int64_t work) {
  const int64_t b = (work + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : (b > 65536 ? 65536 : b));
}

template <typename T>
int launch_forward(const void* h, int64_t rows, int64_t f, void* y, cudaStream_t stream) {
  const T* in = static_cast<const T*>(h);
  T* out = static_cast<T*>(y);
  if (f % Vec<T>::kN == 0 && aligned(h) && aligned(y)) {
    forward_kernel<T, true><<<blocks(rows * f / Vec<T>::kN), kThreads, 0, stream>>>(in, rows, f,
                                                                                    out);
  } else {
    forward_kernel<T, false><<<blocks(rows * f), kThreads, 0, stream>>>(in, rows, f, out);
  }
  return static_cast<int>(cudaGetLastError());
}

template <typename T>
int launch_backward(const void* h, const void* dy, int64_t rows, int64_t f, void* dh,
                    cudaStream_t stream) {
  const T *in = static_cast<const T*>(h), *grad = static_cast<const T*>(dy);
  T* out = static_cast<T*>(dh);
  if (f % Vec<T>::kN == 0 && aligned(h) && aligned(dy) && aligned(dh)) {
    backward_kernel<T, true><<<blocks(rows * f / Vec<T>::kN), kThreads, 0, stream>>>(
        in, grad, rows, f, out);
  } else {
    backward_kernel<T, false><<<blocks(rows * f), kThreads, 0, stream>>>(in, grad, rows, f, out);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace
}  // namespace ap

extern "C" int ap_swiglu_forward(const void* h, int dtype, int64_t rows, int64_t f, void* y,
                                 cudaStream_t stream) {
  if (rows * f == 0) return 0;
  if (dtype == 0) return ap::launch_forward<float>(h, rows, f, y, stream);
  if (dtype == 1) return ap::launch_forward<__nv_bfloat16>(h, rows, f, y, stream);
  return static_cast<int>(cudaErrorInvalidValue);
}

extern "C" int ap_swiglu_backward(const void* h, const void* dy, int dtype, int64_t rows,
                                  int64_t f, void* dh, cudaStream_t stream) {
  if (rows * f == 0) return 0;
  if (dtype == 0) return ap::launch_backward<float>(h, dy, rows, f, dh, stream);
  if (dtype == 1) return ap::launch_backward<__nv_bfloat16>(h, dy, rows, f, dh, stream);
  return static_cast<int>(cudaErrorInvalidValue);
}
