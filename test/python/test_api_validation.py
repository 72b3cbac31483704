"""Bad input to the Python API gets a clear error and changes nothing.

``mark_as_view`` flags must be real bools and ``creation_meta`` valid text;
``correct_aliasing`` checks its call against the op's schema (extra positional
arguments, unknown keywords, a result of the wrong type); a
``KeyboardInterrupt`` raised while an op's schema is read reaches the caller;
the process-wide switches and the checkpoint's flags take Python bools only,
with a message naming the type given (``numpy.bool``, not just ``bool``); an
``audit()`` or ``track_views()`` object is entered once and exited once.
Every error is checked to leave every tensor (or setting) involved as it was.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import aliasguard
from aliasguard import _C, shares_version_counter

aten = torch.ops.aten


def snapshot(*tensors: torch.Tensor) -> list[tuple]:
    """Everything an erroneous call could have changed on each tensor."""
    out = []
    for t in tensors:
        storage = t.untyped_storage()._cdata if type(t) is torch.Tensor else None
        out.append(
            (
                t._version,
                storage,
                tuple(t.shape),
                t.stride(),
                t.storage_offset(),
                t._is_view(),
                t._base,
                t.requires_grad,
                t.grad_fn,
                t.detach().clone() if type(t) is torch.Tensor else None,
            )
        )
    return out


def assert_unchanged(before: list[tuple], *tensors: torch.Tensor) -> None:
    after = snapshot(*tensors)
    for b, a in zip(before, after):
        assert b[:9] == a[:9]
        if b[9] is not None:
            assert torch.equal(b[9], a[9])


def alias_of(base: torch.Tensor) -> torch.Tensor:
    """Shares ``base``'s storage, but no view of it yet: its own counter."""
    alias = torch.empty(0).set_(base.untyped_storage(), 1, (2,), (1,))
    assert not alias._is_view() and not shares_version_counter(alias, base)
    return alias


# --- mark_as_view ------------------------------------------------------------


@pytest.mark.parametrize("flag", ["is_bw_differentiable", "is_fw_differentiable", "alias_storage"])
@pytest.mark.parametrize("value", [None, 0, 1, "yes", torch.tensor(True)])
def test_mark_as_view_flags_must_be_bools(flag, value):
    base = torch.arange(6.0)
    view = alias_of(base)
    assert not view._is_view()
    before = snapshot(view, base)
    with pytest.raises(TypeError, match=rf"mark_as_view\(\): {flag} must be a bool, got {type(value).__name__}"):
        aliasguard.mark_as_view(view, base, **{flag: value})
    assert_unchanged(before, view, base)
    assert not shares_version_counter(view, base)


@pytest.mark.parametrize("flag", ["is_bw_differentiable", "is_fw_differentiable", "alias_storage"])
def test_mark_as_view_flags_accept_real_bools(flag):
    base = torch.arange(6.0)
    view = alias_of(base)
    value = flag != "alias_storage"  # alias_storage=True needs no shared storage; keep it simple
    assert aliasguard.mark_as_view(view, base, **{flag: value}) is view
    assert view._base is base and shares_version_counter(view, base)


def test_mark_as_view_creation_meta_lone_surrogate_is_a_value_error():
    base = torch.arange(6.0)
    view = alias_of(base)
    before = snapshot(view, base)
    with pytest.raises(ValueError, match=r"mark_as_view\(\): creation_meta is not valid text"):
        aliasguard.mark_as_view(view, base, creation_meta="DEFAULT\ud800")  # type: ignore[arg-type]
    assert_unchanged(before, view, base)
    assert not shares_version_counter(view, base)


# --- correct_aliasing ----------------------------------------------------------


def test_correct_aliasing_refuses_extra_positional_arguments():
    x = torch.arange(4.0)
    out = x.clone().view(2, 2)  # a copy: correcting it would raise AliasingError
    before = snapshot(x, out)
    with pytest.raises(TypeError, match=r"aten::view: args has 3 positional arguments, but the op takes at most 2"):
        aliasguard.correct_aliasing(aten.view.default, (x, [2, 2], 7), {}, out)
    assert_unchanged(before, x, out)
    assert not shares_version_counter(x, out)


