"""Correction never turns a result stock handles into an error; tracked bodies act as an in-tree ADInplaceOrView.

Each test names the stock behaviour it keeps, or the difference that is the
fix itself (docs/design.md, "Intended differences").
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

import aliasguard
from tracking_scenarios import WritesTwice
from aliasguard import _C, shares_version_counter
from aliasguard.testing import WrapperTensor

aten = torch.ops.aten
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class SavingMode(TorchDispatchMode):
    """Keeps ``save(args, out)`` for every call of ``op``: a cache below autograd."""

    def __init__(self, op, save):
        super().__init__()
        self.op = op
        self.save = save
        self.saved = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is self.op:
            self.saved.append(self.save(args, out))
        return out


# --- views made in a body are views for autograd too -------------------------------------


def test_view_of_the_output_saved_in_a_body_gets_the_outputs_gradient():
    x = torch.randn(5, requires_grad=True)
    mode = SavingMode(aten.sin.default, lambda args, out: out.view_as(out))
    with mode:
        b = x.sin()
    saved = mode.saved[0]
    assert saved._is_view() and saved._base is b
    assert saved.requires_grad
    assert saved.grad_fn is not None, "a view that requires grad must have a grad_fn, not be a leaf"
    assert not saved.is_leaf
    (saved * 2).sum().backward()
    torch.testing.assert_close(x.grad, 2 * x.detach().cos(), rtol=0, atol=0)


def test_view_of_an_argument_saved_in_a_body_passes_its_gradient_to_the_argument():
    x = torch.randn(4, requires_grad=True)
    mode = SavingMode(aten.sin.default, lambda args, out: args[0].view(2, 2))
    with mode:
        x.sin()
    saved = mode.saved[0]
    assert saved.grad_fn is not None and not saved.is_leaf
    (saved * 3).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((4,), 3.0))


def test_view_saved_without_gradients_stays_as_stock():
    x = torch.randn(4)  # nothing requires grad: nothing to build
    mode = SavingMode(aten.sin.default, lambda args, out: out.view_as(out))
    with mode:
        b = x.sin()
    saved = mode.saved[0]
    assert not saved.requires_grad and saved.grad_fn is None
    b.mul_(2)  # the seed's fix: the saved view sees the write
    assert saved._version == b._version == 1


def test_view_saved_in_a_body_follows_a_later_write_of_its_base():
    x = torch.randn(4, requires_grad=True)
    mode = SavingMode(aten.sin.default, lambda args, out: out.view_as(out))
    with mode:
        b = x.sin()
    saved = mode.saved[0]
    b.mul_(2)
    saved.sum().backward()
    torch.testing.assert_close(x.grad, 2 * x.detach().cos())


def test_views_outside_bodies_are_not_marked():
    # A view made at top level of a tensor that later requires grad keeps
    # stock's behaviour: the marking only happens inside tracked bodies.
    base = torch.randn(3)
    view = base.view(3)
    base.requires_grad_()
    assert view.grad_fn is None
    assert not _C._has_tracked_view_kernels() or not torch._C._dispatch_tls_is_dispatch_key_included(
        torch._C.DispatchKey.AutocastIPU
    )


def test_mark_as_view_of_a_view_made_in_a_body_returns_it():
    results = []

    def save(args, out):
        view = out.view_as(out)
        results.append(torch.mark_as_view(view, out) is view)
        return view

    mode = SavingMode(aten.sin.default, save)
    with mode:
        b = torch.randn(3).sin()
    assert results == [True]
    assert mode.saved[0]._base is b


def test_mark_as_view_of_a_view_of_another_base_is_still_refused():
    a, other = torch.randn(3), torch.randn(3)
    view = a.view(3)
    with pytest.raises(RuntimeError, match="already a view"):
        torch.mark_as_view(view, other)
    assert view._base is a


# --- views of .data and other aliases of the input -------------------------------------------


class DataViewMode(TorchDispatchMode):
    """Answers view ops on ``.data``, a common way to step outside autograd."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (aten.view.default, aten.t.default, aten.select.int):
            return func(args[0].data, *args[1:], **kwargs)
        return func(*args, **kwargs)


