"""OpInfo sweep: alias correction never changes correct code.

Every op in ``torch.testing._internal.common_methods_invocations.op_db`` with
its first CPU float32 samples (``SAMPLES_PER_OP``) runs

* through a pass-through wrapper subclass (``_make_wrapper_subclass`` holding
  an inner tensor, unwrapped and rewrapped with pytree) and through a
  pass-through ``TorchDispatchMode``, with alias correction on: outputs and
  mutated inputs equal a plain run (values, shapes, dtypes), and in-place ops
  bump the argument's version exactly when the plain run bumps it;
* the same again inside ``aliasguard.audit()``: no ``AliasingError`` on correct
  code;
* under a mode that answers every view op (a return annotated ``Tensor(a)``,
  not written) with a copy: the first such op is refused with
  ``AliasingError`` naming it.

A variant that also fails, or differs, with correction switched off
(``set_alias_correction(False)``) is not aliasguard's doing (e.g. a wrapper
cannot run ``tolist``); it is skipped with the stock failure as the reason,
so the skip list is printed by ``pytest -ra``. Ops that cannot run through a
simple wrapper at all are listed in ``SKIPPED_OPS`` with the reason.
Known aliasguard bugs are ``xfail(strict=True)`` in ``KNOWN_BUGS``.

Run alone: ``pytest test/python/test_opinfo_sweep.py -n 2`` (pytest-xdist).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map, tree_map_only

import aliasguard
from aliasguard import AliasingError
from aliasguard.testing import PassThroughMode

SAMPLES_PER_OP = 2
DTYPE = torch.float32
DEVICE = "cpu"

# Ops that cannot be compared through a pass-through subclass or mode, with
# why. Keyed by OpInfo full name (name + "." + variant_test_name).
SKIPPED_OPS: dict[str, str] = {
    # Sample inputs or outputs are sparse or otherwise not strided: a strided
    # wrapper of a sparse tensor is meaningless.
    "to_sparse": "sparse output",
    "sparse.sampled_addmm": "sparse inputs",
    "sparse.mm.reduce": "sparse inputs",
    # Results depend on uninitialized memory: equality cannot hold.
    "empty": "uninitialized memory",
    "empty_like": "uninitialized memory",
    "empty_strided": "uninitialized memory",
    "new_empty": "uninitialized memory",
    "new_empty_strided": "uninitialized memory",
    "empty_permuted": "uninitialized memory",
    # Runs a Python-level RNG or timing loop: equality cannot hold.
    "bernoulli": "random",
    "normal": "random",
    "normal.number_mean": "random",
    "multinomial": "random",
    "uniform": "random",
    "cauchy": "random",
    "exponential": "random",
    "geometric": "random",
    "log_normal": "random",
    "randint": "random",
    "randint_like": "random",
    "randn": "random",
    "randn_like": "random",
    "rand_like": "random",
    "nn.functional.rrelu": "random",
    "nn.functional.feature_alpha_dropout.with_train": "random",
    "nn.functional.alpha_dropout": "random",
    "nn.functional.dropout": "random",
    "nn.functional.dropout2d": "random",
    "nn.functional.dropout3d": "random",
    "nn.functional.fractional_max_pool2d": "random",
    "nn.functional.fractional_max_pool3d": "random",
    "nn.functional.multi_head_attention_forward": "random (dropout)",
    "nn.functional.scaled_dot_product_attention": "random (dropout)",
}

# Known aliasguard bugs found by the sweep: (check, op full name) -> issue.
# xfail(strict=True): a fix turns them into failures and removes the entry.
KNOWN_BUGS: dict[tuple[str, str], str] = {}


def _full_name(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


OPS = [op for op in op_db if DTYPE in op.supported_dtypes(DEVICE)]
NO_FLOAT32 = sorted(_full_name(op) for op in op_db if DTYPE not in op.supported_dtypes(DEVICE))


def _params(check: str):
    params = []
    for op in OPS:
        name = _full_name(op)
        marks = []
        if name in SKIPPED_OPS:
            marks.append(pytest.mark.skip(reason=f"{name}: {SKIPPED_OPS[name]}"))
        elif (check, name) in KNOWN_BUGS:
            marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[(check, name)]))
        params.append(pytest.param(op, id=name, marks=marks))
    return params


# --- pass-through wrapper and modes -----------------------------------------


class PassThroughTensor(torch.Tensor):
    """A wrapper subclass with placeholder storage around ``elem``; every op
    runs on ``elem`` and every tensor result is wrapped again. It does no
    alias bookkeeping of its own: that is the correction's job."""

    elem: torch.Tensor
    __slots__ = ["elem"]
    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, elem: torch.Tensor):
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            elem.shape,
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            layout=elem.layout,
            device=elem.device,
            requires_grad=elem.requires_grad,
        )
        r.elem = elem
        return r

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        args, kwargs = tree_map_only(cls, lambda t: t.elem, (args, kwargs or {}))
        out = func(*args, **kwargs)
        return tree_map_only(torch.Tensor, cls, out)


