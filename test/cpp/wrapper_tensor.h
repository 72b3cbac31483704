#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>

#include <cstdint>
#include <utility>

namespace aliasguard::testing {

// A tensor shaped like what _make_wrapper_subclass builds: Python dispatch
// keys and a float placeholder storage of `nbytes` without data.
inline at::Tensor make_wrapper(
    at::IntArrayRef sizes,
    at::IntArrayRef strides,
    int64_t nbytes,
    c10::Device device = c10::Device(c10::kCPU)) {
  c10::Storage storage(
      c10::Storage::use_byte_size_t(),
      nbytes,
      c10::DataPtr(nullptr, device),
      /*allocator=*/nullptr,
      /*resizable=*/false);
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      std::move(storage),
      c10::DispatchKeySet(c10::DispatchKey::CPU),
      caffe2::TypeMeta::Make<float>());
  impl->set_python_dispatch(true); // as _make_wrapper_subclass does
  impl->set_sizes_and_strides(sizes, strides);
  return at::Tensor(std::move(impl));
}

// Contiguous, with a storage just large enough.
inline at::Tensor make_wrapper(
    at::IntArrayRef sizes,
    c10::Device device = c10::Device(c10::kCPU)) {
  const int64_t numel = c10::multiply_integers(sizes);
  const at::Tensor wrapper = make_wrapper(
      sizes, sizes, numel * static_cast<int64_t>(sizeof(float)), device);
  wrapper.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  return wrapper;
}

} // namespace aliasguard::testing
