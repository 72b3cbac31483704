#pragma once

#include <c10/macros/AliasguardExport.h>

// What the thread's dispatch state says about where code runs: inside which
// wrapped __torch_dispatch__ body, and whether torch's tracing
// infrastructure is at work. State set by the code that knows, read by the
// code that must decide; never guessed from which keys happen to be excluded
// (inference mode excludes the same keys as an autograd kernel does).

namespace aliasguard::utils {

// Note [Where a __torch_dispatch__ body runs]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The corrected wrapper (Note [The corrected __torch_dispatch__ wrapper])
// records, for the duration of the body it calls, which op the body answers
// and what it found on entry: whether an ADInplaceOrView kernel above will
// mark the view returns (the op has one, ADInplaceOrView was excluded on
// entry, and no inference mode excluded it instead), and whether the body
// runs tracked. An explicit correct_aliasing() call for that same op reads
// it to correct exactly as the wrapper would; for any other op, or outside
// every body, nothing above marks views and their metadata is kept. Nested
// bodies (a mode over a subclass, a body calling another op) each record
// their own and restore the outer one.
struct DispatchBody {
  const void* op = nullptr; // identity of the op answered; nullptr: none
  bool outer_kernel_marks_views = false;
  bool tracked = false;
  // ADInplaceOrView was excluded on entry and the body runs untracked: the
  // ops it calls reach no ADInplaceOrView kernel, so nothing marks their view
  // returns (Note [A wrapper view made under an untracked body]).
  bool untracked_below = false;
};

ALIASGUARD_API const DispatchBody& current_dispatch_body();

class ALIASGUARD_API DispatchBodyGuard {
 public:
  explicit DispatchBodyGuard(const DispatchBody& body);
  ~DispatchBodyGuard();
  DispatchBodyGuard(const DispatchBodyGuard&) = delete;
  DispatchBodyGuard& operator=(const DispatchBodyGuard&) = delete;

 private:
  DispatchBody previous_;
};

// Note [Tracing infrastructure is left alone]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// While a fake, proxy or functional mode is set (FakeTensorMode, make_fx,
// AOTAutograd's functionalization, dynamo's fake propagation) or a functorch
// transform is running, every tensor subclass's __torch_dispatch__ runs as
// in stock torch: no tracking, no correction. Those tracers reason about
// aliasing from what they observe (storage identity, view replay) and
// replay it later on real tensors; a storage or counter we added while they
// watch would be replayed as an alias the subclass never made (a nested
// tensor view replayed through as_strided, which it does not implement) or
// refused outright (fake storage lives on meta while the wrapper claims
// cpu). Read from the dispatch state, not from class names (make_fx's proxy
// mode also through fx's flag: Note [make_fx tracing is seen through fx's
// flag]). A functorch transform is seen while its front key is included; a
// body functorch reaches after unwrapping its tensors below its own layer
// sees no transform and is corrected as in eager (the differential harness's
// `wrapper-inplace-sizes` rule records what that changes).
ALIASGUARD_API bool tracing_infrastructure_active();

// Whether a functorch transform is running, by the rule above (its front key
// is included). Read from the dispatch key set alone: functorch's own
// interpreter stack is kept in thread-local state it creates on first
// access, and once created every autograd graph task copies it, so asking
// for it from import or from every op would add that cost to stock code.
ALIASGUARD_API bool functorch_transform_active();

} // namespace aliasguard::utils