def test_view_answered_on_data_is_repaired_not_refused():
    x = torch.randn(4, requires_grad=True)
    with DataViewMode():
        y = x.view(2, 2)
        z = x.view(2, 2).t()
    assert y._is_view() and y._base is x
    assert shares_version_counter(x, y) and shares_version_counter(x, z)
    (y * 2 + z).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((4,), 3.0))


def test_view_of_unrelated_memory_is_still_refused():
    class OtherTensorView(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is aten.view.default:
                return func(torch.zeros_like(args[0]), *args[1:])
            return func(*args, **(kwargs or {}))

    x = torch.randn(4)
    with pytest.raises(aliasguard.AliasingError, match="aten::view"):
        with OtherTensorView():
            x.view(2, 2)


# --- versions -------------------------------------------------------------------------------


def test_a_version_seen_between_two_writes_of_a_body_never_matches_again():
    x = torch.zeros(3)
    mode = WritesTwice()
    with mode:
        x.add_(torch.ones(3))
    assert x._version != mode.between, "a write after the recorded version was hidden"
    assert x._version > mode.between


def test_one_write_in_a_body_counts_once_as_stock():
    x = torch.zeros(3)
    with SavingMode(aten.add_.Tensor, lambda args, out: args[0]._version):
        x.add_(1)
    assert x._version == 1


# --- explicit correction reads the state the wrapper set -------------------------------------


def test_explicit_correction_under_inference_mode_keeps_view_metadata():
    base = torch.randn(4)
    out = base.view(2, 2)
    with torch.inference_mode():
        result = aliasguard.correct_aliasing(aten.view.default, (base, [2, 2]), {}, out)
    assert result is out and out._is_view() and out._base is base


def test_explicit_correction_below_autograd_at_top_level_keeps_view_metadata():
    base = torch.randn(4)
    with torch._C._AutoDispatchBelowAutograd():
        out = base.view(2, 2)
        aliasguard.correct_aliasing(aten.view.default, (base, [2, 2]), {}, out)
    assert out._is_view() and out._base is base


def test_modes_nested_in_inference_mode_run_as_stock():
    seen = []

    class Probe(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(_C._is_view_tracking_enabled())
            return func(*args, **(kwargs or {}))

    with torch.inference_mode(), Probe(), Probe():
        torch.randn(3).view(3).sin()
    assert seen and not any(seen), "no body is tracked under inference mode"


def test_nested_modes_each_correct_their_own_op():
    x = torch.randn(4, requires_grad=True)
    inner = SavingMode(aten.view.default, lambda args, out: out)
    outer = SavingMode(aten.sin.default, lambda args, out: out.view(2, 2))
    with inner, outer:
        b = x.sin()
    assert outer.saved[0]._base is b
    outer.saved[0].sum().backward()
    torch.testing.assert_close(x.grad, x.detach().cos())


# --- torch's tracing infrastructure over subclasses -----------------------------------------


def _jagged():
    return torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)], layout=torch.jagged)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_nested_jagged_tensor_runs_as_stock(backend):
    torch._dynamo.reset()
    nt = _jagged()
    compiled = torch.compile(lambda t: t.sin() * 2, backend=backend, fullgraph=True)
    torch.testing.assert_close(compiled(nt).values(), nt.values().sin() * 2)
    torch._dynamo.reset()


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_function_of_a_transposed_nested_jagged_tensor_runs_as_stock(backend):
    # The input is a view: meta conversion replays transpose on a fake base through NJT's __torch_dispatch__,
    # whose values() is a fake tensor under a cpu wrapper (OpInfo's *_noncontig_transposed samples).
    torch._dynamo.reset()
    t = _jagged().transpose(1, 2)
    compiled = torch.compile(torch.sin, backend=backend, fullgraph=True)
    torch.testing.assert_close(compiled(t).values(), t.values().sin())
    torch._dynamo.reset()


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_nested_jagged_tensor_made_in_inference_mode_runs_as_stock(backend):
    # In inference mode no kernel above NJT's __torch_dispatch__ marks the jagged view of its values, so the
    # wrapper must keep its own placeholder storage, as in stock: sharing its values' storage without being a
    # view makes meta conversion set_() it onto the values' fake storage (no set_ kernel for NestedTensorMeta).
    torch._dynamo.reset()
    with torch.inference_mode():
        nt = _jagged()
    assert StorageWeakRef(nt.untyped_storage()) != StorageWeakRef(nt.values().untyped_storage())
    compiled = torch.compile(lambda t: t * 2, backend=backend, fullgraph=True)
    torch.testing.assert_close(compiled(nt).values(), nt.values() * 2)
    torch._dynamo.reset()


