"""Known aliasguard bugs: reported apart from unexpected differences.

Never an excuse for a new difference: each entry matches one bug's difference
exactly and names scenarios that reproduce it (``repro``); the pytest sample
has an ``xfail(strict=True)`` test per entry, which XPASSes (and so fails) once
no repro scenario shows the bug: then move the entry to FIXED.

FIXED lists bugs that were fixed; their repro scenarios must stay free of any
difference that is not intended.
"""

from __future__ import annotations

import re
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


_NAME = re.compile(r"(?<![.\w])\w+\b")  # a name, not the part of a dotted one (torch.ops.aten.add_)
_GRAPH_LINE = re.compile(r"^(\s*)(\w+) = torch\.ops\.aten\.(\w+)\.\w+\((\w+)\b")


def _same_graph_but_inplace_results(stock: str, ag: str) -> bool:
    """The two graphs' code is the same once the aliasguard one's uses of an in-place op's result are read as
    uses of the tensor it wrote (``r = aten.add_(x, ..)``, then ``r`` where stock says ``x``), and the lines' ``;
    a = b = None`` liveness tails are dropped (they follow from which name is used)."""
    if not isinstance(stock, str) or not isinstance(ag, str) or stock == ag:
        return False
    s_lines, a_lines = stock.splitlines(), ag.splitlines()
    if len(s_lines) != len(a_lines):
        return False
    renames: dict[str, str] = {}
    for s_line, a_line in zip(s_lines, a_lines):
        a_line = re.split(r";\s+", a_line, maxsplit=1)[0]
        lhs, eq, rhs = a_line.partition(" = ")
        if eq and renames:
            rhs = _NAME.sub(lambda m: renames.get(m.group(0), m.group(0)), rhs)
        elif a_line.lstrip().startswith("return") and renames:
            lhs = _NAME.sub(lambda m: renames.get(m.group(0), m.group(0)), lhs)
        a_line = lhs + eq + rhs
        if a_line != re.split(r";\s+", s_line, maxsplit=1)[0]:
            return False
        m = _GRAPH_LINE.match(a_line)
        if m and m.group(3).endswith("_") and not m.group(3).endswith("__"):
            renames[m.group(2)] = m.group(4)
    return bool(renames)


def _shape_is_plain(d: Diff, outs_key: str, plain: list) -> bool:
    # path <outs_key>/outN/<shape|stride>: aliasguard's output has the op's shape on plain tensors, stock's not
    if len(d.path) != 3 or d.path[0] != outs_key or d.key not in ("shape", "stride"):
        return False
    name = d.path[1]
    want = plain[int(name[3:])]
    return d.ag_rec[outs_key][name]["shape"] == want and d.stock_rec[outs_key][name]["shape"] != want


def _wrapper_corrected_under_make_fx(d: Diff) -> bool:
    if not _tx(d, ("make_fx", "functionalize"), "wrapper"):
        return False
    if d.path == ("code",):  # d.stock and d.ag are shortened for display: read the records
        return _same_graph_but_inplace_results(d.stock_rec["code"], d.ag_rec["code"])
    plain = d.ag_rec["plain_shapes"]
    return _shape_is_plain(d, "traced_outs", plain) or _shape_is_plain(d, "outs", plain)


def _wrapper_corrected_under_torch_func(d: Diff) -> bool:
    if not _tx(d, ("grad", "vjp", "vmap"), "wrapper"):
        return False
    ref = d.ag_rec["plain"]
    if d.path[:1] == ("outs",):
        return _shape_is_plain(d, "outs", [ref["outs"][n]["shape"] for n in sorted(ref["outs"], key=_index)])
    outs_plain = all(t["shape"] == ref["outs"][n]["shape"] for n, t in d.ag_rec["outs"].items())
    if d.path[:1] == ("grads",) and len(d.path) >= 3 and d.path[2] == "stride":
        # a gradient's strides follow from the output's corrected shape: aliasguard's are the plain run's
        name = d.path[1]
        want = ref["grads"][name]["stride"]
        return outs_plain and d.ag_rec["grads"][name]["stride"] == want and d.stock_rec["grads"][name]["stride"] != want
    if d.path == ("vjp", "exc"):
        # stock's stale output shape makes its vjp raise on the cotangent; the plain run and aliasguard's do not
        return outs_plain and d.stock == "RuntimeError" and d.ag == "<no exception>" and "vjp" not in ref
    if d.path == ("grads",):
        grads = d.ag_rec["grads"]
        return (outs_plain and "grads" not in d.stock_rec and "vjp" in d.stock_rec
                and {n: {"shape": t["shape"], "stride": t["stride"]} for n, t in grads.items()} == ref["grads"])
    return False


