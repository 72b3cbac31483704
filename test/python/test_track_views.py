"""F2: aliasguard.track_views."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import aliasguard
from aliasguard import _C, shares_version_counter, track_views


class UntrackedMode(TorchDispatchMode):
    """A mode opted out of automatic tracking: its body runs with
    ADInplaceOrView excluded, as in stock PyTorch, which is where
    track_views() matters."""

    __aliasguard_track_views__ = False


class ViewAsMode(UntrackedMode):
    def __init__(self, tracked):
        super().__init__()
        self.tracked = tracked
        self.saved = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.sin.default:
            if self.tracked:
                with track_views():
                    self.saved = out.view_as(out)
            else:
                self.saved = out.view_as(out)
        return out


def test_untracked_view_misses_mutation_in_an_opted_out_mode():
    mode = ViewAsMode(tracked=False)
    with mode:
        b = torch.sin(torch.tensor(1.0))
    version = mode.saved._version
    b.mul_(2)
    assert mode.saved._version == version  # stock behaviour: the bug
    assert not mode.saved._is_view()


def test_tracked_view_is_a_real_view():
    mode = ViewAsMode(tracked=True)
    with mode:
        b = torch.sin(torch.tensor(1.0))
    assert mode.saved._is_view()
    assert mode.saved._base is b
    assert shares_version_counter(mode.saved, b)
    version = mode.saved._version
    b.mul_(2)
    assert mode.saved._version > version


def test_inplace_ops_bump_counters_inside():
    seen = {}

    class InplaceMode(UntrackedMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten.cos.default:
                before = out._version
                out.add_(0)
                seen["untracked"] = out._version - before
                with track_views():
                    before = out._version
                    out.add_(0)
                    seen["tracked"] = out._version - before
            return out

    with InplaceMode():
        torch.cos(torch.ones(2))
    assert seen == {"untracked": 0, "tracked": 1}


def test_nesting_and_decorator():
    states = []

    @track_views()
    def inner():
        states.append(_C._is_view_tracking_enabled())
        with track_views():
            states.append(_C._is_view_tracking_enabled())
        states.append(_C._is_view_tracking_enabled())

    class Mode(UntrackedMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.sin.default:
                states.append(_C._is_view_tracking_enabled())
                inner()
                inner()
                states.append(_C._is_view_tracking_enabled())
            return func(*args, **(kwargs or {}))

    with Mode():
        torch.sin(torch.ones(1))
    assert states == [False, True, True, True, True, True, True, False]


def test_exception_restores_state():
    observed = []

    class Mode(UntrackedMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.sin.default:
                with pytest.raises(ValueError):
                    with track_views():
                        raise ValueError("boom")
                observed.append(_C._is_view_tracking_enabled())
                observed.append(
                    torch._C._dispatch_tls_is_dispatch_key_excluded(
                        torch._C.DispatchKey.ADInplaceOrView
                    )
                )
            return func(*args, **(kwargs or {}))

    with Mode():
        torch.sin(torch.ones(1))
    assert observed == [False, True]


def test_top_level_changes_nothing():
    before = torch._C._dispatch_tls_local_exclude_set()
    with track_views():
        inside = torch._C._dispatch_tls_local_exclude_set()
        x = torch.ones(2)
        v = x.view(2)
    after = torch._C._dispatch_tls_local_exclude_set()
    assert str(before) == str(inside) == str(after)
    assert v._is_view()
    assert aliasguard.track_views is track_views