_JAGGED_VIEW_COMPILES = """
import sys, torch
if sys.argv[1] == "aliasguard":
    import aliasguard
from torch._dynamo.testing import CompileCounter
counter = CompileCounter()
compiled = torch.compile(lambda a: a.sin() + 1, backend=counter, dynamic=True)
for n in range(4):
    parts = [torch.randn(2 + n, 3, 4 + n), torch.randn(5 + 2 * n, 3, 4 + n), torch.randn(1, 3, 4 + n)]
    nt = torch.nested.nested_tensor(parts[: 2 + n % 2], layout=torch.jagged)
    for view in (lambda t: t.narrow(-1, 0, 2), lambda t: t.unsqueeze(-1), lambda t: t.transpose(1, 2)):
        compiled(view(nt))
print(counter.frame_count)
"""


def test_compiled_views_of_nested_jagged_tensors_recompile_as_often_as_stock():
    # Their values are autograd views made in NJT's tracked body, so dynamo also guards the values' _base
    # (design.md lists it): the extra guards must not cost a compile.
    counts = {}
    for side in ("stock", "aliasguard"):
        done = subprocess.run([sys.executable, "-c", _JAGGED_VIEW_COMPILES, side], capture_output=True, text=True,
                              timeout=600, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        assert done.returncode == 0, done.stderr[-3000:]
        counts[side] = int(done.stdout.split()[-1])
    assert counts["aliasguard"] == counts["stock"] > 1, counts


def test_fake_view_of_a_wrapper_keeps_its_meta_storage():
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    class Holder(torch.Tensor):
        """A cpu wrapper whose view op answers with its fake inner tensor's view (as NJT's values() does)."""

        @staticmethod
        def __new__(cls, elem):
            return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype, device="cpu")

        def __init__(self, elem):
            self.elem = elem

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            return func(*[a.elem if isinstance(a, Holder) else a for a in args], **(kwargs or {}))

    holder = Holder(FakeTensorMode().from_tensor(torch.randn(4)))
    out = holder.view(2, 2)  # a plain fake tensor returned for a view of the wrapper
    assert isinstance(out, FakeTensor)
    assert out.untyped_storage().device.type == "meta"  # not the wrapper's cpu placeholder
    assert (out.sin() * 2).shape == (2, 2)  # meta kernels still run on it


def test_reshape_that_copies_a_jagged_tensor_in_inference_mode_leaves_the_copy_its_own_memory():
    # reshape (CompositeImplicitAutograd) reaches NJT's __torch_dispatch__ in inference mode and copies a
    # transposed input: the copy must not be given its input's storage, or its values() would look like a copy.
    nt = torch.nested.nested_tensor(
        [torch.randn(2, 3, 4), torch.randn(5, 3, 4)], layout=torch.jagged, requires_grad=True
    ).transpose(-1, -2)
    with torch.inference_mode():
        copied = nt.reshape([2, -1, 12])
        viewed = copied.reshape([2, -1, 3, 4])  # contiguous now: a view of the copy
    assert copied.values().data_ptr() == copied._values.data_ptr() != nt.values().data_ptr()
    assert viewed.values().data_ptr() == copied.values().data_ptr()
    torch.testing.assert_close(copied.values(), nt.values().reshape(7, 12))


