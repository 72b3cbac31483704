"""An op counts and views in a __torch_dispatch__ body as at top level, whenever it was registered.

The tracked views' kernels used to be registered once, for the ops that
existed when the first tracked body ran, so a custom op registered later ran
untracked there (Note [Ops registered after the tracked views' kernels]); an
op without an autograd kernel of its own ran its kernel untracked although
top level runs it with ADInplaceOrView on (Note [What a tracked body's call
runs as]); a list of written tensors that share a counter was counted once
through a mode where top level counts each; and an untracked outer mode took
back a bump its own call never made (Note [One bump per write through
__torch_dispatch__]). Registration order needs fresh processes, and stock's
numbers a process that never imports aliasguard: each (side, order) runs
once, in a child, and the tests compare what the children report. The custom
ops come from Python (torch.library) and from C++ (TORCH_LIBRARY in a test
library that `make build` builds, test/differential/cpp_ops.py), each
registered at every order.
"""

from __future__ import annotations

import functools
import json
import os
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import aliasguard  # noqa: F401 - the in-process tests run with it installed
from tracking_scenarios import WritesTwice
from subprocess_snippets import assert_clean_exit, run_snippet

TEST_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if TEST_DIR not in sys.path:
    sys.path.insert(0, TEST_DIR)
from differential import cpp_ops  # noqa: E402

aten = torch.ops.aten

ORDERS = ("before_import", "before_first_body", "after_first_body")

# One program for both sides: registers the custom ops at ORDER (relative to
# `import aliasguard`, which the stock side skips, and to the first tracked
# body, which both sides run), then measures each op at top level and through
# a pass-through mode, and what a view kept in a body by each view op sees.
PROGRAM = r"""
import json, os, sys
SIDE, ORDER, CPP_LIBRARY = sys.argv[1], sys.argv[2], sys.argv[3]
import torch
from torch.utils._python_dispatch import TorchDispatchMode
aten = torch.ops.aten
LIBS = []

def register():
    @torch.library.custom_op("agorder::cmut", mutates_args=("x",))
    def cmut(x: torch.Tensor) -> None:
        x.add_(1)

    lib = torch.library.Library("agorder", "FRAGMENT")
    LIBS.append(lib)
    lib.define("dmut(Tensor(a!) x) -> Tensor(a!)")
    lib.impl("dmut", lambda x: x.add_(1), "CPU")
    lib.define("dview(Tensor(a) x) -> Tensor(a)")
    lib.impl("dview", lambda x: x.view(x.shape), "CompositeExplicitAutograd")
    lib.define("dsplit(Tensor(a) x) -> Tensor(a)[]")
    lib.impl("dsplit", lambda x: list(x.view(2, -1).unbind(0)), "CPU")
    # the same kinds registered from C++ (TORCH_LIBRARY, test/cpp/differential_test_ops.cpp)
    torch.ops.load_library(CPP_LIBRARY)

if ORDER == "before_import":
    register()
if SIDE == "aliasguard":
    import aliasguard
    assert not aliasguard._C._has_tracked_view_kernels()
if ORDER == "before_first_body":
    register()

class Pass(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))

with Pass():  # the first tracked body
    torch.zeros(4).view(2, 2).add_(1)
if SIDE == "aliasguard":
    assert aliasguard._C._has_tracked_view_kernels()
if ORDER == "after_first_body":
    register()
cpp = getattr(torch.ops, os.path.basename(CPP_LIBRARY)[len("lib"):-len(".so")])

def versions(fn, through_mode):
    x = torch.zeros(4)
    if through_mode:
        with Pass():
            fn(x)
    else:
        fn(x)
    return x._version

WRITES = {
    "custom_op": torch.ops.agorder.cmut,
    "library_define": torch.ops.agorder.dmut,
    "cpp_library": cpp.mutate,
    "cpp_library_list": lambda x: cpp.mutate_list(list(x.view(2, 2).unbind(0))),
    "foreach_repeated": lambda x: torch._foreach_add_([x, x], 1.0),
    "foreach_halves": lambda x: torch._foreach_mul_(list(x.view(2, 2).unbind(0)), 2.0),
}
out = {"writes": {n: {"top": versions(f, False), "mode": versions(f, True)} for n, f in WRITES.items()}}

class KeepView(TorchDispatchMode):
    def __init__(self, view):
        super().__init__()
        self.view, self.kept = view, None
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        res = func(*args, **(kwargs or {}))
        if func is aten.sin.default:
            self.kept = self.view(res)
        return res

VIEWS = {
    "aten_view": lambda t: t.view(t.shape),
    "library_view": torch.ops.agorder.dview,
    "library_view_list": lambda t: torch.ops.agorder.dsplit(t)[1],
    "cpp_view": cpp.view,
    "cpp_view_list": lambda t: cpp.view_list(t)[1],
}
out["views"] = {}
for name, view in VIEWS.items():
    mode = KeepView(view)
    with mode:
        y = torch.randn(4).sin()
    kept = mode.kept
    before = kept._version
    y.mul_(2)
    out["views"][name] = {"is_view": kept._is_view(), "sees_write": kept._version != before,
                          "top_is_view": view(torch.randn(4))._is_view()}
print(json.dumps(out))
"""


