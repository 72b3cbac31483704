#include <torch/csrc/autograd/storage_alias.h>
#include <torch/csrc/utils/torch_internals.h>

#include <c10/util/StringUtil.h>
#include <c10/util/safe_numerics.h>

namespace aliasguard::autograd {

// Note [May a tensor alias a storage]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Giving a tensor another tensor's storage (set_storage_keep_dtype) keeps its
// sizes, strides, offset and dtype, so nothing stops it from describing
// memory the storage does not have. Stock PyTorch never builds such a tensor
// (set_ and as_strided check bounds), so everything downstream trusts it;
// reading one is a segfault, not an error. The rules:
//   * same device as the storage, the device the tensor's own storage is on
//     (a fake tensor reports the device it stands for, its storage is meta);
//   * a placeholder storage (a wrapper subclass's: no data) may only be
//     given to another placeholder tensor (whatever the layouts: no data is
//     read through either): a tensor with data of its own would then read
//     through a null pointer;
//   * a real storage only from a strided tensor, and only to a strided
//     tensor or to a wrapper of another layout (a jagged nested tensor over
//     its values, which never addresses it through sizes and strides):
//     other layouts have no storage (sparse) or would misread it. A
//     placeholder wrapper that carries the NestedTensor key is taken to be
//     of another layout without asking it: see Note [Nested wrappers are
//     not asked their layout];
//   * a real storage must hold every element the tensor can address. The
//     bound is computed on int64 with checked multiplication: the SymInt
//     computation (See Note [Storage bytes of symbolic sizes]) does not
//     detect overflow,
//     so a stride of 2**62 wraps around to a small, "valid" size. Symbolic
//     sizes (tracing) are compared symbolically, as the SymInt path does.
// Differentiable views add dtype and layout rules: autograd replays a view
// with as_strided (or the given view_fn) on its base, which is meaningless
// when the view reinterprets the base's bytes as another dtype (stock
// view(dtype) is not differentiable; view_as_real/view_as_complex are, and
// are allowed with the view_fn that replays them: as_strided would replay
// them in the base's dtype) or when either is not strided (a sparse base would
// get a dense gradient of the wrong values).

namespace {

std::optional<std::vector<int64_t>> concrete(c10::SymIntArrayRef values) {
  std::vector<int64_t> result;
  result.reserve(values.size());
  for (const c10::SymInt& value : values) {
    const auto maybe = value.maybe_as_int();
    if (!maybe.has_value()) {
      return std::nullopt;
    }
    result.push_back(*maybe);
  }
  return result;
}

std::optional<std::string> bounds_problem(
    const at::Tensor& tensor,
    const at::Tensor& base,
    const AliasNames& names) {
  const c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
  const c10::Storage& storage = storage_of(base);
  const auto sizes = concrete(impl->sym_sizes());
  const auto strides = concrete(impl->sym_strides());
  const auto offset = impl->sym_storage_offset().maybe_as_int();
  const auto available = storage.sym_nbytes().maybe_as_int();
  if (!sizes || !strides || !offset || !available) {
    // Tracing with symbolic shapes: no data is read, compare symbolically.
    const c10::SymInt needed = internals::symbolic_storage_nbytes(
        impl->sym_sizes(),
        impl->sym_strides(),
        impl->dtype().itemsize(),
        impl->sym_storage_offset());
    if (needed <= storage.sym_nbytes()) {
      return std::nullopt;
    }
    return c10::str(
        "the sizes, strides and storage offset of ",
        names.tensor,
        " need ",
        needed,
        " bytes of storage but ",
        names.base_storage,
        " has ",
        storage.sym_nbytes());
  }
  const auto needed = checked_storage_nbytes(
      *sizes, *strides, *offset, impl->dtype().itemsize());
  if (!needed.has_value()) {
    return c10::str(
        "the sizes ",
        c10::IntArrayRef(*sizes),
        ", strides ",
        c10::IntArrayRef(*strides),
        " and storage offset ",
        *offset,
        " of ",
        names.tensor,
        " are negative or address more bytes than int64 can count");
  }
  if (*needed <= *available) {
    return std::nullopt;
  }
  return c10::str(
      "the sizes, strides and storage offset of ",
      names.tensor,
      " need ",
      *needed,
      " bytes of storage but ",
      names.base_storage,
      " has ",
      *available);
}

// Where the tensor's kernels address memory: its own storage's device, not
// the device it reports. A fake tensor reports the device it stands in for
// (cpu) while its storage, and every kernel run on it, is meta; given a cpu
// wrapper's placeholder it would hand meta kernels a cpu storage.
c10::Device storage_device_of(const at::Tensor& tensor) {
  if (tensor.has_storage()) {
    return storage_of(tensor).device();
  }
  return tensor.device();
}

bool is_complex_pair(c10::ScalarType a, c10::ScalarType b) {
  return c10::isComplexType(a) && c10::toRealValueType(a) == b;
}

} // namespace

std::optional<int64_t> checked_storage_nbytes(
    c10::IntArrayRef sizes,
    c10::IntArrayRef strides,
    int64_t storage_offset,
    size_t itemsize) {
  if (sizes.size() != strides.size() || storage_offset < 0) {
    return std::nullopt;
  }
  for (const int64_t size : sizes) {
    if (size < 0) {
      return std::nullopt;
    }
    if (size == 0) {
      return 0;
    }
  }
  // The last element's index: offset + sum((size - 1) * stride).
  int64_t last = storage_offset;
  for (size_t d = 0; d < sizes.size(); ++d) {
    int64_t step = 0;
    if (strides[d] < 0 || c10::mul_overflows(sizes[d] - 1, strides[d], &step) ||
        c10::add_overflows(last, step, &last)) {
      return std::nullopt;
    }
  }
  int64_t nbytes = 0;
  if (c10::add_overflows(last, int64_t{1}, &last) ||
      c10::mul_overflows(last, static_cast<int64_t>(itemsize), &nbytes)) {
    return std::nullopt;
  }
  return nbytes;
}

std::optional<std::string> storage_alias_problem(
    const at::Tensor& tensor,
    const at::Tensor& base,
    const AliasNames& names) {
  if (!base.has_storage()) {
    return c10::str(
        names.base,
        " (layout ",
        base.layout(),
        ") has no storage it could share");
  }
  const c10::Device storage_device = storage_of(base).device();
  const c10::Device tensor_device = storage_device_of(tensor);
  if (tensor_device != storage_device) {
    return c10::str(
        names.tensor,
        " is on ",
        tensor_device,
        " but ",
        names.base_storage,
        " is on ",
        storage_device);
  }
  if (has_placeholder_storage(base)) {
    if (has_placeholder_storage(tensor)) {
      return std::nullopt; // no data is ever read through either
    }
    return c10::str(
        names.tensor,
        " is a tensor with data, but ",
        names.base_storage,
        " is a wrapper subclass's placeholder without data: reading ",
        names.tensor,
        " through it would crash");
  }
  if (base.layout() != c10::kStrided) {
    if (has_placeholder_storage(tensor) && tensor.layout() == base.layout()) {
      // A wrapper of another layout that was itself given a real storage (a
      // jagged nested tensor holding its values' storage) passes it on to a
      // view of the same layout (its transpose): neither addresses the
      // storage through sizes and strides, and no kernel reads it directly.
      return std::nullopt;
    }
    return c10::str(
        names.base,
        " has layout ",
        base.layout(),
        "; only a strided tensor's storage can be shared");
  }
  // Note [Nested wrappers are not asked their layout]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // A wrapper whose layout is answered in Python (dispatch_layout=True) is
  // asked through its __torch_dispatch__, a call stock never makes after a
  // view op and which costs as much as the op's whole correction. The
  // nested jagged tensor is such a wrapper, and gets a view of its values
  // on every construction (_nested_view_from_jagged). Its class gives it the
  // NestedTensor key, which no strided wrapper carries (torch's strided
  // nested tensor is NestedTensorImpl, with a real storage), and a
  // placeholder with that key gets the answer the question would give: it
  // does not address the storage through sizes and strides.
  if (has_placeholder_storage(tensor) && tensor.is_nested()) {
    return std::nullopt;
  }
  if (tensor.layout() != c10::kStrided) {
    if (has_placeholder_storage(tensor)) {
      // A wrapper of another layout (a jagged nested tensor over its values
      // buffer) does not address the storage through sizes and strides, and
      // no kernel reads it directly: nothing to bound.
      return std::nullopt;
    }
    return c10::str(
        names.tensor,
        " has layout ",
        tensor.layout(),
        "; only a strided tensor (or a wrapper subclass) can be given a "
        "strided tensor's storage");
  }
  return bounds_problem(tensor, base, names);
}

std::optional<std::string> differentiable_view_problem(
    const at::Tensor& tensor,
    const at::Tensor& base,
    bool has_view_fn,
    const AliasNames& names) {
  if (tensor.layout() != base.layout() ||
      (!has_view_fn && base.layout() != c10::kStrided)) {
    return c10::str(
        names.tensor,
        " has layout ",
        tensor.layout(),
        " and ",
        names.base,
        " has layout ",
        base.layout(),
        ": a differentiable view is replayed with as_strided, which needs both "
        "strided (a view_fn allows other layouts, when both are the same)");
  }
  const c10::ScalarType from = base.scalar_type();
  const c10::ScalarType to = tensor.scalar_type();
  const bool complex_pair =
      is_complex_pair(from, to) || is_complex_pair(to, from);
  if (from != to && !(complex_pair && has_view_fn)) {
    return c10::str(
        names.tensor,
        " has dtype ",
        to,
        " but ",
        names.base,
        " has dtype ",
        from,
        ": reinterpreting memory as another dtype is not differentiable (stock "
        "view(dtype) is not either; a complex/real pair is, given the view_fn "
        "that replays it, e.g. torch.view_as_real); mark it with "
        "is_bw_differentiable=False and is_fw_differentiable=False");
  }
  return std::nullopt;
}

} // namespace aliasguard::autograd