def test_nested_jagged_tensor_to_fake_and_back():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    nt = _jagged()
    mode = FakeTensorMode(shape_env=ShapeEnv())
    fake = mode.from_tensor(nt)  # replays the jagged view on a fake base
    again = mode.from_tensor(fake)
    assert type(fake) is type(nt) and fake.values().device.type == "cpu"
    assert again.shape == fake.shape
    assert again.values().shape == fake.values().shape


def test_wrapper_views_under_fake_tensor_mode_are_left_alone():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        wrapper = WrapperTensor(torch.randn(4))
        view = wrapper.view(2, 2)
    # Stock: the returned wrapper keeps a placeholder storage of its own.
    assert StorageWeakRef(view.untyped_storage()) != StorageWeakRef(wrapper.untyped_storage())
    eager_view = WrapperTensor(torch.randn(4))
    assert StorageWeakRef(eager_view.view(2, 2).untyped_storage()) == StorageWeakRef(eager_view.untyped_storage())


def test_wrapper_view_that_cannot_take_its_inputs_storage_keeps_its_placeholder():
    class ElsewhereView(torch.Tensor):
        @staticmethod
        def __new__(cls, elem, device):
            return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype, device=device)

        def __init__(self, elem, device):
            self.elem = elem

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            out = func(*[a.elem if isinstance(a, ElsewhereView) else a for a in args], **(kwargs or {}))
            return ElsewhereView(out, "meta") if isinstance(out, torch.Tensor) else out

    wrapper = ElsewhereView(torch.randn(4), "cpu")
    view = wrapper.view(2, 2)  # stock runs this; the returned wrapper says meta
    assert view.device.type == "meta"
    assert shares_version_counter(wrapper, view)  # the counter is still given
    with pytest.raises(aliasguard.AliasingError, match="placeholder storage"):
        aliasguard.correct_aliasing(aten.view.default, (wrapper, [2, 2]), {}, ElsewhereView(torch.randn(2, 2), "meta"))