def test_correct_aliasing_refuses_unknown_and_duplicate_keywords():
    x = torch.arange(4.0)
    out = x.view(2, 2)
    with pytest.raises(TypeError, match=r"kwargs has an unknown argument 'shape'"):
        aliasguard.correct_aliasing(aten.view.default, (x,), {"shape": [2, 2]}, out)
    with pytest.raises(TypeError, match=r"argument 'size' is given both in args and in kwargs"):
        aliasguard.correct_aliasing(aten.view.default, (x, [2, 2]), {"size": [2, 2]}, out)
    # Keywords the schema names are fine.
    assert aliasguard.correct_aliasing(aten.view.default, (x,), {"size": [2, 2]}, out) is out


@pytest.mark.parametrize("bad", [None, "arf", 3, [torch.zeros(2)]])
def test_correct_aliasing_refuses_a_non_tensor_view_return(bad):
    x = torch.arange(4.0)
    before = snapshot(x)
    expected = rf"aten::view: return 0 must be a Tensor \(it is a view of argument 'self'\), got {type(bad).__name__}"
    with pytest.raises(TypeError, match=expected):
        aliasguard.correct_aliasing(aten.view.default, (x, [2, 2]), {}, bad)
    assert_unchanged(before, x)


def test_correct_aliasing_refuses_a_non_list_for_a_list_return():
    x = torch.arange(4.0)
    with pytest.raises(TypeError, match=r"aten::split.Tensor: return 0 must be a list of Tensors, got Tensor"):
        aliasguard.correct_aliasing(aten.split.Tensor, (x, 2), {}, x[:2])
    with pytest.raises(TypeError, match=r"element 1 is a str"):
        aliasguard.correct_aliasing(aten.split.Tensor, (x, 2), {}, [x[:2], "no"])


def test_correct_aliasing_refuses_a_wrong_number_of_returns():
    x = torch.randn(2, 3)
    values, indices = torch.empty(2), torch.empty(2, dtype=torch.long)
    kwargs = {"max": values, "max_values": indices}
    with pytest.raises(TypeError, match=r"out must be a tuple of 2 values, one per return, got Tensor"):
        aliasguard.correct_aliasing(aten.max.dim_max, (x, 1), kwargs, values)


def test_correct_aliasing_write_return_none_gives_the_argument():
    # Upstream's return_and_correct_aliasing returns the argument of an
    # in-place op whatever the handler computed; so does the explicit form.
    x = torch.zeros(3)
    assert aliasguard.correct_aliasing(aten.add_.Tensor, (x, 1), {}, None) is x


# --- a KeyboardInterrupt while the schema is read -----------------------------


class ExplodingSchemaOp:
    """Looks like an OpOverload until its ``_schema`` is read."""

    def __init__(self, error: BaseException):
        self.error = error

    @property
    def _schema(self):
        raise self.error


@pytest.mark.parametrize("error", [KeyboardInterrupt(), SystemExit(3)])
def test_base_exception_reading_the_schema_propagates_from_correct_aliasing(error):
    x = torch.arange(4.0)
    out = x.view(2, 2)
    before = snapshot(x, out)
    with pytest.raises(type(error)):
        aliasguard.correct_aliasing(ExplodingSchemaOp(error), (x, [2, 2]), {}, out)  # type: ignore[arg-type]
    assert_unchanged(before, x, out)


def test_base_exception_reading_the_schema_propagates_from_automatic_correction():
    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return args[0]

    x = torch.arange(4.0)
    before = snapshot(x)
    # The installed wrapper reads func's schema after the handler returned.
    with pytest.raises(KeyboardInterrupt):
        Mode.__torch_dispatch__(Mode(), ExplodingSchemaOp(KeyboardInterrupt()), (), (x,), {})
    assert_unchanged(before, x)


def test_an_exception_reading_the_schema_means_not_an_operator():
    x = torch.arange(4.0)
    out = x.view(2, 2)
    with pytest.raises(TypeError, match=r"func must be an OpOverload"):
        aliasguard.correct_aliasing(ExplodingSchemaOp(RuntimeError("no schema")), (x,), {}, out)  # type: ignore[arg-type]

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return args[0]

    # Automatic correction leaves what it cannot identify alone.
    assert Mode.__torch_dispatch__(Mode(), ExplodingSchemaOp(RuntimeError("no")), (), (x,), {}) is x


