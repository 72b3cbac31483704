"""aliasguard.uninstall() puts torch back exactly as it was before ``import aliasguard``.

Each test that uninstalls runs in a fresh interpreter, so the process running
the tests keeps its aliasguard installed; the refusal tests run here (they
change nothing, and re-install in any case).
"""

from __future__ import annotations

import threading

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import aliasguard
from aliasguard import _C
from aliasguard._aliasing import _audit_new_threads
from subprocess_snippets import run_snippet

# Takes a snapshot of everything install() may change; `same(a, b)` lists the
# differences (identity for descriptors). Shared by the snippets below.
SNAPSHOT = """
import threading
import torch
from torch.utils._python_dispatch import TorchDispatchMode

MISSING = object()
DENSE_KEYS = ["CPU", "CUDA", "HIP", "XPU", "MPS"]

def classes():
    seen, pending = [torch.Tensor, TorchDispatchMode], [torch.Tensor, TorchDispatchMode]
    while pending:
        for sub in type.__subclasses__(pending.pop()):
            if sub not in seen:
                seen.append(sub)
                pending.append(sub)
    return seen

def snapshot():
    return {
        "dicts": {
            cls: (cls.__dict__.get("__torch_dispatch__", MISSING), cls.__dict__.get("__init_subclass__", MISSING))
            for cls in classes()
        },
        "mark_as_view": "mark_as_view" in vars(torch),
        "bootstrap": threading.Thread._bootstrap_inner,
        "hops": {name: op.non_fallthrough_keys.raw_repr() for name, op in torch._ops._higher_order_ops.items()},
        # rules for aliasguard's types only: torch registers its own lazily (DTensor's on import)
        "hop_rules": {
            name: sorted(
                f"{k.__module__}.{k.__qualname__}" for k in op.python_key_table if k.__module__.startswith("aliasguard")
            )
            for name, op in torch._ops._higher_order_ops.items()
        },
        "detach_dump": torch._C._dispatch_dump("aten::detach"),
        "detach_keys": [k for k in DENSE_KEYS if torch._C._dispatch_has_kernel_for_dispatch_key("aten::detach", k)],
    }

def differences(before, after):
    found = []
    for cls, (dispatch, init) in before["dicts"].items():
        now = after["dicts"].get(cls)
        if now is None:
            found.append(f"{cls.__qualname__}: gone")
        elif now[0] is not dispatch:
            found.append(f"{cls.__module__}.{cls.__qualname__}.__torch_dispatch__: {dispatch!r} -> {now[0]!r}")
        elif now[1] is not init:
            found.append(f"{cls.__module__}.{cls.__qualname__}.__init_subclass__: {init!r} -> {now[1]!r}")
    for key in ("mark_as_view", "detach_dump", "detach_keys"):
        if before[key] != after[key]:
            found.append(f"{key}: {before[key]!r} -> {after[key]!r}")
    if before["bootstrap"] is not after["bootstrap"]:
        found.append("threading.Thread._bootstrap_inner")
    for name, keys in before["hops"].items():
        if after["hops"].get(name) != keys:
            found.append(f"HOP {name}: {keys} -> {after['hops'].get(name)}")
    for name, rules in before["hop_rules"].items():
        if after["hop_rules"].get(name) != rules:
            found.append(f"HOP {name} rules: {rules} -> {after['hop_rules'].get(name)}")
    return found
"""

# User classes of every kind of __torch_dispatch__, defined before import.
USER_CLASSES = """
def dispatch(self_or_cls, func, types, args=(), kwargs=None):
    return func(*args, **(kwargs or {}))

class PlainMode(TorchDispatchMode):
    __torch_dispatch__ = dispatch

class ClassMode(TorchDispatchMode):
    __torch_dispatch__ = classmethod(dispatch)

class StaticTensor(torch.Tensor):
    __torch_dispatch__ = staticmethod(lambda func, types, args=(), kwargs=None: func(*args, **(kwargs or {})))

class SubMode(PlainMode):  # inherits: nothing of its own to wrap
    pass
"""

PREIMPORT = """
import torch.utils.checkpoint, torch._higher_order_ops.effects
import torch._subclasses.fake_tensor, torch._subclasses.functional_tensor
import torch.fx.experimental.proxy_tensor
"""


def run(code: str) -> str:
    result = run_snippet(code, timeout=300)
    assert result.returncode == 0, result.describe()
    return result.stdout