def _index(name: str) -> int:
    return int(re.sub(r"\D", "", name))


DYNAMO_SET_STORAGE = 'Attempted to set the storage of a tensor on device "meta"'


def _wrapper_compile_fakeify(d: Diff) -> bool:
    if not _tx(d, ("compile_eager", "compile_aot_eager"), "wrapper"):
        return False
    call = d.ag_rec["calls"][0].get("call", {})
    if call.get("exc") != "InternalTorchDynamoError" or DYNAMO_SET_STORAGE not in call.get("msg", ""):
        return False
    if d.path == ("calls", 0, "call", "exc"):
        return d.stock == "<no exception>"
    # dynamo stops at the failing frame: fewer graphs and frames than stock's
    if d.path in (("calls", 0, "graphs"), ("unique_graphs",), ("frames_ok",)):
        return isinstance(d.ag, int) and isinstance(d.stock, int) and d.ag < d.stock
    return False


EXPECTED_FAILURES: list[Bug] = [
    Bug("wrapper-corrected-under-make-fx",
        "make_fx (real tracing; also of torch.func.functionalize): a wrapper subclass that rewraps every output gets "
        "its in-place answers corrected (the argument handed back, with the op's sizes): ProxyTorchDispatchMode runs "
        "the op with itself popped, so the body sees no tracing infrastructure. The graph then uses the in-place "
        "op's result where stock uses its input, and in-place view ops give the plain op's shape",
        _wrapper_corrected_under_make_fx,
        ("opdb_tx/make_fx/wrapper/zero_", "opdb_tx/make_fx/wrapper/resize_",
         "opdb_tx/functionalize/wrapper/nn.functional.rms_norm", "opdb_tx/functionalize/wrapper/stft")),
    Bug("wrapper-corrected-under-torch-func",
        "torch.func grad/vjp/vmap: the same wrapper's in-place view answers (squeeze_, transpose_, resize_) are "
        "corrected to the op's sizes below the functorch layer (its front key is excluded there), so outputs have "
        "the plain op's shape and vjp no longer raises on stock's stale one",
        _wrapper_corrected_under_torch_func,
        ("opdb_tx/grad/wrapper/stft", "opdb_tx/vjp/wrapper/nn.functional.linear", "opdb_tx/vmap/wrapper/resize_")),
    Bug("wrapper-compile-fakeify-tracked-view",
        "torch.compile (eager, aot_eager) of corrcoef / scaled_dot_product_attention on a wrapper that requires "
        "grad: after a graph break dynamo compiles the wrapper's __torch_dispatch__ frame and fails to fakeify an "
        "inner tensor (InternalTorchDynamoError: set the storage of a meta tensor to a cpu storage); the inner "
        "tensors are views of the arguments' only under aliasguard. Minimal: torch.compile(torch.corrcoef, "
        "backend='eager')(Wrapper(torch.randn(3, 4)).requires_grad_())",
        _wrapper_compile_fakeify,
        ("opdb_tx/compile_eager/wrapper/corrcoef",
         "opdb_tx/compile_aot_eager/wrapper/nn.functional.scaled_dot_product_attention")),
]


@dataclass(frozen=True)
class Fixed:
    id: str
    description: str
    repro: tuple[str, ...]


FIXED: list[Fixed] = [
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
