"""The import-time self-test of the torch internals aliasguard relies on."""

import inspect
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.utils.checkpoint
from torch.utils._python_dispatch import TorchDispatchMode

import aliasguard  # noqa: F401
from aliasguard import _C, _torch_internals


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )


def test_every_internal_holds_on_this_torch():
    assert _C._torch_internals_self_test() == []
    _torch_internals.self_test()  # raises nothing


def test_a_problem_becomes_an_import_error_naming_it():
    with pytest.raises(ImportError, match=r"torch internals it relies on have changed:\n  torch\._C\._foo: gone"):
        _torch_internals.self_test(extra=["torch._C._foo: gone"])


# Each case breaks one internal before `import aliasguard`, in a fresh process.
BROKEN = {
    "torch.utils.checkpoint._CachedTorchDispatchMode": (
        "import torch.utils.checkpoint as c; del c._CachedTorchDispatchMode"
    ),
    "torch.utils.checkpoint._CachingTorchDispatchMode": (
        "import torch.utils.checkpoint as c; del c._CachingTorchDispatchMode"
    ),
    "torch.utils.checkpoint._is_compiling": "import torch.utils.checkpoint as c; c._is_compiling = lambda *a: True",
    "torch._higher_order_ops.effects.has_effects": (
        "import torch._higher_order_ops.effects as e; e.has_effects = lambda op: False"
    ),
    # Absent before torch 2.15: a replacement that forgets every effectful op must still fail the import.
    "torch.utils.checkpoint._is_cacheable_effect": (
        "import torch.utils.checkpoint as c; c._is_cacheable_effect = lambda op: False"
    ),
    "torch._library.simple_registry.singleton._data / torch._C._jit_get_all_schemas": (
        "torch._C._jit_get_all_schemas = None"
    ),
    "torch._C._disabled_torch_dispatch_impl": "torch._C._disabled_torch_dispatch_impl = lambda *a: None",
    "torch.utils.checkpoint.SAC_IGNORED_OPS": "import torch.utils.checkpoint as c; c.SAC_IGNORED_OPS = set()",
    "torch._C._is_alias_of": "torch._C._is_alias_of = lambda a, b: True",
    "torch._subclasses.fake_tensor.FakeTensorMode": (
        "import torch._subclasses.fake_tensor as f; f.FakeTensorMode.__module__ = 'elsewhere'"
    ),
    "torch._ops.OpOverload._schema": (
        "import torch._ops as o; o.OpOverload._schema = property(lambda self: None)"
    ),
    "torch.utils._python_dispatch._disable_current_modes": (
        "import contextlib, torch.utils._python_dispatch as d; d._disable_current_modes = contextlib.nullcontext"
    ),
    "torch._ops.HigherOrderOperator.__init__": (
        "import torch._ops as o; o.HigherOrderOperator.__init__ = lambda self, name, **kwargs: None"
    ),
    "torch.utils._pytree.tree_flatten": (
        "import torch.utils._pytree as p; p.tree_unflatten = lambda leaves, spec: list(leaves)"
    ),
    "torch._C._DisableFuncTorch": "import contextlib; torch._C._DisableFuncTorch = contextlib.nullcontext",
    "threading.Thread._bootstrap_inner": "import threading; del threading.Thread._bootstrap_inner",
    # A torch whose checkpoint takes respect_saved_tensors_hooks (2.14 on) but
    # whose user-hooks finder is gone: the option would silently do nothing.
    "torch.utils.checkpoint._current_user_saved_tensors_hooks": (
        "import torch.utils.checkpoint as c; "
        "c.checkpoint = lambda function, *args, respect_saved_tensors_hooks=False, **kwargs: None; "
        "c.__dict__.pop('_current_user_saved_tensors_hooks', None)"
    ),
}


@pytest.mark.parametrize("internal", sorted(BROKEN))
def test_a_changed_internal_fails_the_import_naming_it(internal):
    result = run_python(
        f"""
        import torch
        {BROKEN[internal]}
        try:
            import aliasguard
        except ImportError as error:
            print("ImportError:", error)
        else:
            print("imported")
        """
    )
    assert result.returncode == 0, result.stderr
    assert "ImportError: aliasguard cannot run on torch" in result.stdout, result.stdout
    assert internal in result.stdout, result.stdout