@pytest.mark.parametrize("preimport", [False, True], ids=["bare-torch", "torch-modules-preimported"])
def test_uninstall_restores_torch_state_exactly(preimport):
    out = run(
        SNAPSHOT
        + (PREIMPORT if preimport else "")
        + USER_CLASSES
        + """
before = snapshot()
import aliasguard
from aliasguard._aliasing import _audit_new_threads

# Installed: the user classes are wrapped, torch.mark_as_view set, detach registered.
changed = snapshot()
assert changed["dicts"][PlainMode][0] is not before["dicts"][PlainMode][0], "PlainMode not wrapped"
assert changed["dicts"][StaticTensor][0] is not before["dicts"][StaticTensor][0], "StaticTensor not wrapped"
assert changed["dicts"][ClassMode][0] is not before["dicts"][ClassMode][0], "ClassMode not wrapped"
assert changed["mark_as_view"] and changed["detach_keys"] == ["CPU", "CUDA", "HIP", "XPU", "MPS"]

# Classes made after install are wrapped too, and restored with the others.
after_install = classmethod(dispatch)
class LateMode(TorchDispatchMode):
    __torch_dispatch__ = after_install
assert LateMode.__dict__["__torch_dispatch__"] is not after_install, "LateMode not wrapped"

# Everything scoped to an audit, used and ended.
with aliasguard.audit(), _audit_new_threads(aliasguard.AuditReport()):
    torch.cond(torch.tensor(True), lambda t: t.sin(), lambda t: t.cos(), (torch.ones(2),))
    thread = threading.Thread(target=lambda: torch.ones(2).view(2))
    thread.start(); thread.join()

# Checkpoint regions on both paths: the higher-order operators lose the write
# guard's key and gain rules for aliasguard's modes, both taken back below.
from aliasguard.checkpoint import checkpoint
x = torch.randn(3, 3, requires_grad=True)
fn = lambda t: torch.cond(t.sum() > 0, torch.sin, torch.cos, (torch.mm(t, t),))
checkpoint(fn, x, policy=[torch.ops.aten.mm.default]).sum().backward()
checkpoint(lambda t: torch.mm(t, t).sin(), x, policy=[torch.ops.aten.mm.default], fast_path=False).sum().backward()
prepared = snapshot()
assert prepared["hops"] != before["hops"], "no higher-order operator lost the write guard's key"
assert any(
    "aliasguard" in rule for rules in prepared["hop_rules"].values() for rule in rules
), "no higher-order operator has a rule for aliasguard's modes"

aliasguard.uninstall()
after = snapshot()
problems = differences(before, after)
if LateMode.__dict__["__torch_dispatch__"] is not after_install:
    problems.append("LateMode.__torch_dispatch__ not restored")
assert not aliasguard.is_installed()
print("PROBLEMS", problems)
print("CLASSES", len(before["dicts"]), "HOPS", len(before["hops"]))
"""
    )
    assert "PROBLEMS []" in out, out
    classes, hops = out.split("CLASSES ")[1].split(" HOPS ")
    assert int(classes) > 6 and int(hops) > 10  # the comparison covered something


# Stock, installed, uninstalled: a mode keeps a view (and a detach) of sin's
# output, made below autograd, then the output is written in place. Stock
# misses the write (version 0, no view); aliasguard sees it.
UPSTREAM_REPORT = """
import torch
from torch.utils._python_dispatch import TorchDispatchMode

saved = []

class SaveView(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.sin.default:
            saved.append((out.view_as(out), out.detach()))
        return out

def report():
    saved.clear()
    a = torch.randn(3, requires_grad=True)
    with SaveView():
        b = a.sin()
    b.mul_(2)
    view, detached = saved[0]
    return (view._version, view._is_view(), detached._version)

stock = report()
import aliasguard
installed = report()
aliasguard.uninstall()
uninstalled = report()
print("STOCK", stock)
print("INSTALLED", installed)
print("UNINSTALLED", uninstalled)
"""


def test_after_uninstall_the_upstream_report_behaves_like_stock():
    out = run(UPSTREAM_REPORT)
    lines = dict(line.split(" ", 1) for line in out.strip().splitlines())
    assert lines["STOCK"] == "(0, False, 0)", out
    assert lines["INSTALLED"] != lines["STOCK"], out  # the control: aliasguard changes it
    assert lines["UNINSTALLED"] == lines["STOCK"], out