def test_in_place_answered_with_another_argument_leaves_tensors_unchanged():
    # A write op answered with another argument: AliasingError, nothing changed.
    x = torch.ones(3)
    y = torch.full((3,), 2.0)

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is aten.mul_.Tensor:
                return args[1]
            return func(*args, **(kwargs or {}))

    before = snapshot(x, y)
    with pytest.raises(aliasguard.AliasingError, match=r"aten::mul_.Tensor: return 0 is argument 'other'"), Mode():
        x.mul_(y)
    assert_unchanged(before, x, y)


# --- process-wide bool switches ------------------------------------------------


@pytest.mark.parametrize(
    "setter, getter",
    [
        (aliasguard.set_view_tracking, aliasguard.is_view_tracking_enabled),
        (aliasguard.set_alias_correction, aliasguard.is_alias_correction_enabled),
    ],
    ids=["set_view_tracking", "set_alias_correction"],
)
@pytest.mark.parametrize("value", [np.bool_(False), 0, None, "no", torch.tensor(False)], ids=repr)
def test_switches_take_only_python_bools(setter, getter, value):
    # A numpy bool's type is also called "bool": the message names its module.
    expected = {np.bool_: "numpy.bool", int: "int", type(None): "NoneType", str: "str", torch.Tensor: "torch.Tensor"}
    before = getter()
    with pytest.raises(TypeError) as raised:
        setter(value)
    message = str(raised.value)
    assert message.startswith(f"{setter.__name__}(): enabled must be a bool, got ")
    assert message.split("got ")[1].split(" ")[0] == expected[type(value)]
    assert ("bool(...)" in message) == isinstance(value, np.bool_)
    assert getter() is before


def test_switches_accept_python_bools():
    for setter in (aliasguard.set_view_tracking, aliasguard.set_alias_correction):
        assert setter(True) is True
        assert setter(True) is True


# --- audit() and track_views() objects are used once ---------------------------


def test_audit_exit_without_enter_is_refused():
    scope = aliasguard.audit()
    never_entered = r"aliasguard.audit\(\): __exit__ called on an audit\(\) scope that was never entered"
    with pytest.raises(RuntimeError, match=never_entered):
        scope.__exit__(None, None, None)
    assert _C._alias_audit_scopes() == 0
    with scope:  # still usable: nothing was changed
        assert _C._alias_audit_scopes() == 1
    assert _C._alias_audit_scopes() == 0


def test_audit_object_entered_twice_is_refused():
    scope = aliasguard.audit(report=aliasguard.AuditReport())
    with scope as report:
        assert isinstance(report, aliasguard.AuditReport)
        with pytest.raises(RuntimeError, match=r"entered before \(it is open\).*create a new aliasguard.audit\(\)"):
            with scope:
                pass
        assert _C._alias_audit_scopes() == 1
    assert _C._alias_audit_scopes() == 0
    with pytest.raises(RuntimeError, match=r"entered before \(it has ended\)"):
        scope.__enter__()
    with pytest.raises(RuntimeError, match=r"has ended already"):
        scope.__exit__(None, None, None)
    assert _C._alias_audit_scopes() == 0


def test_audit_scope_ends_on_the_thread_that_entered_it():
    scope = aliasguard.audit()
    scope.__enter__()
    try:
        errors = []
        worker = threading.Thread(target=lambda: _record(errors, scope.__exit__, None, None, None))
        worker.start()
        worker.join(60)
        assert len(errors) == 1 and "on another thread" in str(errors[0])
        assert _C._alias_audit_scopes() == 1
    finally:
        scope.__exit__(None, None, None)
    assert _C._alias_audit_scopes() == 0


def _record(errors: list, fn, *args) -> None:
    try:
        fn(*args)
    except Exception as error:  # noqa: BLE001 - the test inspects it
        errors.append(error)


