// torch binding of the FP8 and SwiGLU kernels: allocates outputs, checks arguments, passes the
// current CUDA stream. Built only on CUDA machines by autoparallel/model/kernels.py (it needs the
// c10/cuda headers that CPU-only torch wheels lack); the kernels themselves are plain CUDA.
#include <ATen/cuda/CUDAContext.h>
#include <torch/extension.h>

#include <optional>

#include "fp8_kernels.h"
#include "swiglu.h"

namespace {

int in_dtype_code(const at::Tensor& x) {
  if (x.scalar_type() == at::kFloat) return 0;
  if (x.scalar_type() == at::kBFloat16) return 1;
  TORCH_CHECK(false, "FP8 kernels take float32 or bfloat16 input, got ", x.scalar_type());
}

at::ScalarType fp8_type(int64_t fmt) {
  TORCH_CHECK(fmt == 0 || fmt == 1, "fmt must be 0 (e4m3fn) or 1 (e5m2), got ", fmt);
  return fmt == 0 ? at::kFloat8_e4m3fn : at::kFloat8_e5m2;
}

void check_input(const at::Tensor& x, int64_t dims) {
  TORCH_CHECK(x.is_cuda(), "FP8 kernels need a CUDA tensor");
  TORCH_CHECK(x.is_contiguous(), "FP8 kernels need a contiguous tensor");
  TORCH_CHECK(dims < 0 || x.dim() == dims, "expected a ", dims, "-D tensor, got ", x.dim(), "-D");
}

void check(int err, const char* what) {
  TORCH_CHECK(err == 0, what, " failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
}

at::Tensor scalar_f32(const at::Tensor& like) {
  return at::empty({}, like.options().dtype(at::kFloat));
}

uint8_t* bytes(at::Tensor& t) { return reinterpret_cast<uint8_t*>(t.data_ptr()); }

at::Tensor amax(const at::Tensor& x) {
  check_input(x, -1);
  at::Tensor out = scalar_f32(x);
  check(ap_amax(x.data_ptr(), in_dtype_code(x), x.numel(), out.data_ptr<float>(),
                at::cuda::getCurrentCUDAStream()), "ap_amax");
  return out;
}

void check_scale(const at::Tensor& scale, const char* name) {
  TORCH_CHECK(scale.is_cuda() && scale.scalar_type() == at::kFloat && scale.numel() == 1,
              name, " must be a one-element float32 CUDA tensor");
}

// The amax to write: `amax_out` (a running max the kernel folds into, e.g. a slot of the
// delayed-scaling history) when given, else a fresh scalar.
at::Tensor amax_target(const at::Tensor& x, const std::optional<at::Tensor>& amax_out) {
  if (!amax_out) return scalar_f32(x);
  check_scale(*amax_out, "amax_out");
  return *amax_out;
}

std::vector<at::Tensor> cast_amax(const at::Tensor& x, int64_t fmt, const at::Tensor& scale,
                                  const std::optional<at::Tensor>& amax_out) {
  check_input(x, -1);
  check_scale(scale, "scale");
  at::Tensor out = at::empty_like(x, x.options().dtype(fp8_type(fmt)));
  at::Tensor a = amax_target(x, amax_out);
  check(ap_cast_amax(x.data_ptr(), in_dtype_code(x), x.numel(), scale.data_ptr<float>(),
                     static_cast<int>(fmt), bytes(out), a.data_ptr<float>(),
                     amax_out ? 1 : 0, at::cuda::getCurrentCUDAStream()), "ap_cast_amax");
  return {out, a};
}

std::vector<at::Tensor> current_scale_cast(const at::Tensor& x, int64_t fmt, int64_t margin) {
  check_input(x, -1);
  at::Tensor out = at::empty_like(x, x.options().dtype(fp8_type(fmt)));
  at::Tensor scale_inv = scalar_f32(x), a = scalar_f32(x);
  check(ap_current_scale_cast(x.data_ptr(), in_dtype_code(x), x.numel(), static_cast<int>(fmt),
                              static_cast<int>(margin), bytes(out), scale_inv.data_ptr<float>(),
                              a.data_ptr<float>(), at::cuda::getCurrentCUDAStream()),
        "ap_current_scale_cast");
  return {out, scale_inv, a};
}

std::vector<at::Tensor> cast_transpose(const at::Tensor& x, int64_t fmt, const at::Tensor& scale,
                                       const std::optional<at::Tensor>& amax_out) {
  check_input(x, 2);
  check_scale(scale, "scale");
  const int64_t rows = x.size(0), cols = x.size(1);
  auto options = x.options().dtype(fp8_type(fmt));
  at::Tensor out = at::empty({rows, cols}, options), out_t = at::empty({cols, rows}, options);
  at::Tensor a = amax_target(x, amax_out);
  check(ap_cast_transpose(x.data_ptr(), in_dtype_code(x), rows, cols, scale.data_ptr<float>(),
                          static_cast<int>(fmt), bytes(out), bytes(out_t), a.data_ptr<float>(),
                          amax_out ? 1 : 0, at::cuda::getCurrentCUDAStream()),
        "ap_cast_transpose");
  return {out, out_t, a};
}

std::vector<at::Tensor> current_scale_cast_transpose(const at::Tensor& x, int64_t fmt,
                                                     int64_t margin) {
  check_input(x, 2);
  const int64_t rows = x.size(0), cols = x.size(1);
  auto options = x.options().dtype(fp8_type(fmt));
  at::Tensor out = at::empty({rows, cols}, options), out_t = at::empty({cols, rows}, options);
  at::Tensor scale_inv = scalar_f32(x), a = scalar_f32(x);
  check(ap_current_scale_cast_transpose(x.data_ptr(), in_dtype_code(x), rows, cols,
                                        static_cast<int>(fmt), static_cast<int>(margin),
                                        bytes(out), bytes(out_t), scale_inv.data_ptr<float>(),
                                        a.data_ptr<float>(), at::cuda::getCurrentCUDAStream()),
        "ap_current_scale_cast_transpose");
  return {out, out_t, scale_inv, a};
}

// h = [gate | up] along the last dim (2F wide) -> silu(gate) * up, F wide.
at::Tensor swiglu_forward(const at::Tensor& h) {
  check_input(h, -1);
  const int64_t f = h.size(-1) / 2;
  TORCH_CHECK(h.size(-1) == 2 * f, "swiglu needs an even last dim, got ", h.size(-1));
  std::vector<int64_t> shape = h.sizes().vec();
  shape.back() = f;
  at::Tensor y = at::empty(shape, h.options());
  check(ap_swiglu_forward(h.data_ptr(), in_dtype_code(h), f ? h.numel() / (2 * f) : 0, f,
                          y.data_ptr(), at::cuda::getCurrentCUDAStream()),
        "ap_swiglu_forward");
  return y;
}

// d(h) = [d(gate) | d(up)] from h and the output's gradient dy.
at::Tensor swiglu_backward(const at::Tensor& h, const at::Tensor& dy) {
  check_input(h, -1);
  check_input(dy, h.dim());
  const int64_t f = h.size(-1) / 2;
  TORCH_CHECK(dy.scalar_type() == h.scalar_type() && dy.numel() * 2 == h.numel() &&
                  dy.size(-1) == f,
              "swiglu_backward: dy must be h's dtype and shape with half its last dim");
  at::Tensor dh = at::empty_like(h);
  check(ap_swiglu_backward(h.data_ptr(), dy.data_ptr(), in_dtype_code(h),
                           f ? h.numel() / (2 * f) : 0, f, dh.data_ptr(),
                           at::cuda::getCurrentCUDAStream()),
        "ap_swiglu_backward");
  return dh;
}

// [rows, tiles] scales stored outer-dim-major: allocated [tiles, rows] and returned transposed.
at::Tensor tile_scales(const at::Tensor& like, int64_t rows, int64_t cols) {
  return at::empty({(cols + 127) / 128, rows}, like.options().dtype(at::kFloat)).t();
}

std::vector<at::Tensor> blockwise_cast_1d(const at::Tensor& x, int64_t fmt) {
  check_input(x, 2);
  const int64_t rows = x.size(0), cols = x.size(1);
  at::Tensor out = at::empty({rows, cols}, x.options().dtype(fp8_type(fmt)));
  at::Tensor scale_inv = tile_scales(x, rows, cols);
  check(ap_blockwise_cast_1x128(x.data_ptr(), in_dtype_code(x), rows, cols, static_cast<int>(fmt),
                                bytes(out), scale_inv.data_ptr<float>(),
                                at::cuda::getCurrentCUDAStream()), "ap_blockwise_cast_1x128");
  return {out, scale_inv};
}

std::vector<at::Tensor> blockwise_cast_transpose_1d(const at::Tensor& x, int64_t fmt) {
  check_input(x, 2);
  const int64_t rows = x.size(0), cols = x.size(1);
  auto options = x.options().dtype(fp8_type(fmt));
  at::Tensor out = at::empty({rows, cols}, options), out_t = at::empty({cols, rows}, options);
  at::Tensor scale_inv = tile_scales(x, rows, cols), scale_inv_t = tile_scales(x, cols, rows);
  check(ap_blockwise_cast_transpose_1x128(x.data_ptr(), in_dtype_code(x), rows, cols,
                                          static_cast<int>(fmt), bytes(out),
                                          scale_inv.data_ptr<float>(), bytes(out_t),
                                          scale_inv_t.data_ptr<float>(),
                                          at::cuda::getCurrentCUDAStream()),
        "ap_blockwise_cast_transpose_1x128");
  return {out, scale_inv, out_t, scale_inv_t};
}

std::vector<at::Tensor> blockwise_cast_2d(const at::Tensor& x, int64_t fmt) {
  check_input(x, 2);
  const int64_t rows = x.size(0), cols = x.size(1);
  at::Tensor out = at::empty({rows, cols}, x.options().dtype(fp8_type(fmt)));
  at::Tensor scale_inv = at::empty({(rows + 127) / 128, (cols + 127) / 128},
                                   x.options().dtype(at::kFloat));
  check(ap_blockwise_cast_128x128(x.data_ptr(), in_dtype_code(x), rows, cols,
                                  static_cast<int>(fmt), bytes(out), scale_inv.data_ptr<float>(),
                                  at::cuda::getCurrentCUDAStream()), "ap_blockwise_cast_128x128");
  return {out, scale_inv};
}

void delayed_scaling_update(at::Tensor history, at::Tensor scale, at::Tensor scale_inv,
                            const at::Tensor& fp8_max, int64_t margin, bool most_recent) {
  check_input(history, 2);
  check_input(scale, 1);
  TORCH_CHECK(scale_inv.is_cuda() && scale_inv.dim() == 1,
              "scale_inv must be a 1-D CUDA tensor (strided is fine)");
  check_input(fp8_max, 1);
  TORCH_CHECK(history.scalar_type() == at::kFloat && scale.scalar_type() == at::kFloat &&
                  scale_inv.scalar_type() == at::kFloat && fp8_max.scalar_type() == at::kFloat,
              "history, scale, scale_inv and fp8_max must be float32");
  const int64_t n = history.size(1);
  TORCH_CHECK(scale.numel() == n && scale_inv.numel() == n && fp8_max.numel() == n,
              "scale, scale_inv and fp8_max need ", n, " entries (one per history column)");
  check(ap_delayed_scaling_update(history.data_ptr<float>(), scale.data_ptr<float>(),
                                  scale_inv.data_ptr<float>(), scale_inv.stride(0),
                                  fp8_max.data_ptr<float>(), n,
                                  history.size(0), static_cast<int>(margin), most_recent ? 1 : 0,
                                  at::cuda::getCurrentCUDAStream()),
        "ap_delayed_scaling_update");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "autoparallel FP8 kernels (see kernels/fp8_kernels.h)";
  m.def("amax", &amax);
  m.def("cast_amax", &cast_amax);
  m.def("current_scale_cast", &current_scale_cast);
  m.def("cast_transpose", &cast_transpose);
  m.def("current_scale_cast_transpose", &current_scale_cast_transpose);
  m.def("blockwise_cast_1d", &blockwise_cast_1d);
  m.def("blockwise_cast_transpose_1d", &blockwise_cast_transpose_1d);
  m.def("blockwise_cast_2d", &blockwise_cast_2d);
  m.def("delayed_scaling_update", &delayed_scaling_update);
  m.def("swiglu_forward", &swiglu_forward);
  m.def("swiglu_backward", &swiglu_backward);
}
