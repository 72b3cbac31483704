#pragma once

#include <c10/core/DispatchKey.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/macros/AliasguardExport.h>
#include <torch/csrc/autograd/variable.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace c10 {
class OperatorHandle;
} // namespace c10

// The one place where aliasguard's C++ reaches torch internals that are not
// part of any API torch promises to keep: each with a Note on why it is
// needed and what upstream would offer instead. torch_internals_self_test()
// checks at import (aliasguard/_torch_internals.py) that each still holds.
// The CPython-side internals are in python_torch_internals.h.

namespace aliasguard::internals {

// Note [Version counter identity]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Two tensors are in the same alias group for autograd when their
// VariableVersion objects point at the same VersionCounter. c10 exposes no
// accessor for that pointer (upstream would add one to VariableVersion, e.g.
// `const void* VariableVersion::identity() const`), so we read the object's
// representation: VariableVersion is exactly one intrusive_ptr, which is
// exactly one raw pointer. The static_asserts turn a layout change into a
// compile error; the self-test catches a library built against other headers
// than the torch it runs with. A disabled counter (inference tensors) is null
// and shares with nothing.
inline const void* version_counter_identity(
    const c10::VariableVersion& version) {
  static_assert(sizeof(c10::VariableVersion) == sizeof(void*));
  static_assert(alignof(c10::VariableVersion) == alignof(void*));
  const void* identity = nullptr;
  std::memcpy(&identity, &version, sizeof(identity));
  return identity;
}

// Note [The audit's dispatch key]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The alias audit needs a dispatch key above autograd that it can enable per
// thread (see Note [Alias audit]). A stock build has no free key there, so we
// borrow DeferredInit: stock PyTorch registers nothing for it and no test of
// its own uses it (it was reserved for torchdistx's deferred module
// initialisation, an archived project), and Python cannot name it as a
// DispatchKey. The TESTING_ONLY_* keys look free too, but PyTorch's own tests
// register fallbacks on them, and an audited run of those tests must not
// collide. Upstream: a dedicated key (an in-tree patch would add one next to
// the other functionality keys).
constexpr c10::DispatchKey kAuditDispatchKey = c10::DispatchKey::DeferredInit;

// Note [The tracked views' dispatch key]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Views made in a tracked scope are marked by a kernel that must run after
// their ADInplaceOrView kernel and only while the scope is open (see
// Note [Views made below autograd build their grad_fn from their base]): a
// key above ADInplaceOrView, off by default, that the thread turns on.
// Autograd's keys are excluded there and most keys above them have kernels
// of their own; AutocastIPU has none in a stock build (Graphcore's IPU
// backend, which would register it, is out of tree and archived), it is in
// the default exclude set, so nothing reaches it unless asked, and CPU, CUDA
// and every other backend derive other autocast keys. We register a
// fallthrough fallback and one boxed kernel per view op on it. Upstream: no
// key at all, as_view itself would record a stale attr_version when autograd
// is excluded.
constexpr c10::DispatchKey kTrackedViewsDispatchKey =
    c10::DispatchKey::AutocastIPU;

// Note [The checkpoint write guard's dispatch key]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The fast path's write guard (Note [Refusing a write where it happens])
// needs a key above autograd, off by default, that a thread turns on while a
// checkpointed region's forward phase runs, with kernels for the ops that
// write and a fallthrough fallback for the rest. Most autocast keys are
// taken: stock registers autocast kernels (for mm, conv, pow...) and a
// fallthrough on those of CPU, CUDA, XPU, MPS, MTIA and MAIA, and those
// kernels would run for every tensor while the key is on. AutocastXLA has
// nothing in a stock build (torch_xla registers it, for TPUs only), is in
// the default exclude set, and no tensor carries it unless it lives on an
// XLA device. Not AutocastIPU: the tracked views hold that one with a
// fallback that is not a fallthrough. Where another library holds it, the
// guard is unavailable and checkpointing keeps its dispatch modes
// (write_guard_unavailable_reason()). Upstream: a dedicated key, or a
// version counter that can refuse a bump.
constexpr c10::DispatchKey kCheckpointWriteGuardDispatchKey =
    c10::DispatchKey::AutocastXLA;

// Note [Thread-local dispatch key state]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every dispatch guard of torch (AutoDispatchBelowADInplaceOrView,
// ExcludeDispatchKeyGuard, the functorch and autocast switches) is built on
// the thread-local include/exclude sets of c10/core/impl/LocalDispatchKeySet.h,
// an impl namespace. We read and flip single keys of them: whether
// ADInplaceOrView was excluded on entry to a body, re-enabling it for the
// body, turning the borrowed keys on and off. The RAII guards cannot express
// "restore exactly what was there" across the two calls of an API that
// Python pairs (track_views' enable/restore), so the single-key accessors are
// used. A scope that flips several keys reads the two sets once and writes
// them back once (c10's _force_tls_local_dispatch_key_set, what its own
// guards restore with), since each single-key call is a thread-local access
// of its own and a tracked body opens one scope per op. Single-key reads go
// through c10's inline tls_local_dispatch_key_set() (what the out-of-line
// tls_is_dispatch_key_included/excluded read too), so that the checks every
// corrected __torch_dispatch__ makes are no call into libc10 each.
// Upstream: a patch in c10 would use them directly, as torch does.
struct LocalDispatchKeys {
  c10::DispatchKeySet included;
  c10::DispatchKeySet excluded;
};
inline LocalDispatchKeys local_dispatch_keys() {
  const c10::impl::LocalDispatchKeySet keys =
      c10::impl::tls_local_dispatch_key_set();
  return {keys.included_, keys.excluded_};
}
inline void set_local_dispatch_keys(const LocalDispatchKeys& keys) {
  c10::impl::PODLocalDispatchKeySet raw{};
  raw.set_included(keys.included);
  raw.set_excluded(keys.excluded);
  c10::impl::_force_tls_local_dispatch_key_set(raw);
}
inline bool is_dispatch_key_excluded(c10::DispatchKey key) {
  return c10::impl::tls_local_dispatch_key_set().excluded_.has(key);
}
inline bool is_dispatch_key_included(c10::DispatchKey key) {
  return c10::impl::tls_local_dispatch_key_set().included_.has(key);
}
inline void set_dispatch_key_included(c10::DispatchKey key, bool included) {
  c10::impl::tls_set_dispatch_key_included(key, included);
}

// Note [Torch's infrastructure modes]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// torch keeps its fake, proxy and functional dispatch modes in dedicated
// slots of the thread's mode state (c10::impl::TorchDispatchModeTLS, an impl
// class), apart from user modes: set while FakeTensorMode, make_fx or
// AOTAutograd's functionalization runs, even while a user mode's or
// subclass's __torch_dispatch__ runs under them. See Note [Tracing
// infrastructure is left alone]. Upstream: a public "is tracing" query.
ALIASGUARD_API bool any_infrastructure_mode_set();

// Note [Storage bytes of symbolic sizes]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The bytes a tensor's sizes, strides and offset address, when some are
// symbolic (tracing): at::detail::computeStorageNbytes (ATen/EmptyTensor.h, a
// detail namespace) computes it on SymInts, as torch's own empty_strided
// does. Concrete sizes are checked with our own overflow-checked arithmetic
// (see Note [May a tensor alias a storage]).
ALIASGUARD_API c10::SymInt symbolic_storage_nbytes(
    c10::SymIntArrayRef sizes,
    c10::SymIntArrayRef strides,
    size_t itemsize,
    const c10::SymInt& storage_offset);

// Note [Autograd view internals]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// mark_as_view (see Note [Marking a tensor as a view]) does what a view op's
// ADInplaceOrView kernel does, with the same internal functions:
// torch::autograd::as_view (VariableTypeUtils.h, a header torch generates its
// kernels against, not an API), and the view metadata's attr_version, which
// it sets one behind the counter so that autograd rebuilds the view's grad_fn
// on first use. Upstream: a public `torch::autograd::mark_as_view` (the
// point of this project) would make both unnecessary.

// as_view(base, tensor, ...) for a tensor that has no autograd metadata yet:
// installs a DifferentiableViewMeta on `tensor` itself.
ALIASGUARD_API void make_differentiable_view_in_place(
    const at::Tensor& base,
    const at::Tensor& tensor,
    bool is_bw_differentiable,
    bool is_fw_differentiable,
    std::unique_ptr<torch::autograd::ViewFunc> view_func,
    torch::autograd::CreationMeta creation_meta);

// Makes autograd rebuild the grad_fn of backward-differentiable view
// `tensor` from its base the next time it is read; views made with another
// creation meta than DEFAULT are left alone (autograd would refuse).
ALIASGUARD_API void mark_view_grad_fn_stale(const at::Tensor& tensor);

// Makes backward-differentiable view `tensor`, made below autograd (no
// grad_fn), one whose grad_fn autograd will rebuild from its base: a view
// made in DEFAULT creation mode already is; one of several views of one op
// (MULTI_OUTPUT_NODE) becomes one, since its rebuilt grad_fn is its own.
// False for the rest (no-grad or inference mode, a custom Function), which
// autograd refuses to rebuild.
ALIASGUARD_API bool let_view_grad_fn_be_rebuilt(const at::Tensor& tensor);

// Note [Autograd metadata of a tensor made below autograd]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Alias correction must know what autograd metadata a view return carries
// before autograd's ADInplaceOrView kernel marks it (see Note [Views returned
// from below autograd]): view metadata, or only a leaf's requires_grad flag.
// torch::autograd::AutogradMeta's fields (is_view_, requires_grad_, grad_fn_,
// grad_, hooks_, ...) are public members of a struct in variable.h, which
// torch's own kernels read, but no API: the public accessors
// (requires_grad(), grad_fn()) compute answers (a view's requires_grad
// follows its base; grad_fn() may build a node) where we need the stored
// facts. Upstream: as_view accepting a tensor with view metadata made below
// it would make the question moot.
enum class AutogradMetaKind {
  kNone, // no autograd metadata at all
  kView, // view metadata and no grad_fn: a view made below autograd
  kBareRequiresGradLeaf, // requires_grad_ set; no grad, grad_fn or hook
  kOther, // anything else (a grad_fn, a grad, hooks, retains_grad)
};
ALIASGUARD_API AutogradMetaKind
autograd_meta_kind(const at::TensorBase& tensor);

// Note [ADInplaceOrView kernels that bump first]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// torch's generated ADInplaceOrView kernels bump each written argument after
// the op below them returned; the one torch.library.custom_op registers for
// an op with mutates_args (torch/_library/custom_ops.py) bumps them first,
// then redispatches. Which of the two an op has decides how a tracked body's
// writes are settled (Note [One bump per write through __torch_dispatch__]),
// and the dispatcher says only that a kernel exists: the registration's
// debug string, which names the file that registered it, is what tells them
// apart. Upstream: the custom op's kernel bumping after the redispatch, as
// the generated ones do.
ALIASGUARD_API bool inplace_or_view_kernel_bumps_first(
    const c10::OperatorHandle& op);

// Every torch internal above checked against the torch this process runs:
// one line per internal that no longer behaves as relied on, naming it;
// empty when all hold.
ALIASGUARD_API std::vector<std::string> torch_internals_self_test();

} // namespace aliasguard::internals