def _is_view_return(ret) -> bool:
    info = ret.alias_info
    return info is not None and not info.is_write


class CopyViewsMode(TorchDispatchMode):
    """Answers every view op with a copy of the right shape: what the
    correction must refuse."""

    def __init__(self):
        super().__init__()
        self.copied: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        schema = func._schema
        if any(_is_view_return(r) for r in schema.returns) and not any(
            a.alias_info is not None and a.alias_info.is_write for a in schema.arguments
        ):
            copied = tree_map_only(torch.Tensor, lambda t: t.clone(), out)
            self.copied.append(
                f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name
            )
            return copied
        return out


# --- running and comparing ---------------------------------------------------


def _clone_sample(sample):
    clone = lambda t: t.clone() if t.layout == torch.strided else t.clone()  # noqa: E731
    return tree_map_only(torch.Tensor, clone, (sample.input, sample.args, sample.kwargs))


def _samples(op):
    torch.manual_seed(0)
    out = []
    for i, sample in enumerate(op.sample_inputs(DEVICE, DTYPE, requires_grad=False)):
        if i >= SAMPLES_PER_OP:
            break
        out.append(sample)
    return out


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _non_strided(tree) -> bool:
    return any(t.layout != torch.strided for t in _tensors(tree))


class _Outcome:
    def __init__(self, result=None, inputs=None, versions=None, error: BaseException | None = None):
        self.result, self.inputs, self.versions, self.error = result, inputs, versions, error


def _run(op, sample, wrap: bool, context: Callable[[], Any]) -> _Outcome:
    inp, args, kwargs = _clone_sample(sample)
    if wrap:
        inp, args, kwargs = tree_map_only(torch.Tensor, PassThroughTensor, (inp, args, kwargs))
    inputs = (inp, args, kwargs)
    before = [t._version for t in _tensors(inputs)]
    torch.manual_seed(1234)
    try:
        with context():
            result = op(inp, *args, **kwargs)
    except AliasingError:
        raise
    except Exception as e:  # noqa: BLE001 - compared with the plain run
        return _Outcome(error=e)
    versions = [t._version - b for t, b in zip(_tensors(inputs), before)]
    unwrap = lambda t: t.elem if isinstance(t, PassThroughTensor) else t  # noqa: E731
    return _Outcome(tree_map(unwrap, result), tree_map(unwrap, inputs), versions)


def _mismatch(ref: _Outcome, got: _Outcome) -> str | None:
    """Why ``got`` differs from ``ref``, or None."""
    if ref.error is not None or got.error is not None:
        if (ref.error is None) != (got.error is None):
            return f"plain run: {ref.error!r}; this run: {got.error!r}"
        return None
    for what, a, b in (("output", ref.result, got.result), ("input after the op", ref.inputs, got.inputs)):
        la, sa = tree_flatten(a)
        lb, sb = tree_flatten(b)
        if len(la) != len(lb):
            return f"{what}: {len(la)} leaves vs {len(lb)}"
        for x, y in zip(la, lb):
            if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
                return f"{what}: {type(x).__name__} vs {type(y).__name__}"
            if isinstance(x, torch.Tensor):
                if x.shape != y.shape or x.dtype != y.dtype:
                    return f"{what}: {x.shape}/{x.dtype} vs {y.shape}/{y.dtype}"
                if x.layout != torch.strided or y.layout != torch.strided:
                    continue
                try:
                    torch.testing.assert_close(y, x, equal_nan=True, rtol=1e-5, atol=1e-6)
                except AssertionError as e:
                    return f"{what}: values differ: {str(e).splitlines()[0]}"
            elif isinstance(x, float) and x != x and y != y:
                continue
            elif x != y and not (isinstance(x, torch.Size) or callable(x)):
                return f"{what}: {x!r} vs {y!r}"
    bumped_ref = [v > 0 for v in ref.versions]
    bumped_got = [v > 0 for v in got.versions]
    if bumped_ref != bumped_got:
        return f"version bumps of the inputs: plain run {bumped_ref}, this run {bumped_got}"
    return None


