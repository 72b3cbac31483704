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