@functools.lru_cache(maxsize=None)
def observed(side: str, order: str) -> dict:
    # the C++ ops' library (one namespace per registration time; a missing build fails here, never skips)
    cpp = cpp_ops.library_path("agdiff_cpp_after" if order == "after_first_body" else "agdiff_cpp_before")
    result = run_snippet(f"import sys; sys.argv[1:] = {[side, order, cpp]!r}\n" + PROGRAM)
    assert_clean_exit(result)
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("op", ["custom_op", "library_define", "cpp_library", "cpp_library_list"])
def test_a_custom_op_through_a_mode_counts_its_writes_as_stock_top_level_whenever_registered(op, order):
    stock = observed("stock", "after_first_body")["writes"][op]
    ours = observed("aliasguard", order)["writes"][op]
    assert ours["top"] == stock["top"]
    assert ours["mode"] == stock["top"], (ours, stock)


@pytest.mark.parametrize("op", ["foreach_repeated", "foreach_halves"])
def test_foreach_through_a_mode_counts_each_listed_alias_as_stock_top_level(op):
    stock = observed("stock", "after_first_body")["writes"][op]
    ours = observed("aliasguard", "after_first_body")["writes"][op]
    assert stock["top"] == 2  # once per list element, also for two views of one base
    assert ours["top"] == stock["top"]
    assert ours["mode"] == stock["top"], (ours, stock)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("view", ["library_view", "library_view_list", "cpp_view", "cpp_view_list"])
def test_a_view_kept_from_a_custom_view_op_in_a_body_sees_later_writes_whenever_registered(view, order):
    stock = observed("stock", "after_first_body")["views"]
    ours = observed("aliasguard", order)["views"]
    assert stock[view]["top_is_view"] and ours[view]["top_is_view"]
    # aten.view in the same body is the yardstick: tracked, as the custom op must be.
    assert ours["aten_view"] == {"is_view": True, "sees_write": True, "top_is_view": True}
    assert ours[view] == ours["aten_view"], ours
    assert stock[view]["sees_write"] is False  # stock misses the write: the difference is the fix


def test_registration_order_changes_nothing():
    results = [observed("aliasguard", order) for order in ORDERS]
    assert results[1:] == results[:-1]


# --- a version recorded between two writes never matches again --------------------------------


class PassMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class UntrackedPassMode(PassMode):
    __aliasguard_track_views__ = False


@pytest.mark.parametrize("outer", [PassMode, UntrackedPassMode], ids=["tracked", "untracked"])
def test_a_version_seen_between_two_writes_never_matches_again_under_any_outer_mode(outer):
    # The outer mode's body runs first (entered last) and calls into the inner one.
    x = torch.zeros(3)
    inner = WritesTwice()
    with inner, outer():
        x.add_(torch.ones(3))
    assert inner.between is not None
    assert x._version != inner.between, "a write after the recorded version was hidden"
    # As with no outer mode at all: the outer body adds no count of its own.
    y = torch.zeros(3)
    alone = WritesTwice()
    with alone:
        y.add_(torch.ones(3))
    assert (x._version, inner.between) == (y._version, alone.between)


def test_an_untracked_mode_alone_counts_one_write_as_stock():
    x = torch.zeros(3)
    with UntrackedPassMode():
        x.add_(1)
    assert x._version == 1