def test_correction_is_skipped_while_a_functorch_transform_runs():
    seen = []

    class Probe(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(_C._is_view_tracking_enabled())
            return func(*args, **(kwargs or {}))

    x = torch.randn(3, requires_grad=True)
    with Probe():
        torch.func.vmap(torch.sin)(x)
    assert seen


def test_wrapper_in_place_answers_are_left_as_stock_while_make_fx_traces():
    # See Note [make_fx tracing is seen through fx's flag]. WrapperTensor
    # answers zero_ with a fresh wrapper; in eager the correction hands back
    # the argument (the control), while make_fx traces the body runs as stock
    # and the graph returns what stock's returns: the tensor zero_ wrote.
    from torch.fx.experimental.proxy_tensor import make_fx

    arg = WrapperTensor(torch.randn(3))
    assert torch.ops.aten.zero_.default(arg) is arg  # eager: corrected

    gm = make_fx(lambda x: x.clone().zero_())(WrapperTensor(torch.randn(3)))
    (output,) = [n for n in gm.graph.nodes if n.op == "output"]
    returned = output.args[0]
    assert returned.target is torch.ops.aten.clone.default, gm.code
    assert not torch.fx._symbolic_trace.is_fx_tracing()


def test_audit_of_the_tracked_view_kernels_in_a_fresh_process():
    # The marking kernels are registered on the first tracked body, and
    # taken back on request, leaving the key as stock had it.
    code = """
import torch, aliasguard
from aliasguard import _C
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
key = torch._C.DispatchKey.AutocastIPU
assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::view", key)
class M(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))
x = torch.randn(4, requires_grad=True)
with M():
    x.view(2, 2).sum().backward()
assert _C._has_tracked_view_kernels()
assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::view", key)
assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::add.Tensor", key)
_C._release_tracked_view_kernels()
assert not _C._has_tracked_view_kernels()
assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::view", key)
with M():
    x.view(2, 2)
assert _C._has_tracked_view_kernels()
aliasguard.uninstall()
assert not _C._has_tracked_view_kernels()
assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::view", key)
print("ok")
"""
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


# --- a kernel's own calls are not the body's ---------------------------------------------------


def test_fresh_outputs_keep_stocks_version_under_a_mode():
    from aliasguard.testing import PassThroughMode

    x = torch.randn(4, 4, requires_grad=True)
    with PassThroughMode():
        outs = [x.abs(), x.diag(), torch.linalg.cholesky(x @ x.mT + torch.eye(4))]
    # abs, diag and cholesky fill their result through out= calls of their own.
    assert [o._version for o in outs] == [0, 0, 0]


def test_outputs_of_fresh_returning_ops_are_not_views_under_a_mode():
    from aliasguard.testing import PassThroughMode

    x = torch.randn(4, 3, requires_grad=True)
    with PassThroughMode():
        pieces = x.unsafe_chunk(2)
    assert not pieces[0]._is_view()
    pieces[0].mul_(2)  # stock allows it: not a view of a leaf
    pieces[0].sum().backward()
    torch.testing.assert_close(x.grad[:2], torch.full((2, 3), 2.0))


def test_body_reading_an_outputs_grad_fn_before_keeping_a_view_runs():
    def save(args, out):
        out.grad_fn  # noqa: B018 - the read is the point
        return out.view_as(out)

    x = torch.randn(3, 4, requires_grad=True)
    mode = SavingMode(aten.select.int, save)
    with mode:
        y = x[0].broadcast_to(3, 4)
    assert y.shape == (3, 4) and y.grad_fn is not None


def test_view_kept_from_one_of_several_views_gets_its_gradient():
    mode = SavingMode(aten.sin.default, lambda args, out: out.split(2)[0])
    x = torch.randn(4, 3, requires_grad=True)
    with mode:
        b = x.sin()
    kept = mode.saved[0]
    assert kept._base is b and kept.grad_fn is not None
    (kept * 2).sum().backward()
    expected = torch.zeros(4, 3)
    expected[:2] = 2 * x.detach()[:2].cos()
    torch.testing.assert_close(x.grad, expected)


# --- what a wrapper that answers its own metadata sees -------------------------------------------

_NJT_DISPATCH_LOG = """
import collections, json, sys
import torch
if sys.argv[1] == "aliasguard":
    import aliasguard
seen = collections.Counter()

def profile(frame, event, arg):
    code = frame.f_code
    if event == "call" and code.co_name == "__torch_dispatch__" and code.co_filename.endswith("nested_tensor.py"):
        seen[str(frame.f_locals.get("func"))] += 1

torch.manual_seed(0)
proj = torch.nn.Linear(4, 12)
values = torch.randn(6, 4)
offsets = torch.tensor([0, 2, 6])
sys.setprofile(profile)
nt = torch.nested.nested_tensor_from_jagged(values, offsets)
q, k, v = proj(nt).chunk(3, dim=-1)
((q.sigmoid() * k).softmax(-1) * v).values().sum().backward()
sys.setprofile(None)
print(json.dumps(seen))
"""


def test_a_jagged_tensor_sees_exactly_stocks_ops():
    # Correction gives each view NJT makes of its values their storage
    # (_nested_view_from_jagged, once forward, once backward), and does not
    # ask NJT its layout first: see Note [Nested wrappers are not asked their
    # layout]. Every op NJT's __torch_dispatch__ sees is stock's, with the
    # same counts, prim.layout included.
    import json

    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    seen = {}
    for side in ("stock", "aliasguard"):
        result = subprocess.run(
            [sys.executable, "-c", _NJT_DISPATCH_LOG, side], env=env, capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0, result.stderr
        seen[side] = json.loads(result.stdout.strip().splitlines()[-1])
    stock, ours = seen["stock"], seen["aliasguard"]
    assert stock.get("aten._nested_view_from_jagged.default", 0) == 2, stock
    assert ours == stock


class _AnswersLayout(torch.Tensor):
    """A strided wrapper that answers its layout in Python, and is not nested."""

    layout_queries = 0

    @staticmethod
    def __new__(cls, elem):
        return torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, strides=elem.stride(), dtype=elem.dtype, device=elem.device, dispatch_layout=True
        )

    def __init__(self, elem):
        self.elem = elem

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is torch.ops.prim.layout.default:
            cls.layout_queries += 1
            return torch.strided
        if func is torch.ops.aliasguard_layout_test.view_with.default:
            return cls(args[0].view(args[0].shape))
        raise NotImplementedError(func)


def test_a_view_given_a_storage_is_asked_its_layout_once_when_its_wrapper_answers_it_and_is_not_nested():
    # Intended (docs/design.md, "Not exercised by the harness's scenarios"):
    # before a strided tensor's storage is given to a wrapper view, the view
    # must be strided to have its sizes bounded, and this wrapper's layout is
    # known only by asking it. Stock (correction off for the class) asks
    # nothing.
    lib = torch.library.Library("aliasguard_layout_test", "DEF")
    try:
        lib.define("view_with(Tensor(a) self, Tensor other) -> Tensor(a)")
        x = torch.randn(2, 3)
        counts = {}
        for correct in (False, True):
            _AnswersLayout.__aliasguard_fixup__ = correct
            _AnswersLayout.layout_queries = 0
            out = torch.ops.aliasguard_layout_test.view_with(x, _AnswersLayout(torch.zeros(2, 3)))
            counts[correct] = _AnswersLayout.layout_queries
            assert type(out) is _AnswersLayout
            assert StorageWeakRef(out.untyped_storage()) == StorageWeakRef(x.untyped_storage()) or not correct
        assert counts == {False: 0, True: 1}
    finally:
        del _AnswersLayout.__aliasguard_fixup__
        lib._destroy()



def test_borrowed_keys_read_as_autocast_for_their_devices_only_where_they_are_on():
    # design.md lists it ("Not exercised by the harness's scenarios"): the two keys aliasguard
    # borrows are autocast keys, and torch answers "is autocast enabled for this device" from the
    # thread's exclude set, so IPU reads as enabled inside a tracked body and XLA inside a fast-path
    # region's forward pass; every real device reads as stock, and nothing shows outside them.
    from aliasguard.checkpoint import checkpoint

    devices = ("cpu", "cuda", "ipu", "xla")
    seen: dict = {}

    def record(where):
        seen.setdefault(where, []).append({d for d in devices if torch.is_autocast_enabled(d)})

    class Tracked(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            record(type(self).__name__)
            return func(*args, **(kwargs or {}))

    class OptedOut(Tracked):
        __aliasguard_track_views__ = False

    x = torch.randn(3, requires_grad=True)
    for mode in (Tracked, OptedOut):
        with mode():
            x.view(3)

    def region(t, where):
        record(where)
        return torch.mm(t, t).sin()

    y = torch.randn(3, 3, requires_grad=True)
    guarded = checkpoint(region, y, "guarded", policy=[aten.mm.default])
    unguarded = checkpoint(region, y, "unguarded", policy=[aten.mm.default], allow_cache_entry_mutation=True)
    (guarded + unguarded).sum().backward()  # each region runs again, for its recompute
    record("after")
    assert seen == {
        "Tracked": [{"ipu"}], "OptedOut": [set()],
        "guarded": [{"xla"}, set()], "unguarded": [set(), set()], "after": [set()],
    }, seen
