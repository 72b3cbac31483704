# Type stubs for the aliasguard._C extension module (kept in step with
# torch/csrc/utils/python_*.cpp; mypy checks the package against them).
from typing import Callable, Optional, TypeVar

import torch

# views and version counters (python_bindings.cpp)
_T = TypeVar("_T", bound=torch.Tensor)
_O = TypeVar("_O")

def _mark_as_view(
    tensor: _T,
    base: torch.Tensor,
    *,
    is_bw_differentiable: bool = ...,
    is_fw_differentiable: bool = ...,
    view_fn: Optional[Callable[[torch.Tensor], torch.Tensor]] = ...,
    creation_meta: Optional[str] = ...,
    alias_storage: bool = ...,
) -> _T: ...
def shares_version_counter(a: torch.Tensor, b: torch.Tensor) -> bool: ...
def _enable_view_tracking() -> bool: ...
def _restore_view_tracking(was_excluded: bool) -> None: ...
def _is_view_tracking_enabled() -> bool: ...

# torch internals (torch_internals.cpp, python_torch_internals.cpp)
def _torch_internals_self_test() -> list[str]: ...

# alias correction and audit (python_aliasing_error.cpp, python_alias_correction.cpp,
# python_corrected_dispatch.cpp)
class AliasingError(RuntimeError):
    op: str
    return_index: int
    argument: Optional[str]

class _CorrectedDispatch:
    __aliasguard_wrapped__: Callable[..., object]
    __aliasguard_owner__: Optional[type]
    def __init__(self, fn: Callable[..., object], owner: Optional[type] = ...) -> None: ...
    def __call__(self, *args: object, **kwargs: object) -> object: ...
    def __get__(self, obj: object, objtype: Optional[type] = ...) -> Callable[..., object]: ...

def _correct_aliasing(
    func: object, args: tuple[object, ...], kwargs: Optional[dict[str, object]], out: _O
) -> _O: ...
def _set_alias_correction(enabled: bool) -> bool: ...
def _is_alias_correction_enabled() -> bool: ...
def _set_alias_audit(enabled: bool) -> bool: ...
def _is_alias_audit_enabled() -> bool: ...

# schema alias analysis (python_schema_alias_analysis.cpp)
ReturnAliasInfo = tuple[str, Optional[int], Optional[str], bool]

class OpAliasInfo:
    name: str
    returns: tuple[ReturnAliasInfo, ...]
    written_arguments: tuple[tuple[int, str], ...]
    has_view_returns: bool
    has_write_returns: bool
    may_return_views: bool

def _schema_alias_info(name: str, overload: str = ...) -> list[ReturnAliasInfo]: ...
def _op_alias_info(op: object) -> Optional[OpAliasInfo]: ...

# automatic view tracking in __torch_dispatch__ (python_tracked_dispatch.cpp)
def _set_automatic_view_tracking(enabled: bool) -> bool: ...
def _is_automatic_view_tracking_enabled() -> bool: ...
def _call_tracked(op: Callable[..., object], *args: object, **kwargs: object) -> object: ...

# Selective checkpointing (torch/csrc/autograd/python_selective_checkpoint.cpp)
def _sac_configure(options: dict[str, object]) -> None: ...
def _sac_new_state(
    policy_fn: Optional[Callable[..., object]],
    saved_ops: frozenset[object],
    effect_overrides: frozenset[object],
    allow_mutation: bool,
) -> object: ...
def _sac_end_forward(state: object) -> None: ...
def _sac_begin_recompute(state: object) -> None: ...
def _sac_entries(state: object) -> list[tuple[object, object, str]]: ...

_sac_forward_dispatch: Callable[..., object]
_sac_recompute_dispatch: Callable[..., object]