# --- uninstall takes the listener back with the kernels ------------------------------------------


def test_ops_registered_around_uninstall_and_install_count_as_at_top_level():
    # uninstall() releases the tracked views' kernels and the listener that records later ops; the next
    # tracked body after install() registers both again, for every op that exists by then.
    result = run_snippet("""
        import torch, aliasguard
        from aliasguard import _C
        from torch.utils._python_dispatch import TorchDispatchMode

        class Pass(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                return func(*args, **(kwargs or {}))

        LIBS = []

        def define(name):
            lib = torch.library.Library("agreinstall", "FRAGMENT")
            LIBS.append(lib)
            lib.define(f"{name}(Tensor(a!) x) -> Tensor(a!)")
            lib.impl(name, lambda x: x.add_(1), "CPU")
            return getattr(torch.ops.agreinstall, name)

        def count(op):
            x = torch.zeros(3)
            with Pass():
                op(x)
            return x._version

        with Pass():
            torch.zeros(2).add_(1)
        late = define("late")
        print(count(late))
        aliasguard.uninstall()
        assert not _C._has_tracked_view_kernels()
        while_off = define("while_off")
        print(count(late), count(while_off))
        aliasguard.install()
        print(count(late), count(while_off))
        print(count(define("after_install")))
    """)
    assert_clean_exit(result)
    top_level, uninstalled, installed, after = result.stdout.strip().splitlines()
    assert top_level == "1"
    assert uninstalled == "0 0"  # as stock through a mode
    assert installed == "1 1"
    assert after == "1"


# --- a custom op whose ADInplaceOrView kernel bumps before the body runs ---------------------------
# See Note [ADInplaceOrView kernels that bump first] (torch_internals.h).


@torch.library.custom_op("aliasguard_test_bumps_first::mutate", mutates_args=("x",))
def _bumps_first(x: torch.Tensor) -> None:
    x.add_(1)


class RecordsThenWrites(TorchDispatchMode):
    """Answers the custom op, records its argument's version, then writes it once more (or not at all)."""

    def __init__(self, call: bool = True, write: bool = True):
        super().__init__()
        self.call, self.write = call, write
        self.recorded = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is not torch.ops.aliasguard_test_bumps_first.mutate.default:
            return func(*args, **(kwargs or {}))
        out = func(*args, **(kwargs or {})) if self.call else None
        self.recorded = args[0]._version
        if self.write:
            args[0].mul_(1)
        return out


def _top_level_emulation(write: bool) -> tuple:
    # The same body run as a plain function at top level.
    x = torch.zeros(3)
    torch.ops.aliasguard_test_bumps_first.mutate(x)
    recorded = x._version
    if write:
        x.mul_(1)
    return recorded, x._version


@pytest.mark.parametrize("write", [True, False])
def test_a_custom_op_that_bumps_first_counts_in_a_body_as_at_top_level(write):
    x = torch.zeros(3)
    mode = RecordsThenWrites(call=True, write=write)
    with mode:
        torch.ops.aliasguard_test_bumps_first.mutate(x)
    assert (mode.recorded, x._version) == _top_level_emulation(write)
    if write:
        assert x._version != mode.recorded, "a write after the recorded version was hidden"


@pytest.mark.parametrize("write", [True, False])
def test_a_body_answering_a_custom_op_that_bumps_first_without_calling_it(write):
    # The kernel's bump is taken back while the body runs (the body sees one version less than stock's
    # body would) and given back if nothing moved the counter: the op counts once, as in stock; a write
    # the body makes is seen.
    x = torch.zeros(3)
    mode = RecordsThenWrites(call=False, write=write)
    with mode:
        torch.ops.aliasguard_test_bumps_first.mutate(x)
    assert mode.recorded == 0
    assert x._version == 1
    if write:
        assert x._version != mode.recorded, "a write after the recorded version was hidden"


def test_a_custom_op_that_bumps_first_nested_in_two_tracked_modes_counts_as_at_top_level():
    x = torch.zeros(3)
    inner, outer = RecordsThenWrites(), RecordsThenWrites()
    with inner, outer:
        torch.ops.aliasguard_test_bumps_first.mutate(x)
    # outer's body calls the op (inner answers it: op, record, write), then records and writes.
    assert (inner.recorded, outer.recorded, x._version) == (2, 3, 4)
