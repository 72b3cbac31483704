"""The audit's report mode, the inner-tensor check, its lifetime and what it leaves alone."""

from __future__ import annotations

import json
import threading

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode, return_and_correct_aliasing
from torch.utils._pytree import tree_map_only

import aliasguard
from aliasguard import AliasingError, AuditReport, _C
from aliasguard._aliasing import _audit_new_threads, _NewThreadAudit
from aliasguard._report import VIOLATION_KINDS, describe_violation
from aliasguard.testing import InnerTensor, PassThroughMode

aten = torch.ops.aten


class CopyingViews(TorchDispatchMode):
    """Answers every view op with a copy: a real tensor of its own, which correction cannot repair."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (aten.view.default, aten.t.default):
            return out.clone()
        return out


class Inner(InnerTensor):
    """A traceable wrapper over one inner tensor. ``copy_views`` makes its view handler copy the
    inner data (the bug the inner-tensor check exists for); ``correct`` ends the handler with
    upstream's return_and_correct_aliasing."""

    copy_views = False
    correct = False

    def __tensor_flatten__(self):
        return ["elem"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, size, stride):
        return Inner(inner["elem"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*tree_map_only(Inner, lambda t: t.elem, args), **tree_map_only(Inner, lambda t: t.elem, kwargs))
        if cls.copy_views and func is aten.view.default:
            out = out.clone()
        out = tree_map_only(torch.Tensor, lambda t: cls(t), out)
        return return_and_correct_aliasing(func, args, kwargs, out) if cls.correct else out


class CopyingInner(Inner):
    copy_views = True
    correct = True


class HonestInner(Inner):
    correct = True


class NoneFromInplace(TorchDispatchMode):
    """An in-place handler that ends with a bare ``return`` (torchao's quantized tensors did)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return None if func is aten.add_.Tensor else out


# --- report mode ------------------------------------------------------------------


def test_report_mode_records_every_violation_and_runs_to_the_end():
    x = torch.randn(4)
    with aliasguard.audit(report=AuditReport()) as report, CopyingViews():
        a = x.view(2, 2)  # line A
        b = x.t()  # line B
        for _ in range(3):
            x.view(4)  # line C, three times
        done = True
    assert done and a.shape == (2, 2) and b.shape == (4,)
    entries = report.violations()
    assert [(v.op, v.kind, v.count, v.repaired) for v in entries] == [
        ("aten::t", "view_copy", 1, False),
        ("aten::view", "view_copy", 1, False),
        ("aten::view", "view_copy", 3, False),
    ]
    assert {v.owner for v in entries} == {f"mode {__name__}.CopyingViews"}
    assert all(v.location.startswith("test/python/test_audit_report.py:") for v in entries)
    assert len({v.location for v in entries}) == 3
    assert report.occurrences == 5


def test_report_mode_returns_what_the_handler_returned_when_correction_refuses():
    x = torch.randn(4)
    with aliasguard.audit(report=AuditReport()), CopyingViews():
        y = x.view(2, 2)
    assert y.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()  # stock behaviour: the copy


def test_raise_mode_is_unchanged_and_names_the_kind():
    with pytest.raises(AliasingError, match="storage of its own") as info:
        with aliasguard.audit(), CopyingViews():
            torch.randn(4).view(2, 2)
    assert (info.value.op, info.value.kind, info.value.argument) == ("aten::view", "view_copy", "self")


def test_a_violation_the_correction_repairs_is_reported_as_repaired_and_not_raised():
    x = Inner(torch.randn(4))  # no return_and_correct_aliasing: wrapper views have storage of their own
    with aliasguard.audit(report=AuditReport()) as report:
        y = x.view(2, 2)
    assert y.untyped_storage()._cdata == x.untyped_storage()._cdata  # corrected at run time
    [entry] = report.violations()
    assert (entry.op, entry.kind, entry.repaired, entry.repaired_label) == ("aten::view", "view_storage", True, "yes")
    assert entry.owner == f"{__name__}.Inner"
    with aliasguard.audit():  # raise mode: repaired, so nothing to raise
        x.view(2, 2)


def test_correction_off_leaves_the_violation_unrepaired():
    previous = aliasguard.set_alias_correction(False)
    try:
        with aliasguard.audit(report=AuditReport()) as report:
            Inner(torch.randn(4)).view(2, 2)
    finally:
        aliasguard.set_alias_correction(previous)
    [entry] = report.violations()
    assert (entry.kind, entry.repaired) == ("view_storage", False)


def test_inplace_handler_returning_none_is_reported():
    x = torch.randn(3)
    with aliasguard.audit(report=AuditReport()) as report, NoneFromInplace():
        x.add_(1)
    [entry] = report.violations()
    assert (entry.op, entry.kind, entry.argument) == ("aten::add_.Tensor", "write_not_argument", "self")
    assert "return the argument itself" in entry.advice


def test_nested_modes_blame_only_the_handler_that_broke_the_schema():
    x = torch.randn(4)
    with aliasguard.audit(report=AuditReport()) as report, PassThroughMode(), CopyingViews():
        x.view(2, 2)
    assert [v.owner for v in report.violations()] == [f"mode {__name__}.CopyingViews"]
    assert report.occurrences == 1


def test_backward_ops_are_reported_with_the_line_that_ran_backward():
    class BadBackward(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is aten.mul.Tensor and torch._C._current_graph_task_id() != -1:
                return args[0]
            return func(*args, **(kwargs or {}))

    x = torch.randn(3, requires_grad=True)
    y = (x * x).sum()
    with aliasguard.audit(report=AuditReport()) as report, BadBackward():
        y.backward()
    kinds = {(v.op, v.kind) for v in report.violations()}
    assert ("aten::mul.Tensor", "fresh_is_argument") in kinds


def test_threads_started_inside_the_block_report_into_it():
    report = AuditReport()

    def work():
        with CopyingViews():
            torch.randn(4).view(2, 2)

    with aliasguard.audit(report=report), _audit_new_threads(report):
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
        inner = AuditReport()
        with _audit_new_threads(inner):  # nests: the innermost block's report receives
            thread = threading.Thread(target=work)
            thread.start()
            thread.join()
    [entry] = report.violations()
    assert entry.kind == "view_copy" and "test_audit_report.py" in entry.location and entry.count == 1
    assert inner.occurrences == 1
    assert threading.Thread._bootstrap_inner is _NewThreadAudit.original  # restored


def test_report_format_and_json():
    with aliasguard.audit(report=AuditReport(context="example-test")) as report, CopyingViews():
        torch.randn(4).view(2, 2)
    text = report.format()
    assert text.splitlines()[0] == "aliasguard audit: 1 distinct aliasing violation (1 occurrence) in 1 op"
    header = text.splitlines()[1].split()
    assert header[:4] == ["#", "op", "class", "or"]
    row = text.splitlines()[3]
    for cell in ("aten::view", "CopyingViews", "view_copy", "no", "example-test", "test_audit_report.py:"):
        assert cell in row
    assert describe_violation("view_copy", "aten::view", 0, "self") in text
    data = json.loads(report.to_json())
    assert data["distinct"] == 1 and data["occurrences"] == 1
    assert data["violations"][0]["kind"] == "view_copy" and data["violations"][0]["repaired"] is False
    assert AuditReport().format() == "aliasguard audit: no aliasing violations"


def test_every_kind_has_a_sentence_naming_promise_return_and_fix():
    assert set(VIOLATION_KINDS) == set(_C._alias_violation_kinds())
    for kind in VIOLATION_KINDS:
        sentence = describe_violation(kind, "aten::op", 1, "self")
        assert sentence.startswith("The schema of aten::op says") and "return 1" in sentence
        assert ":" in sentence.split(", but", 1)[1]  # "..., but <what came back>: <what to change>"


def test_report_argument_errors():
    with pytest.raises(TypeError, match="report must be an aliasguard.AuditReport"):
        with aliasguard.audit(report=[]):  # type: ignore[arg-type]
            pass
    assert not _C._is_alias_audit_enabled() and _C._alias_audit_scopes() == 0
    with pytest.raises(TypeError, match="expected an aliasguard.AliasingError"):
        AuditReport().record(ValueError("x"))


# --- inner tensors of traceable wrappers ------------------------------------------


def test_inner_copy_is_found_even_after_the_wrapper_was_corrected():
    x = CopyingInner(torch.randn(4))
    with pytest.raises(AliasingError, match="inner tensor 'elem' shares no memory") as info:
        with aliasguard.audit():
            x.view(2, 2)
    assert info.value.kind == "view_inner_copy"
    with aliasguard.audit(report=AuditReport()) as report:
        y = x.view(2, 2)
    [entry] = report.violations()
    assert (entry.kind, entry.repaired) == ("view_inner_copy", False)
    y.elem.add_(1)  # the bug: the write is lost for x
    assert not torch.equal(y.elem.view(4), x.elem)


def test_honest_wrappers_pass_the_inner_check():
    x = HonestInner(torch.randn(4, 2))
    with aliasguard.audit(report=AuditReport()) as report:
        x.view(8)
        x.t()
        x.unbind(0)
        x.add_(1)
        x.mul(2)
    assert not report, report.format()


# --- lifetime -----------------------------------------------------------


def test_fallback_is_registered_only_while_auditing_and_the_key_can_be_used_by_others():
    lib = torch.library.Library("_", "IMPL")
    try:
        lib.fallback(lambda op, *args, **kwargs: op(*args, **kwargs), "DeferredInit")
        with pytest.raises(RuntimeError, match="DeferredInit.*already has a fallback registered"):
            with aliasguard.audit():
                pass
        assert not _C._is_alias_audit_enabled() and _C._alias_audit_scopes() == 0
    finally:
        lib._destroy()
    with aliasguard.audit():
        assert _C._alias_audit_scopes() == 1
    assert _C._alias_audit_scopes() == 0


def test_scopes_ending_out_of_order_restore_the_thread():
    first, second = aliasguard.audit(), aliasguard.audit(report=AuditReport())
    first.__enter__()
    report = second.__enter__()
    first.__exit__(None, None, None)
    assert _C._is_alias_audit_enabled()
    with CopyingViews():
        torch.randn(2).view(2)  # still recorded by the open scope, not raised
    assert len(report) == 1
    second.__exit__(None, None, None)
    assert not _C._is_alias_audit_enabled() and _C._alias_audit_scopes() == 0


# --- what the audit leaves alone ----------------------------------------


def test_views_under_vmap_and_functionalize_are_quiet():
    x = torch.randn(3, 4)
    with aliasguard.audit():
        torch.vmap(lambda t: t.expand(2, 4))(x)
        torch.vmap(lambda t: t.as_strided((2,), (1,)))(x)
        torch.vmap(lambda t: t[1:])(x)
        torch.vmap(lambda t: torch.view_as_complex(t.view(2, 2)))(x)
        torch.func.functionalize(lambda t: t.view(12).add_(1).view(3, 4))(x.clone())
        torch.func.grad(lambda t: t.view(12).sum())(x)


def test_higher_order_operators_run_under_the_audit():
    class Mode(TorchDispatchMode):
        supports_higher_order_operators = True

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.higher_order.cond:
                return torch.ones(3, 3)
            return NotImplemented

    x, pred = torch.randn(3), torch.tensor(True)
    try:
        with aliasguard.audit():
            out = torch.cond(pred, lambda t: t.sin(), lambda t: t.cos(), (x,))
            torch.testing.assert_close(out, x.sin())
            with Mode():
                answered = torch.cond(pred, lambda t: t.sin(), lambda t: t.cos(), (x,))
    finally:
        # Stock torch 2.13 too: after a mode answered torch.cond, the next
        # eager torch.cond in the process fails in Dynamo ("torch.* op
        # returned non-Tensor") until its caches are reset; later tests must
        # not inherit that.
        torch._dynamo.reset()
    assert torch.equal(answered, torch.ones(3, 3))


def test_strided_views_of_a_jagged_nested_tensor_are_not_bounds_checked_against_it():
    values = torch.randn(6, 3)
    nt = torch.nested.nested_tensor_from_jagged(values, offsets=torch.tensor([0, 2, 6]))
    with aliasguard.audit(report=AuditReport()) as report:
        assert nt.values().untyped_storage()._cdata == values.untyped_storage()._cdata
        nt.unbind()
    assert not [v for v in report.violations() if v.op in ("aten::_nested_get_values", "aten::unbind.int")], (
        report.format()
    )


def test_fake_tensor_mode_and_compile_are_quiet():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with aliasguard.audit():
        with FakeTensorMode():
            torch.tensor([1.0, 2.0]).view(2, 1)  # lift_fresh of a real constant gives a fake tensor
        compiled = torch.compile(lambda t: t.view(2, 2).sin() + 1, backend="aot_eager", fullgraph=True)
        torch.testing.assert_close(compiled(torch.ones(4)), torch.ones(4).view(2, 2).sin() + 1)


@pytest.fixture
def input_returning_kernel():
    """A CPU kernel, registered the way test_python_dispatch's sum2/sum4 are, that returns its
    input for a fresh return: a schema violation that autograd trusts kernels not to make."""
    lib = torch.library.Library("aliasguard_audit_kernels", "DEF")
    try:
        lib.define("returns_input(Tensor self) -> Tensor")
        lib.impl("returns_input", lambda t: t, "CPU")
        yield torch.ops.aliasguard_audit_kernels.returns_input.default
    finally:
        lib._destroy()


def test_kernels_are_not_checked_by_default(input_returning_kernel):
    x = torch.ones(2)
    with aliasguard.audit():
        assert input_returning_kernel(x) is x
    with aliasguard.audit(report=AuditReport()) as report:
        input_returning_kernel(x)
    assert not report, report.format()


def test_kernels_true_checks_kernels(input_returning_kernel):
    x = torch.ones(2)
    with pytest.raises(AliasingError) as info:
        with aliasguard.audit(kernels=True):
            input_returning_kernel(x)
    assert (info.value.op, info.value.kind) == ("aliasguard_audit_kernels::returns_input", "fresh_is_argument")
    with aliasguard.audit(report=AuditReport(), kernels=True) as report:
        input_returning_kernel(x)
    (entry,) = report.violations()
    assert (entry.op, entry.kind) == ("aliasguard_audit_kernels::returns_input", "fresh_is_argument")
    assert "a kernel" in entry.owner


def test_kernels_checked_while_any_kernels_scope_is_open(input_returning_kernel):
    x = torch.ones(2)
    outer = aliasguard.audit(kernels=True)
    outer.__enter__()
    try:
        with pytest.raises(AliasingError, match="returns_input"):
            with aliasguard.audit():
                input_returning_kernel(x)
    finally:
        outer.__exit__(None, None, None)
    with aliasguard.audit():
        input_returning_kernel(x)  # the kernels scope is closed
    assert _C._alias_audit_scopes() == 0


def test_kernels_must_be_a_bool():
    with pytest.raises(TypeError, match="kernels must be a bool, got int"):
        with aliasguard.audit(kernels=1):  # type: ignore[arg-type]
            pass
    assert not _C._is_alias_audit_enabled() and _C._alias_audit_scopes() == 0


def test_exit_with_kernels_and_no_kernels_scope_changes_nothing():
    _C._enter_alias_audit(False)
    try:
        with pytest.raises(RuntimeError, match="no audit scope that checks kernels is open"):
            _C._exit_alias_audit(True)
        assert _C._alias_audit_depth() == 1
    finally:
        _C._exit_alias_audit(False)
    assert _C._alias_audit_depth() == 0


def test_audit_report_private_state_is_not_an_argument():
    with pytest.raises(TypeError, match="positional argument"):
        AuditReport(1, 2)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="_entries"):
        AuditReport(_entries={})  # type: ignore[call-arg]
    report = AuditReport("a test")
    assert report.context == "a test" and len(report) == 0 and not report


@pytest.mark.parametrize("context", [1, b"test", ["test"]])
def test_audit_report_context_must_be_a_string(context):
    expected = rf"AuditReport\(context=\.\.\.\): expected a str .* got {type(context).__name__}"
    with pytest.raises(TypeError, match=expected):
        AuditReport(context)


def test_json_report_path_problem_names_what_is_wrong(tmp_path):
    from aliasguard._report import json_report_path_problem

    assert json_report_path_problem(str(tmp_path / "report.json")) is None
    missing = tmp_path / "missing" / "report.json"
    assert json_report_path_problem(str(missing)) == f"the folder {missing.parent} does not exist; create it first"
    assert json_report_path_problem(str(tmp_path)) == "is a folder; name a file in it"
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    assert json_report_path_problem(str(not_a_folder / "report.json")) == f"{not_a_folder} is not a folder"
    assert json_report_path_problem("") == "the file name is empty"