def test_install_again_after_uninstall_installs_everything_again():
    out = run(
        """
import warnings
warnings.simplefilter("error")
import torch
from torch.utils._python_dispatch import TorchDispatchMode
import aliasguard
from aliasguard import _C

def dispatch(cls, func, types, args=(), kwargs=None):
    return func(*args, **(kwargs or {}))

# A classmethod: torch's own TorchDispatchMode.__init_subclass__ replaces a
# plain function (by a dynamo-disabled copy), which would blur the identities.
original = classmethod(dispatch)

class Mode(TorchDispatchMode):
    __torch_dispatch__ = original

wrapped = Mode.__dict__["__torch_dispatch__"]
aliasguard.install()  # installed already: nothing changes
assert Mode.__dict__["__torch_dispatch__"] is wrapped

aliasguard.uninstall()
aliasguard.uninstall()  # not installed: nothing to do
assert Mode.__dict__["__torch_dispatch__"] is original
assert not hasattr(torch, "mark_as_view")
assert not _C._is_alias_correction_enabled()
assert not _C._is_detach_keep_version_counter_registered()
try:
    with aliasguard.audit():
        pass
except RuntimeError as error:
    print("AUDIT", error)

# Not installed, new classes are left alone.
class Between(TorchDispatchMode):
    __torch_dispatch__ = original
assert Between.__dict__["__torch_dispatch__"] is original

aliasguard.install()
assert aliasguard.is_installed()
assert Mode.__dict__["__torch_dispatch__"] is not original
assert Between.__dict__["__torch_dispatch__"] is not original
assert torch.mark_as_view is aliasguard.mark_as_view
assert _C._is_alias_correction_enabled() and _C._is_detach_keep_version_counter_registered()
with aliasguard.audit(report=aliasguard.AuditReport()) as report:
    pass

# Replaced by the user after install: left as the user set it.
mine = classmethod(dispatch)
Mode.__torch_dispatch__ = mine
aliasguard.uninstall()
assert Mode.__dict__["__torch_dispatch__"] is mine
assert Between.__dict__["__torch_dispatch__"] is original
print("OK")
"""
    )
    assert "OK" in out, out
    assert "AUDIT aliasguard.audit() needs aliasguard installed" in out, out


# --- refusals: nothing changes -------------------------------------------------------


def installed_state() -> tuple:
    return (
        aliasguard.is_installed(),
        vars(torch).get("mark_as_view"),
        _C._is_alias_correction_enabled(),
        _C._is_detach_keep_version_counter_registered(),
        TorchDispatchMode.__dict__.get("__init_subclass__"),
    )


def expect_refusal(match: str) -> None:
    before = installed_state()
    try:
        with pytest.raises(RuntimeError, match=match):
            aliasguard.uninstall()
        assert installed_state() == before
    finally:
        aliasguard.install()  # should the refusal have failed


def test_uninstall_refuses_while_an_audit_is_open():
    with aliasguard.audit():
        expect_refusal(r"uninstall\(\): an aliasguard.audit\(\) is open .*nothing was changed")


def test_uninstall_refuses_while_an_audit_is_open_on_another_thread():
    opened, release = threading.Event(), threading.Event()

    def audited() -> None:
        with aliasguard.audit():
            opened.set()
            release.wait(60)

    worker = threading.Thread(target=audited)
    worker.start()
    try:
        assert opened.wait(60)
        expect_refusal(r"an aliasguard.audit\(\) is open")
    finally:
        release.set()
        worker.join(60)


def test_uninstall_refuses_while_the_audit_fallback_is_retained():
    _C._retain_alias_audit_fallback()
    try:
        expect_refusal(r"its fallback is retained")
    finally:
        _C._release_alias_audit_fallback()


def test_uninstall_refuses_while_threads_are_audited():
    with _audit_new_threads(aliasguard.AuditReport()):
        expect_refusal(r"threads are being audited")


def test_detach_switch_argument_must_be_a_bool():
    with pytest.raises(TypeError, match="registered must be a bool, got int"):
        _C._set_detach_keep_version_counter(1)
    assert _C._is_detach_keep_version_counter_registered()


# --- install() and uninstall() while bodies run --------------------------------------
# See Note [Installing and uninstalling while bodies run] in
# torch/csrc/utils/running_bodies.h.


