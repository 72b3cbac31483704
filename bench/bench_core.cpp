// Hot paths of the core patch, each beside the stock path it replaces.
// bench/run_benchmarks.py runs this binary and prints the median ratios.

#include <benchmark/benchmark.h>

#include <ATen/ATen.h>
#include <ATen/ops/detach_compositeexplicitautograd_dispatch.h>
#include <aten/src/ATen/native/DetachKeepVersionCounter.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/csrc/autograd/mark_as_view.h>

namespace {

// detach below autograd: the stock CompositeExplicitAutograd kernel (fresh
// counter) against ours (shared counter), both called directly.
void BM_DetachStock(benchmark::State& state) {
  at::Tensor t = at::ones({4, 4});
  for (auto _ : state) {
    benchmark::DoNotOptimize(at::compositeexplicitautograd::detach(t));
  }
}
BENCHMARK(BM_DetachStock);

void BM_DetachAliasguard(benchmark::State& state) {
  at::Tensor t = at::ones({4, 4});
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        aliasguard::native::detach_keep_version_counter(t));
  }
}
BENCHMARK(BM_DetachAliasguard);

// View bookkeeping on a fresh alias: what the ADInplaceOrView kernel of a view
// op does (as_view) against mark_as_view. Both include making the alias.
at::Tensor fresh_alias(const at::Tensor& base) {
  return at::Tensor(base.unsafeGetTensorImpl()->shallow_copy_and_detach(
      /*version_counter=*/0, /*allow_tensor_metadata_change=*/true));
}

void BM_ViewBookkeepingStock(benchmark::State& state) {
  at::Tensor base = at::ones({4, 4}).set_requires_grad(true);
  for (auto _ : state) {
    benchmark::DoNotOptimize(torch::autograd::as_view(
        base,
        fresh_alias(base),
        true,
        true,
        nullptr,
        nullptr,
        torch::autograd::CreationMeta::DEFAULT));
  }
}
BENCHMARK(BM_ViewBookkeepingStock);

void BM_ViewBookkeepingMarkAsView(benchmark::State& state) {
  at::Tensor base = at::ones({4, 4}).set_requires_grad(true);
  for (auto _ : state) {
    at::Tensor alias = fresh_alias(base);
    benchmark::DoNotOptimize(aliasguard::autograd::mark_as_view(alias, base));
  }
}
BENCHMARK(BM_ViewBookkeepingMarkAsView);

} // namespace
