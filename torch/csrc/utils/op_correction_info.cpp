#include <torch/csrc/utils/op_correction_info.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/utils/torch_internals.h>

namespace aliasguard::utils {

OpCorrectionInfo op_correction_info(const c10::OperatorHandle& op) {
  OpCorrectionInfo info;
  info.analysis = schema_alias_analysis(op);
  info.has_inplace_or_view_kernel =
      op.hasKernelForDispatchKey(c10::DispatchKey::ADInplaceOrView);
  const bool composite_implicit =
      op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
  info.view_may_be_a_copy =
      !info.has_inplace_or_view_kernel && composite_implicit;
  info.fresh_return_may_alias = composite_implicit;
  const SchemaAliasAnalysis& analysis = *info.analysis;
  const auto& returns = analysis.returns();
  const auto sole = analysis.sole_tensor_argument();
  if (returns.size() == 1 && returns[0].kind == ReturnAliasKind::kView &&
      !returns[0].is_list && sole == returns[0].argument &&
      !analysis.argument_is_kwarg_only(*sole)) {
    info.sole_view_argument = sole;
  }
  if (info.has_inplace_or_view_kernel) {
    info.write_counting = internals::inplace_or_view_kernel_bumps_first(op)
        ? WriteCounting::kOuterKernelBumpedFirst
        : WriteCounting::kOuterKernelBumps;
  } else if (returns.empty()) {
    info.write_counting = WriteCounting::kOnePerWrite;
  }
  return info;
}

} // namespace aliasguard::utils