def test_audit_decorator_opens_a_new_scope_per_call():
    report = aliasguard.AuditReport()
    depths = []

    @aliasguard.audit(report=report)
    def audited(n):
        depths.append(_C._alias_audit_depth())
        if n:
            audited(n - 1)  # recursion: a scope of its own per call
        return n

    assert audited(2) == 2 and audited(0) == 0
    assert depths == [1, 2, 3, 1]
    assert _C._alias_audit_scopes() == 0


def test_audit_arguments_are_checked_by_the_call():
    with pytest.raises(TypeError, match=r"audit\(\): kernels must be a bool, got numpy.bool"):
        aliasguard.audit(kernels=np.bool_(True))
    with pytest.raises(TypeError, match=r"audit\(\): report must be an aliasguard.AuditReport or None, got dict"):
        aliasguard.audit(report={})  # type: ignore[arg-type]
    assert _C._alias_audit_scopes() == 0


def test_track_views_object_is_used_once():
    scope = aliasguard.track_views()
    never_entered = r"track_views\(\): __exit__ called on a track_views\(\) scope that was never entered"
    with pytest.raises(RuntimeError, match=never_entered):
        scope.__exit__(None, None, None)
    with torch._C._AutoDispatchBelowADInplaceOrView():
        with scope:
            assert _C._is_view_tracking_enabled()
            again = r"entered before \(it is open\).*create a new aliasguard.track_views\(\)"
            with pytest.raises(RuntimeError, match=again):
                scope.__enter__()
            assert _C._is_view_tracking_enabled()
        assert not _C._is_view_tracking_enabled()
    with pytest.raises(RuntimeError, match=r"has ended already"):
        scope.__exit__(None, None, None)
    assert not _C._body_running_on_this_thread()


def test_track_views_decorator_opens_a_new_scope_per_call():
    @aliasguard.track_views()
    def tracked():
        return _C._is_view_tracking_enabled()

    with torch._C._AutoDispatchBelowADInplaceOrView():
        assert tracked() and tracked()
        assert not _C._is_view_tracking_enabled()


# --- checkpoint flags ----------------------------------------------------------


def _region(calls: list):
    def region(x):
        calls.append(1)
        return torch.mm(x, x).sin()

    return region


@pytest.mark.parametrize("flag", ["allow_cache_entry_mutation", "fast_path"])
@pytest.mark.parametrize("value", ["no", None, 1, np.bool_(True)], ids=repr)
def test_checkpoint_flags_must_be_bools(flag, value):
    from aliasguard.checkpoint import checkpoint, create_selective_checkpoint_contexts

    expected = {str: "str", type(None): "NoneType", int: "int", np.bool_: "numpy.bool"}[type(value)]
    kernels = _C._sac_fast_num_kernels()
    calls: list = []
    x = torch.randn(3, 3, requires_grad=True)
    message = rf"{flag} must be a bool, got {expected}"
    with pytest.raises(TypeError, match=r"aliasguard.checkpoint.checkpoint\(\): " + message):
        checkpoint(_region(calls), x, policy=[aten.mm.default], **{flag: value})
    assert calls == [] and x.grad is None and x._version == 0
    with pytest.raises(TypeError, match=r"aliasguard.checkpoint.create_selective_checkpoint_contexts\(\): " + message):
        create_selective_checkpoint_contexts([aten.mm.default], **{flag: value})
    assert _C._sac_fast_num_kernels() == kernels  # nothing registered


def test_checkpoint_flags_accept_bools():
    from aliasguard.checkpoint import checkpoint

    x = torch.randn(3, 3, requires_grad=True)
    calls: list = []
    out = checkpoint(_region(calls), x, policy=[aten.mm.default], allow_cache_entry_mutation=False, fast_path=False)
    out.sum().backward()
    assert len(calls) == 2 and x.grad is not None


def test_mark_as_view_names_a_numpy_bool_in_full():
    base = torch.arange(6.0)
    view = alias_of(base)
    with pytest.raises(TypeError, match=r"mark_as_view\(\): alias_storage must be a bool, got numpy.bool"):
        aliasguard.mark_as_view(view, base, alias_storage=np.bool_(False))
    assert not view._is_view()