def test_uninstall_inside_a_body_is_refused_and_the_body_goes_on():
    seen = {}

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten.sin.default:
                before = installed_state()
                try:
                    aliasguard.uninstall()
                except RuntimeError as error:
                    seen["error"] = str(error)
                seen["unchanged"] = installed_state() == before
                aliasguard.install()  # installed already: nothing to do, and no waiting
                # The body's next op is dispatched as before: a real view.
                seen["view"] = out.view_as(out)
                seen["out"] = out
            return out

    try:
        with Mode():
            torch.sin(torch.ones(3))
    finally:
        aliasguard.install()  # should the refusal have failed
    assert "inside a __torch_dispatch__ body" in seen["error"] and "nothing was changed" in seen["error"], seen
    assert seen["unchanged"]
    assert seen["view"]._base is seen["out"] and aliasguard.shares_version_counter(seen["view"], seen["out"])
    assert not _C._body_running_on_this_thread() and _C._threads_in_bodies() == 0


def test_uninstall_inside_track_views_is_refused():
    try:
        with aliasguard.track_views():
            expect_refusal(r"inside a __torch_dispatch__ body \(or a track_views\(\) or with_tracking\(\) scope\)")
        with pytest.raises(RuntimeError, match=r"with_tracking\(\) scope\) running on this thread"):
            aliasguard.with_tracking(aliasguard.uninstall)()
        assert aliasguard.is_installed()
    finally:
        aliasguard.install()
    assert not _C._body_running_on_this_thread()


def test_uninstall_waits_for_a_body_running_on_another_thread():
    out = run(
        """
import threading, time
import torch
from torch.utils._python_dispatch import TorchDispatchMode
import aliasguard
from aliasguard import _C

entered, release, result = threading.Event(), threading.Event(), {}

class Mode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.sin.default:
            entered.set()
            release.wait(60)
            view = out.view_as(out)  # after uninstall() was called: still tracked
            result["tracked"] = view._base is out and aliasguard.shares_version_counter(view, out)
        return out

def body():
    with Mode():
        torch.sin(torch.ones(2))

worker = threading.Thread(target=body)
worker.start()
assert entered.wait(60)
uninstaller = threading.Thread(target=aliasguard.uninstall)
uninstaller.start()
time.sleep(0.3)
print("WAITING", uninstaller.is_alive() and aliasguard.is_installed())
# Meanwhile a new body on another thread is not held up: it runs as stock.
with Mode():
    torch.cos(torch.ones(2))
print("NOT HELD UP", uninstaller.is_alive())
release.set()
worker.join(60)
uninstaller.join(60)
print("TRACKED", result["tracked"])
print("UNINSTALLED", not aliasguard.is_installed(), not _C._has_tracked_view_kernels(), _C._threads_in_bodies())
"""
    )
    assert "WAITING True" in out, out
    assert "NOT HELD UP True" in out, out
    assert "TRACKED True" in out, out
    assert "UNINSTALLED True True 0" in out, out


