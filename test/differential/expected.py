"""Known aliasguard bugs: reported apart from unexpected differences.

Never an excuse for a new difference: each entry matches one bug's difference
exactly and names scenarios that reproduce it (``repro``); the pytest sample
has an ``xfail(strict=True)`` test per entry, which XPASSes (and so fails) once
no repro scenario shows the bug: then move the entry to FIXED.

FIXED lists bugs that were fixed; their repro scenarios must stay free of any
difference that is not intended.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from differential.compare import Diff


@dataclass(frozen=True)
class Bug:
    id: str
    description: str
    pred: Callable[[Diff], bool]
    repro: tuple[str, ...]

    def matches(self, d: Diff) -> bool:
        try:
            return bool(self.pred(d))
        except Exception:
            return False


def _tx(d: Diff, transforms: tuple[str, ...], mode: str) -> bool:
    """An opdb_tx/<transform>/<mode>/<op> scenario with one of ``transforms`` and that mode."""
    return d.family == "opdb_tx" and d.variant in transforms and d.op == mode


EXPECTED_FAILURES: list[Bug] = []


@dataclass(frozen=True)
class Fixed:
    id: str
    description: str
    repro: tuple[str, ...]


FIXED: list[Fixed] = [
    Fixed("custom-op-mutate-counts-in-body",
          "a mutating torch.library.custom_op answered by a tracked __torch_dispatch__ body counted more writes "
          "there than at top level (3 against 2), and the body's settling took one back with no kernel above to "
          "add it: a version recorded after the op's call inside the body equalled the final version although "
          "the body wrote the argument again. The custom op's ADInplaceOrView kernel bumps before it "
          "redispatches; that bump is now taken back as the body starts (Note [ADInplaceOrView kernels that "
          "bump first])",
          ("nested/tracked-tracked/custom_op_mutate", "nested/tracked-notrack/custom_op_mutate",
           "nested/tracked-nofix/custom_op_mutate")),
    Fixed("wrapper-corrected-under-make-fx",
          "make_fx (and make_fx of functionalize): a wrapper's in-place answers were corrected while tracing, so the "
          "graph used the in-place op's result where stock uses its input (ProxyTorchDispatchMode runs ops with "
          "itself popped); fixed by reading fx's tracing flag (Note [make_fx tracing is seen through fx's flag])",
          ("opdb_tx/make_fx/wrapper/zero_", "opdb_tx/functionalize/wrapper/nn.functional.rms_norm",
           "opdb_tx/make_fx/wrapper/resize_")),
    Fixed("wrapper-compile-fakeify-tracked-view",
          "torch.compile (eager, aot_eager) of corrcoef / scaled_dot_product_attention on a wrapper that requires "
          "grad raised InternalTorchDynamoError (set the storage of a meta tensor to a cpu storage): correction "
          "gave a fake inner tensor (meta storage, reporting cpu) its cpu wrapper argument's placeholder storage. "
          "Fixed by comparing devices by the tensor's own storage (Note [May a tensor alias a storage])",
          ("opdb_tx/compile_eager/wrapper/corrcoef",
           "opdb_tx/compile_aot_eager/wrapper/nn.functional.scaled_dot_product_attention")),
    Fixed("njt-nested-view-from-jagged",
          "NJT under torch.compile / FakeTensorMode raised AliasingError on aten::_nested_view_from_jagged",
          ("njt/compile_eager/sin_mul2", "njt/compile_aot_eager/sin", "njt/fake/sin")),
    Fixed("datamode-view-on-data",
          "a mode answering a view op with func(args[0].data, ...) got AliasingError",
          ("opdb/datamode/view/0", "opdb/datamode/narrow/0")),
    Fixed("saved-view-requires-grad-no-grad-fn",
          "a view_as kept in a saving mode's body reported requires_grad=True with grad_fn=None and lost "
          "its gradient silently",
          ("opdb/saving/sin/0",)),
    Fixed("dtensor-audit-chunk-split-unbind",
          "DTensor chunk/split/unbind raised inside aliasguard.audit()",
          ("dtensor/audit/chunk/shard0", "dtensor/audit/split/replicate", "dtensor/audit/unbind/replicate")),
    Fixed("body-writes-bump-fresh-outputs",
          "a functional op whose kernel fills its fresh output through an out= call (abs, diag, cholesky) "
          "returned it with _version 1..8 under a mode: the kernel's own calls were tracked",
          ("opdb/pass/abs/0", "opdb/pass/diag/0")),
    Fixed("mode-outputs-become-views",
          "outputs of ops whose schema returns fresh tensors (unsafe_chunk, matrix_exp) came out as views under "
          "a mode, and an in-place op on them then raised",
          ("opdb/pass/unsafe_chunk/0", "opdb/pass/matrix_exp/1")),
    Fixed("body-read-then-view-raises",
          "a body that read an output's grad_fn and then kept out.view_as(out) made the op raise 'already had "
          "autograd metadata'",
          ("opdb/saving/broadcast_to/0",)),
    Fixed("body-read-then-view-segfaults",
          "the same pattern on view_as_complex / fft.ifft killed the process",
          ("opdb/saving/view_as_complex/0",)),
    Fixed("saved-multi-output-view-unreadable",
          "a view_as kept from the body of a multi-output view op (chunk, split, unbind) raised on .is_leaf",
          ("opdb/saving/chunk/0",)),
    Fixed("view-of-detach-counter-desync",
          "torch.arange(..., requires_grad=True) under a mode: the view_as kept of the body's aten::detach "
          "output had _base = the returned leaf but another version counter",
          ("opdb/saving/arange/0",)),
]
