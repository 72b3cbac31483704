"""Views made inside every __torch_dispatch__ are tracked automatically."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only

import aliasguard
from aliasguard import AliasingError, _C, shares_version_counter
from aliasguard.__main__ import SEED_SCRIPT  # the upstream reproduction, verbatim; one copy
from aliasguard.testing import InnerTensor, WrapperTensor

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
aten = torch.ops.aten


def run_python(code, *args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO_ROOT, HERE]))
    result = subprocess.run(
        [sys.executable, *(["-c", code] if code else []), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(autouse=True)
def defaults():
    previous = aliasguard.set_view_tracking(True)
    correction = aliasguard.set_alias_correction(True)
    was_tracking = _C._is_view_tracking_enabled()
    yield
    aliasguard.set_alias_correction(correction)
    aliasguard.set_view_tracking(previous)
    assert _C._is_view_tracking_enabled() == was_tracking, "a test leaked the ADInplaceOrView state"


# --- helpers -------------------------------------------------------------------------------


class SaveMode(TorchDispatchMode):
    """Keeps `save(out)` for every output of `op`, like a cache below autograd."""

    def __init__(self, save, op=aten.sin.default):
        super().__init__()
        self.save = save
        self.op = op
        self.saved = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is self.op:
            self.saved.append(self.save(out))
        return out


class UntrackedSaveMode(SaveMode):
    __aliasguard_track_views__ = False


class SavingWrapper(InnerTensor):
    """A wrapper subclass keeping `save(inner output)` of every sin it runs."""

    save = None
    saved: list = []

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda t: t.elem  # noqa: E731
        out = func(*tree_map_only(cls, unwrap, args), **tree_map_only(cls, unwrap, kwargs or {}))
        if func is aten.sin.default:
            cls.saved.append(cls.save(out))
        return tree_map_only(torch.Tensor, cls, out)


SAVERS = {
    "view_as": lambda o: o.view_as(o),
    "transpose": lambda o: o.transpose(0, 1),
    "split": lambda o: o.split(1)[1],
    "indexing": lambda o: o[1:, 1],
    "unbind": lambda o: o.unbind(0)[1],
}


def mutation_seen(saved, target, mutate):
    """Whether `mutate()` bumps `target`'s version as seen by `saved`, and
    whether the written values are visible through `saved`."""
    before_version = saved._version
    before_values = saved.clone()
    mutate()
    return saved._version > before_version and not torch.equal(saved, before_values)


# --- the seed script ------------------------------------------------------------------------


def test_seed_script_unchanged_is_fixed_by_the_import():
    prelude = "import torch\nfrom torch.utils._python_dispatch import TorchDispatchMode\n"
    stock = run_python(prelude + SEED_SCRIPT).split()
    fixed = run_python(prelude + "import aliasguard\n" + SEED_SCRIPT).split()
    assert stock == ["True", "False", "False", "True"]  # the bug, as reported
    assert fixed == ["True", "True", "True", "True"]


def test_python_m_aliasguard_shows_the_seed_fixed():
    out = run_python(None, "-m", "aliasguard")
    assert "True True / True True" in out
    assert "all fixed cases OK" in out


# --- saved views see later mutations in both directions ------------------------------------


@pytest.mark.parametrize("how", sorted(SAVERS))
def test_view_saved_in_a_mode_is_a_real_view(how):
    mode = SaveMode(SAVERS[how])
    with mode:
        b = torch.sin(torch.randn(3, 3))
    (saved,) = mode.saved
    assert saved._is_view() and saved._base is b
    assert shares_version_counter(saved, b)
    assert mutation_seen(saved, b, lambda: b.mul_(2))
    assert mutation_seen(b, saved, lambda: saved.mul_(3))


@pytest.mark.parametrize("how", sorted(SAVERS))
def test_view_saved_in_a_wrapper_is_a_real_view_of_the_inner_tensor(how):
    SavingWrapper.save = staticmethod(SAVERS[how])
    SavingWrapper.saved = []
    b = torch.sin(SavingWrapper(torch.randn(3, 3)))
    (saved,) = SavingWrapper.saved
    assert saved._is_view() and saved._base is b.elem
    # The wrapper's in-place op runs the inner one, tracked: the saved view sees it.
    assert mutation_seen(saved, b.elem, lambda: b.mul_(2))
    assert mutation_seen(b.elem, saved, lambda: saved.mul_(3))


@pytest.mark.parametrize("how", sorted(SAVERS))
def test_opted_out_mode_keeps_stock_behaviour(how):
    mode = UntrackedSaveMode(SAVERS[how])
    with mode:
        b = torch.sin(torch.randn(3, 3))
    (saved,) = mode.saved
    assert not saved._is_view()
    assert not shares_version_counter(saved, b)
    version = saved._version
    b.mul_(2)
    assert saved._version == version  # stock: the mutation goes unseen


def test_in_place_ops_in_the_body_bump_counters():
    seen = []

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is aten.cos.default:
                before = out._version
                out.add_(0)
                seen.append(out._version - before)
            return out

    with Mode():
        torch.cos(torch.randn(2))
    assert seen == [1]


# --- counts and gradients equal stock ---------------------------------------------------------


@pytest.fixture(scope="module")
def stock_and_tracked(tmp_path_factory):
    directory = tmp_path_factory.mktemp("scenarios")
    stock, tracked = directory / "stock.pt", directory / "tracked.pt"
    run_python(None, os.path.join(HERE, "tracking_scenarios.py"), str(stock))
    run_python(None, os.path.join(HERE, "tracking_scenarios.py"), str(tracked), "--aliasguard")
    return torch.load(stock, weights_only=False), torch.load(tracked, weights_only=False)


# Stock counts nothing for these through a mode or a wrapper: they have no
# ADInplaceOrView kernel and their backend kernel's own in-place calls run
# below it. At top level they count one bump per written tensor, as we do.
STOCK_UNDERCOUNTS = {("_foreach_add_", "mode"), ("_foreach_add_", "wrapper")}


def test_version_counts_equal_stock(stock_and_tracked):
    stock, tracked = (r["version_deltas"] for r in stock_and_tracked)
    assert set(stock) == set(tracked)
    for key in stock:
        if key in STOCK_UNDERCOUNTS:
            assert stock[key] == [0, 0] and tracked[key] == [1, 1], key
        else:
            assert tracked[key] == stock[key], key
    # Each in-place op bumps its arguments once, as at top level.
    for (name, where), deltas in tracked.items():
        assert deltas == tracked[(name, "top level")], (name, where)


def test_version_counts_in_process_equal_top_level():
    import tracking_scenarios

    deltas = tracking_scenarios.version_deltas()
    for (name, where), got in deltas.items():
        assert got == deltas[(name, "top level")], (name, where)
    assert deltas[("two in-place ops", "mode")] == [2]


def test_gradients_are_bit_identical_to_stock(stock_and_tracked):
    stock, tracked = stock_and_tracked
    for where in ("top level", "mode", "wrapper"):
        (loss_s, grads_s), (loss_t, grads_t) = stock["gradients"][where], tracked["gradients"][where]
        assert torch.equal(loss_s, loss_t), where
        assert all(torch.equal(s, t) for s, t in zip(grads_s, grads_t)), where
    assert all(torch.equal(s, t) for s, t in zip(stock["two_tensor_gradients"], tracked["two_tensor_gradients"]))


def test_forward_gradients_are_bit_identical_to_stock(stock_and_tracked):
    stock, tracked = (r["forward_gradients"] for r in stock_and_tracked)
    for where in ("top level", "mode"):
        assert torch.equal(stock[where], tracked[where]), where


def test_no_grad_and_inference_mode_behave_as_at_top_level():
    def run(through_mode):
        x = torch.randn(2, 3, requires_grad=True)
        with torch.no_grad(), (ReturnMode() if through_mode else torch.no_grad()):
            y = x.view(6)
        error = None
        try:
            y.mul_(2)
        except RuntimeError as e:
            error = str(e).split(".")[0]
        normal = torch.ones(2)
        with torch.inference_mode(), (ReturnMode() if through_mode else torch.no_grad()):
            inference = torch.ones(2)
            version = normal._version
            normal.add_(1)  # a normal tensor still counts writes in inference mode
            v = inference.view(2, 1)
            inference.add_(1)
            w = normal.view(2)
        return (y._is_view(), y.requires_grad, error, v.shape, w._base is normal, normal._version - version)

    assert run(through_mode=True) == run(through_mode=False)


# --- views returned from a tracked body (the question left open upstream) ------------------


class ReturnMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "op",
    [
        lambda x: x.view(6),
        lambda x: x.t(),
        lambda x: x[1],
        lambda x: x.split(1),
        lambda x: x.unbind(1),
        lambda x: x.chunk(2, 1),
        lambda x: x.view(6).view(3, 2)[1:],
    ],
)
@pytest.mark.parametrize("requires_grad", [False, True])
def test_view_returned_by_a_tracked_body_is_a_view_of_the_input(op, requires_grad):
    base = torch.randn(2, 3, requires_grad=requires_grad)
    x = base * 1 if requires_grad else base
    with ReturnMode():
        out = op(x)
    expected = op(x)
    as_list = lambda value: list(value) if isinstance(value, tuple) else [value]  # noqa: E731
    for got, want in zip(as_list(out), as_list(expected)):
        assert got._is_view() and got._base is x
        assert shares_version_counter(got, x)
        assert got.requires_grad == want.requires_grad
        assert type(got.grad_fn) is type(want.grad_fn)


def test_body_keeping_the_view_it_returns():
    kept = []

    class KeepMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is aten.view.default:
                kept.append(out)
            return out

    x = torch.randn(4)
    with KeepMode():
        y = x.view(2, 2)
    assert kept[0]._base is x and y._base is x
    assert shares_version_counter(kept[0], x)
    x.add_(1)
    assert kept[0]._version == x._version == y._version


def test_view_of_another_tensor_is_an_aliasing_error():
    other = torch.randn(2, 2)
    x = other.detach().clone()  # same shape, different memory and counter
    x_shared = torch.empty(0).set_(other.untyped_storage(), 0, (4,), (1,))  # same memory, own counter

    class OtherViewMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is aten.view.default:
                return other.view(*args[1])
            return func(*args, **(kwargs or {}))

    version = other._version
    with pytest.raises(AliasingError) as info, OtherViewMode():
        x.view(4).view(2, 2)
    assert info.value.op == "aten::view"
    assert info.value.return_index == 0
    assert "view" in str(info.value)
    assert other._version == version and not other._is_view()
    # The same view of `other` is in the memory of an input that merely has
    # another counter: that is repaired (see Note [What correction refuses]).
    with OtherViewMode():
        y = x_shared.view(2, 2)
    assert y._base is x_shared and shares_version_counter(y, x_shared)


def test_view_made_above_autograd_keeps_its_graph_and_stock_error():
    x = torch.randn(4, requires_grad=True)
    cached = x.view(2, 2)  # a top-level view: it has a grad_fn
    grad_fn = cached.grad_fn

    class CachedViewMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return cached if func is aten.view.default else func(*args, **(kwargs or {}))

    with pytest.raises(RuntimeError, match="already had autograd metadata"), CachedViewMode():
        x.view(2, 2)
    assert cached.grad_fn is grad_fn and cached._base is x


def test_stock_error_for_a_view_with_metadata_is_gone_in_opted_out_classes_too():
    class ManualTracking(TorchDispatchMode):
        __aliasguard_track_views__ = False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            with aliasguard.track_views():
                return func(*args, **(kwargs or {}))

    x = torch.randn(4)
    with ManualTracking():
        y = x.view(2, 2)
    assert y._base is x and shares_version_counter(x, y)


def test_maybe_view_ops_may_return_copies_below_autograd():
    # aten::to and aten::contiguous say Tensor(a) but copy when they must;
    # they reach a mode only from below autograd (here: from another body).
    outer = SaveMode(lambda o: (o.to(torch.float64), o.t().contiguous()))
    with outer, ReturnMode():
        b = torch.sin(torch.randn(2, 2))
    as_double, contiguous = outer.saved[0]
    assert as_double.dtype == torch.float64 and torch.equal(as_double, b.double())
    assert torch.equal(contiguous, b.t()) and contiguous.is_contiguous()
    # A real view op answered with a copy is still an error.
    with pytest.raises(AliasingError, match="aten::view"):
        aliasguard.correct_aliasing(aten.view.default, (b, [4]), {}, b.clone().view(4))
    same = aliasguard.correct_aliasing(aten.to.dtype, (b, torch.float64), {}, as_double)
    assert same is as_double


# --- opt-outs and explicit forms --------------------------------------------------------------


def test_opt_out_is_inherited_and_re_enabled_by_a_subclass():
    class Base(SaveMode):
        __aliasguard_track_views__ = False

    class Child(Base):
        pass

    class Grandchild(Child):
        __aliasguard_track_views__ = True

    for cls, tracked in ((Base, False), (Child, False), (Grandchild, True)):
        mode = cls(lambda o: o.view_as(o))
        with mode:
            b = torch.sin(torch.randn(2))
        assert shares_version_counter(mode.saved[0], b) is tracked, cls


def test_opt_out_set_after_class_creation_is_read_at_each_call():
    mode = SaveMode(lambda o: o.view_as(o))
    try:
        SaveMode.__aliasguard_track_views__ = False
        with mode:
            torch.sin(torch.randn(2))
    finally:
        del SaveMode.__aliasguard_track_views__
    with mode:
        torch.sin(torch.randn(2))
    assert [s._is_view() for s in mode.saved] == [False, True]


def test_set_view_tracking_is_process_wide_and_returns_previous():
    assert aliasguard.is_view_tracking_enabled()
    assert aliasguard.set_view_tracking(False) is True
    assert not aliasguard.is_view_tracking_enabled()
    mode = SaveMode(lambda o: o.view_as(o))
    with mode:
        torch.sin(torch.randn(2))
    assert aliasguard.set_view_tracking(True) is False
    with mode:
        torch.sin(torch.randn(2))
    assert [s._is_view() for s in mode.saved] == [False, True]
    with pytest.raises(TypeError, match="bool"):
        aliasguard.set_view_tracking(1)
    assert aliasguard.is_view_tracking_enabled()


def test_track_views_still_works_in_opted_out_classes():
    def save(o):
        with aliasguard.track_views():
            return o.view_as(o)

    mode = UntrackedSaveMode(save)
    with mode:
        b = torch.sin(torch.randn(2))
    assert mode.saved[0]._base is b


def test_with_tracking_runs_one_op_tracked():
    seen = {}

    class Mode(TorchDispatchMode):
        __aliasguard_track_views__ = False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is aten.sin.default:
                seen["view"] = aliasguard.with_tracking(aten.view.default)(out, [-1])
                seen["method"] = aliasguard.with_tracking(torch.Tensor.view_as)(out, other=out)
                seen["after"] = out.view_as(out)
                seen["key excluded after"] = not _C._is_view_tracking_enabled()
            return out

    with Mode():
        b = torch.sin(torch.randn(2))
    assert seen["view"]._base is b and seen["method"]._base is b
    assert not seen["after"]._is_view()
    assert seen["key excluded after"]
    wrapped = aliasguard.with_tracking(aten.view.default)
    assert wrapped.__wrapped__ is aten.view.default
    with pytest.raises(TypeError, match="callable"):
        aliasguard.with_tracking(3)


# --- nesting, exceptions, dispatch-key state ------------------------------------------------------


def test_nested_modes_each_track_and_in_place_bumps_once():
    outer = SaveMode(lambda o: o.view_as(o))
    inner = SaveMode(lambda o: o.t())
    x = torch.randn(2, 2)
    with outer, inner:
        b = torch.sin(x)
        version = x._version
        x.add_(1)
        assert x._version == version + 1
        y = x.view(4)
    assert y._base is x
    for saved in (outer.saved[0], inner.saved[0]):
        assert saved._base is b
        assert mutation_seen(saved, b, lambda: b.mul_(2))


def test_body_sees_the_key_enabled_and_the_previous_state_comes_back():
    states = []

    class Probe(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is aten.sin.default:
                states.append(_C._is_view_tracking_enabled())
            return func(*args, **(kwargs or {}))

    x = torch.randn(2)
    with Probe():
        torch.sin(x)
    assert states == [True]
    assert _C._is_view_tracking_enabled()  # top level: never excluded


class Boom(RuntimeError):
    pass


class RaisingWrapper(WrapperTensor):
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is aten.add_.Tensor:
            args[0].elem.add_(1)  # a real write, tracked, before failing
        raise Boom(str(func))


def test_exception_in_the_body_restores_dispatch_key_state():
    states = []

    class Outer(TorchDispatchMode):
        __aliasguard_track_views__ = False  # the key stays excluded in this body

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is aten.sin.default:
                before = _C._is_view_tracking_enabled()
                with pytest.raises(Boom):
                    torch.neg(RaisingWrapper(torch.ones(2)))
                states.append((before, _C._is_view_tracking_enabled()))
            return func(*args, **(kwargs or {}))

    x = torch.randn(2)
    with Outer():
        torch.sin(x)
    assert states == [(False, False)]


def test_exception_after_a_write_keeps_the_bump():
    class FailAfterWrite(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is aten.add_.Tensor:
                raise Boom(str(func))
            return out

    x = torch.zeros(2)
    version = x._version
    with pytest.raises(Boom), FailAfterWrite():
        x.add_(1)
    # The write happened and no outer bump will come: the body's bump stays.
    assert torch.equal(x, torch.ones(2))
    assert x._version == version + 1


# --- tracing infrastructure is unaffected ------------------------------------------------------


def test_fake_tensor_mode_unaffected():
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(3, 4)
        v = x.view(12)
        x.add_(1)
        pieces = x.split(2)
        assert isinstance(v, FakeTensor) and v.shape == (12,)
        assert v._base is x and all(p._base is x for p in pieces)
        assert x._version == 1


def test_user_mode_over_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    mode = SaveMode(lambda o: o.t(), op=aten.sin.default)
    with FakeTensorMode(), mode:
        x = torch.empty(2, 2)
        b = torch.sin(x)
        v = b.t()
        pieces = b.unbind(0)
        b.add_(1)
    assert isinstance(mode.saved[0], FakeTensor) and mode.saved[0].shape == (2, 2)
    # Views of the user mode's ops come back as views of their input, and the
    # in-place op through the tracked body is counted once.
    assert v._base is b and all(p._base is b for p in pieces)
    assert b._version == 1


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_unaffected(backend):
    torch._dynamo.reset()

    def f(x, w):
        h = (x @ w).view(2, 2, 2).transpose(0, 1)
        a, b = h.unbind(0)
        out = a.sin() + b.cos()
        out.mul_(2)
        return out.sum()

    x = torch.randn(2, 3)
    w = torch.randn(3, 4, requires_grad=True)
    compiled = torch.compile(f, backend=backend)
    loss = compiled(x, w)
    (grad,) = torch.autograd.grad(loss, w)
    loss_ref = f(x, w)
    (grad_ref,) = torch.autograd.grad(loss_ref, w)
    torch.testing.assert_close(loss, loss_ref)
    torch.testing.assert_close(grad, grad_ref)
    torch._dynamo.reset()