def test_user_hooks_finder_is_required_only_where_checkpoint_takes_the_option():
    # The control for the case above: with the finder present, the same torch imports.
    result = run_python(
        """
        import torch.utils.checkpoint as c
        c.checkpoint = lambda function, *args, respect_saved_tensors_hooks=False, **kwargs: None
        c._current_user_saved_tensors_hooks = lambda: None
        import aliasguard
        from aliasguard import _torch_internals
        print(_torch_internals.sac_respects_saved_tensors_hooks())
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True"]
    expected = "respect_saved_tensors_hooks" in inspect.signature(torch.utils.checkpoint.checkpoint).parameters
    assert _torch_internals.sac_respects_saved_tensors_hooks() is expected


def test_detach_kernel_keys_have_no_stock_kernel():
    # The keys come from the C++ registration itself; the question goes to a
    # process that never imported aliasguard.
    keys = _C._detach_keep_version_counter_keys()
    assert "CPU" in keys and len(keys) == len(set(keys))
    result = run_python(
        f"""
        import sys
        import torch
        keys = {keys!r}
        print([k for k in keys if torch._C._dispatch_has_kernel_for_dispatch_key("aten::detach", k)])
        print("aliasguard" in sys.modules)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["[]", "False"], result.stdout
    # Here, installed, each of them has aliasguard's kernel.
    assert all(torch._C._dispatch_has_kernel_for_dispatch_key("aten::detach", key) for key in keys)


def test_tracing_infrastructure_is_recognised_and_user_modes_are_not():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch._subclasses.functional_tensor import FunctionalTensorMode

    class UserMode(TorchDispatchMode):
        pass

    assert _torch_internals.is_tracing_infrastructure(FakeTensorMode)
    assert _torch_internals.is_tracing_infrastructure(FunctionalTensorMode)
    assert not _torch_internals.is_tracing_infrastructure(UserMode)
    assert not _torch_internals.is_tracing_infrastructure(torch.Tensor)


def test_import_under_inference_mode_and_no_grad():
    # The self-test runs at import; fresh tensors under inference_mode have no
    # version counter, so it must not judge the internals by them.
    result = run_python(
        """
        import torch
        with torch.inference_mode(), torch.no_grad():
            import aliasguard
        x = torch.zeros(2)
        with torch.inference_mode():
            y = torch.ones(2)
        print("ok", torch.is_inference_mode_enabled(), y.is_inference())
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ok", "False", "True"]


def test_import_correction_and_audit_leave_functorchs_thread_state_uncreated():
    # functorch creates its thread-local interpreter stack on first access, and
    # from then on every autograd graph task copies it. Stock code that never
    # runs a transform never creates it; neither may import aliasguard, a
    # corrected dispatch, or the audit's reporter (which asks whether a
    # transform runs). Every function of torch._C._functorch is replaced by one
    # that records its call, before aliasguard is imported.
    result = run_python(
        """
        import torch
        import torch._C._functorch as functorch_c
        called = []
        for name in dir(functorch_c):
            fn = getattr(functorch_c, name)
            if not name.startswith("__") and callable(fn) and not isinstance(fn, type):
                setattr(functorch_c, name, lambda *a, _fn=fn, _name=name, **k: (called.append(_name), _fn(*a, **k))[1])
        import aliasguard
        from aliasguard.testing import PassThroughMode, WrapperTensor
        x = torch.randn(4, requires_grad=True)
        with aliasguard.audit():
            with PassThroughMode():
                x.view(2, 2).sin().sum().backward()
            WrapperTensor(torch.randn(4)).view(2, 2)
        assert aliasguard._aliasing._infrastructure_active() is False
        print(called)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_audit_reporter_sees_a_functorch_transform():
    seen = []

    def f(t):
        seen.append(aliasguard._aliasing._infrastructure_active())
        return t.sin().sum()

    assert aliasguard._aliasing._infrastructure_active() is False
    torch.func.grad(f)(torch.randn(3))
    torch.vmap(lambda t: (seen.append(aliasguard._aliasing._infrastructure_active()), t * 2)[1])(torch.randn(2, 3))
    assert seen == [True, True]


def test_effect_candidates_are_dispatcher_ops_and_include_aten_effects():
    # The fast path registers kernels for what torch keeps of these (Note
    # [Effectful ops on the fast path]): an operator the JIT knows but the
    # dispatcher does not (cuda::set_stream) must not be among them.
    ops = _torch_internals.effect_candidate_ops()
    registered = set(torch._C._dispatch_get_all_op_names())
    assert torch.ops.aten._linalg_check_errors.default in ops
    for op in ops:
        schema = op._schema
        assert (f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name) in registered, op