# One thread toggles uninstall()/install() (and runs one of aliasguard's
# fast-path checkpoints after each install); the others run a mode, a wrapper
# subclass, torch's selective checkpoint (over ops whose fast-path kernels
# aliasguard registered) and explicit track_views() scopes, and check their
# gradients. None of them may see an error. Without the waiting of Note
# [Installing and uninstalling while bodies run] they see "Could not run ...
# with arguments from the 'AutocastIPU' backend"; with uninstall() releasing
# the fast-path kernels, "INTERNAL ASSERT FAILED at ...KernelFunction.cpp"
# (Note [Fast path registrations are kept]).
STRESS = """
import functools, sys, threading, time, traceback
import torch
from torch.testing._internal.two_tensor import TwoTensor
from torch.utils._python_dispatch import TorchDispatchMode
import torch.utils.checkpoint as torch_checkpoint
import aliasguard
from aliasguard import _C

aten = torch.ops.aten
DURATION = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
torch.set_num_threads(1)

class SavingMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is aten.sin.default:
            self.saved = out.view_as(out)
        return out

def mode_step():
    x = torch.randn(4, requires_grad=True)
    with SavingMode():
        y = (x.sin().view(2, 2) @ torch.ones(2, 2)).sum()
    y.backward()
    torch.testing.assert_close(x.grad, 2 * x.detach().cos())

def subclass_step():
    a = TwoTensor(torch.randn(4), torch.randn(4)).requires_grad_()
    b = a.sin().view(2, 2)
    b.sum().backward()
    torch.testing.assert_close(a.grad.a, a.detach().a.cos())

def region(x):
    return torch.mm(x, x).sin().sum()

def checkpoint_step():
    x = torch.randn(3, 3, requires_grad=True)
    context_fn = functools.partial(torch_checkpoint.create_selective_checkpoint_contexts, [aten.mm.default])
    torch_checkpoint.checkpoint(region, x, use_reentrant=False, context_fn=context_fn).backward()
    expected = torch.autograd.grad(region(x), x)[0]
    torch.testing.assert_close(x.grad, expected)

def track_views_step():
    base = torch.zeros(4)
    with torch._C._AutoDispatchBelowADInplaceOrView():
        with aliasguard.track_views():
            view = base.view(2, 2)
            view.add_(1)
    assert view._base is base and base._version == 1, (view._base is base, base._version)

# The fast-path kernels for mm and _unsafe_view, which every mm above now
# reaches (uninstall() used to take them out again).
aliasguard.checkpoint.checkpoint(region, torch.randn(3, 3, requires_grad=True), policy=[aten.mm.default]).backward()
assert _C._sac_fast_num_kernels() >= 1

stop = threading.Event()
errors, steps = [], {}

def run(name, step):
    n = 0
    while not stop.is_set():
        try:
            step()
        except BaseException:
            errors.append(f"{name}: {traceback.format_exc()}")
        n += 1
    steps[name] = n

workers = [
    threading.Thread(target=run, args=(name, step))
    for name, step in [("mode", mode_step), ("subclass", subclass_step),
                       ("checkpoint", checkpoint_step), ("track_views", track_views_step)]
]
for worker in workers:
    worker.start()
toggles = 0
deadline = time.monotonic() + DURATION
while time.monotonic() < deadline:
    aliasguard.uninstall()
    time.sleep(0.002)
    aliasguard.install()
    # Registers the fast-path kernels again, should uninstall() have taken
    # them out.
    aliasguard.checkpoint.checkpoint(region, torch.randn(3, 3, requires_grad=True), policy=[aten.mm.default]).backward()
    toggles += 1
stop.set()
for worker in workers:
    worker.join(120)
print("TOGGLES", toggles)
print("STEPS", steps)
print("ERRORS", len(errors))
for error in errors[:5]:
    print(error)
"""


def test_install_and_uninstall_with_other_threads_running():
    result = run_snippet(STRESS, timeout=240)
    assert result.returncode == 0, result.describe()
    out = result.stdout
    assert "ERRORS 0" in out, out
    toggles = int(out.split("TOGGLES ")[1].split()[0])
    steps = eval(out.split("STEPS ")[1].splitlines()[0])  # noqa: S307 - our own output
    assert toggles >= 5 and all(n > 0 for n in steps.values()) and len(steps) == 4, out


def test_fast_path_kernels_kept_after_uninstall_pass_calls_through():
    # See Note [Fast path registrations are kept]: uninstall() leaves them,
    # and what they do outside a region is what the fallthrough did.
    out = run(
        """
import torch
from torch.utils._python_dispatch import TorchDispatchMode

class Mode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.mm.default:
            self.seen = (out._version, out._is_view(), out.requires_grad)
        return out

def observe():
    torch.manual_seed(0)
    a = torch.randn(3, 4, requires_grad=True)
    b = torch.randn(2, 4, 4)
    mode = Mode()
    with mode:
        y = a @ a.t()
    z = torch.matmul(b, b)  # batched: ends with aten::_unsafe_view
    with torch.no_grad():
        w = torch.mm(a, a.t())
    (y.sum() + z.sum()).backward()
    return [y.tolist(), y._version, type(y.grad_fn).__name__, z._version, z._is_view(),
            w._version, w.requires_grad, a.grad.tolist(), mode.seen]

stock = observe()
import aliasguard
from aliasguard import _C
aten = torch.ops.aten
x = torch.randn(3, 3, requires_grad=True)
aliasguard.checkpoint.checkpoint(lambda x: torch.mm(x, x).sum(), x, policy=[aten.mm.default]).backward()
aliasguard.uninstall()
print("KEPT", _C._sac_fast_num_kernels() >= 2,
      torch._C._dispatch_has_kernel_for_dispatch_key("aten::mm", "ADInplaceOrView"))
print("SAME", observe() == stock)
"""
    )
    assert "KEPT True True" in out, out
    assert "SAME True" in out, out
