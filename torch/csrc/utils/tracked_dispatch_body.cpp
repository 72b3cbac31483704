#include <torch/csrc/utils/tracked_dispatch_body.h>

#include <c10/core/InferenceMode.h>
#include <torch/csrc/utils/torch_internals.h>

namespace aliasguard::utils {

// Note [Tracked __torch_dispatch__ bodies]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The ADInplaceOrView kernel above the Python key runs its op under
// AutoDispatchBelowADInplaceOrView, so a __torch_dispatch__ body runs with
// ADInplaceOrView excluded: views made there are plain aliases with fresh
// counters, in-place ops there bump nothing, and a tensor cached there (the
// upstream report, selective checkpointing) misses every later mutation. The
// corrected wrapper re-enables the key for the body, as track_views() does,
// so those ops run their ADInplaceOrView kernels again (as_view,
// increment_version); autograd stays excluded. Only when the key was
// excluded on entry: otherwise the body already runs as stock.
//
// Two consequences need handling, both decided by TrackedDispatchBody because
// only the wrapper sees the body from the outside:
//   * views the body returns now carry view metadata, which the outer
//     kernel's as_view refuses: see Note [Views returned from below
//     autograd];
//   * an in-place op through a mode or subclass would be counted twice: once
//     by the body (the op's own ADInplaceOrView kernel, reached again when
//     the body calls func, or any write the body makes to the same memory)
//     and once by the outer kernel. See
//     Note [One bump per write through __torch_dispatch__].
// Automatic tracking depends on the correction to hand views back to the
// outer kernel, so a class or process without correction has no automatic
// tracking either.

// Note [One bump per write through __torch_dispatch__]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// At top level an in-place op bumps each argument it writes once. For ops
// with an ADInplaceOrView kernel that bump is made by the kernel, after the
// op returned, above the Python key; the kernel keeps that role: before the
// body runs we remember the version of every argument the schema marks
// written (Tensor(a!), returned or not), and when the body returns normally
// we take one bump back from each counter that moved, the one the body's own
// call of the op made, so the outer kernel's bump counts the op once and
// counts equal stock's. A body that writes an argument more than once keeps
// the other bumps: setting the counter all the way back would let a version
// recorded between two writes (a cache made in the body, a view's
// attr_version) match again after the outer bump, hiding a real write. Stock
// counts such a body's writes not at all (they run below ADInplaceOrView);
// that difference is listed in docs/design.md. Avoiding the inner bump
// instead would mean excluding ADInplaceOrView for exactly the body's call of
// the same op on the same arguments, which the wrapper cannot single out (the
// body may unwrap, redispatch or write through a view).
// An op whose ADInplaceOrView kernel bumps before it redispatches (Note
// [ADInplaceOrView kernels that bump first]: torch.library.custom_op's) has
// made its bump when the body starts, and nothing bumps after it: taking one
// back at the end would let a version the body recorded after its call of
// the op be current again. So that bump is taken back as the body starts
// (the body's own call of the op makes it again, where top level makes it)
// and given back when the body returns only if nothing moved the counter. A
// body that answers such an op without calling it sees the argument's
// version one lower than a stock body would, until it returns.
// Only a tracked body takes a bump back: the body of a class that opted out
// of tracking runs below ADInplaceOrView, so its own call of the op bumped
// nothing, and a tracked body nested in it (an inner mode) already took back
// the bump of its own call. Taking one more back there would let a version
// recorded between two writes of the inner body match again.
// Ops without such a kernel that return nothing but write arguments (the
// _foreach_*_ family) are counted at top level by the in-place ops their
// backend kernel runs, once per list element (a tensor listed twice, or two
// views of one base, count twice), which a body below ADInplaceOrView never
// reaches for a wrapper argument (its inner tensors are written instead) and
// stock never counts there at all: for those, each written counter is brought
// up to one bump per written argument that uses it, unless the body counted as
// much, so a mode and a wrapper count what top level counts. An op without such
// a kernel that writes an argument beside its returns (batch norm's running
// statistics) is left as the body counted it: top level counts nothing for it
// either. Only the counters of written arguments are touched: a write the body
// made to anything else is real and stays counted. When the body raises nothing
// is settled: no outer bump follows, and a write made before the exception must
// stay visible. Counters move only through VariableVersion's public bump and
// set_version (the setter behind torch's _unsafe_set_version_counter), in
// aliasguard::WrittenVersions.

ALIASGUARD_HOT TrackedDispatchBody::TrackedDispatchBody(
    const void* op,
    const OpCorrectionInfo* info,
    bool correct,
    bool tracking_allowed) {
  body_.op = op;
  if (!correct) {
    return; // untracked, uncorrected: stock
  }
  // Inference mode excludes ADInplaceOrView too, but then no kernel above
  // runs, and stock makes plain aliases: the body runs as stock. Read once:
  // it is a call into libc10 and a thread-local access (Note [Hot path
  // layout]).
  const bool inference_mode = c10::InferenceMode::is_enabled();
  const bool below =
      internals::is_dispatch_key_excluded(c10::DispatchKey::ADInplaceOrView) &&
      !inference_mode;
  body_.tracked = below && tracking_allowed;
  body_.untracked_below = below && !body_.tracked;
  options_.tracked = body_.tracked;
  // Read before the Scope makes this body the current one: the enclosing
  // body. See Note [A wrapper view made under an untracked body]; inference
  // mode is the same case: no ADInplaceOrView kernel runs above any body.
  options_.no_kernel_above_marks_views =
      (below && current_dispatch_body().untracked_below) || inference_mode;
  if (info == nullptr) {
    return;
  }
  options_.outer_kernel_marks_views = below && info->has_inplace_or_view_kernel;
  options_.view_may_be_a_copy = info->view_may_be_a_copy;
  body_.outer_kernel_marks_views = options_.outer_kernel_marks_views;
  write_counting_ = info->write_counting;
  wants_written_ = below && write_counting_ != WriteCounting::kAsCounted &&
      !info->analysis->written_arguments().empty();
}

// See Note [One bump per write through __torch_dispatch__]
void TrackedDispatchBody::written_remembered() {
  if (write_counting_ == WriteCounting::kOuterKernelBumpedFirst &&
      body_.tracked) {
    written_.take_back_bumps_made_above();
  }
}

// See Note [One bump per write through __torch_dispatch__]
ALIASGUARD_HOT void TrackedDispatchBody::settle() {
  if (written_.empty()) {
    return;
  }
  if (write_counting_ == WriteCounting::kOuterKernelBumpedFirst) {
    if (body_.tracked) {
      written_.give_back_unmoved();
    }
  } else if (write_counting_ == WriteCounting::kOuterKernelBumps) {
    // Only a tracked body's own call of the op reached the op's
    // ADInplaceOrView kernel and bumped; an untracked one (a class that
    // opted out) bumped nothing of its own, and whatever moved the counters
    // (a tracked body nested in it) has settled its own count already.
    if (body_.tracked) {
      written_.undo_one_bump();
    }
  } else if (write_counting_ == WriteCounting::kOnePerWrite) {
    written_.bump_to_one_per_write();
  }
}

// See Note [Where a __torch_dispatch__ body runs]
CorrectionOptions explicit_correction_options(
    const void* op,
    const OpCorrectionInfo& info) {
  const DispatchBody& body = current_dispatch_body();
  CorrectionOptions options;
  if (body.op == op) {
    options.outer_kernel_marks_views = body.outer_kernel_marks_views;
    options.tracked =
        body.outer_kernel_marks_views && autograd::is_view_tracking_enabled();
  }
  options.view_may_be_a_copy = info.view_may_be_a_copy;
  options.strict = true;
  return options;
}

} // namespace aliasguard::utils