def _check_equals_plain(
    op, wrap: bool, make_context: Callable[[], Any], off_context: Callable[[], Any] | None = None
) -> None:
    """Each sample through ``make_context`` (and the wrapper when ``wrap``)
    equals the plain run. A difference that persists with correction off
    (run under ``off_context``, by default ``make_context``) is skipped."""
    samples = _samples(op)
    if not samples:
        pytest.skip(f"{_full_name(op)}: no CPU float32 sample")
    ran = 0
    for sample in samples:
        if wrap and (_non_strided((sample.input, sample.args, sample.kwargs)) or not _tensors(sample.input)):
            continue
        ref = _run(op, sample, wrap=False, context=contextlib.nullcontext)
        got = _run(op, sample, wrap=wrap, context=make_context)
        why = _mismatch(ref, got)
        if why is None:
            ran += 1
            continue
        # Is it aliasguard's doing? The same run with correction off.
        previous = aliasguard.set_alias_correction(False)
        try:
            off = _run(op, sample, wrap=wrap, context=off_context or make_context)
        finally:
            aliasguard.set_alias_correction(previous)
        if _mismatch(ref, off) is not None:
            pytest.skip(f"{_full_name(op)}: differs without alias correction too ({why})")
        pytest.fail(f"{_full_name(op)}: with alias correction on, {why}")
    if ran == 0:
        pytest.skip(f"{_full_name(op)}: no sample with a strided tensor input to wrap")


# --- the sweep ----------------------------------------------------------------


@pytest.mark.parametrize("op", _params("wrapper"))
def test_wrapper_subclass_equals_plain(op):
    _check_equals_plain(op, wrap=True, make_context=contextlib.nullcontext)


@pytest.mark.parametrize("op", _params("mode"))
def test_mode_equals_plain(op):
    _check_equals_plain(op, wrap=False, make_context=PassThroughMode)


@pytest.mark.parametrize("op", _params("audit"))
def test_audit_quiet_on_pass_through(op):
    # Wrapper and mode inside audit(): an AliasingError propagates out of
    # _run and fails the test; anything else is compared with the plain run.
    def audited_mode():
        stack = contextlib.ExitStack()
        stack.enter_context(aliasguard.audit())
        stack.enter_context(PassThroughMode())
        return stack

    _check_equals_plain(op, wrap=True, make_context=aliasguard.audit, off_context=contextlib.nullcontext)
    _check_equals_plain(op, wrap=False, make_context=audited_mode, off_context=PassThroughMode)


@pytest.mark.parametrize("op", _params("copy_views"))
def test_view_answered_with_copy_is_refused(op):
    samples = _samples(op)
    if not samples:
        pytest.skip(f"{_full_name(op)}: no CPU float32 sample")
    copied_any = False
    for sample in samples:
        if _non_strided((sample.input, sample.args, sample.kwargs)):
            continue
        inp, args, kwargs = _clone_sample(sample)
        mode = CopyViewsMode()
        try:
            with mode:
                op(inp, *args, **kwargs)
        except AliasingError as e:
            assert mode.copied, f"AliasingError but no view op was copied: {e}"
            # The error names the op that was answered with a copy.
            assert e.op == mode.copied[-1], (e.op, mode.copied)
            copied_any = True
            continue
        except Exception:  # noqa: BLE001 - the op itself failed on a copy
            if mode.copied:
                # A later op choked on the copy before correction could see
                # it? Impossible: correction runs when the view op returns.
                pytest.fail(f"{_full_name(op)}: view op(s) {mode.copied} answered with a copy were not refused")
            continue
        if mode.copied:
            pytest.fail(f"{_full_name(op)}: view op(s) {sorted(set(mode.copied))} answered with a copy were accepted")
    if not copied_any:
        pytest.skip(f"{_full_name(op)}: dispatches no view op on its samples")


def test_sweep_covers_op_db():
    # The sweep is not silently empty: it covers most of op_db, and every op
    # it leaves out is accounted for.
    assert len(OPS) >= 600, len(OPS)
    assert len(OPS) + len(NO_FLOAT32) == len(op_db)
    stale = sorted(set(SKIPPED_OPS) - {_full_name(op) for op in op_db})
    assert not stale, f"SKIPPED_OPS names ops not in op_db: {stale}"
