# Type stubs for the aliasguard._C extension module.
from typing import Callable, Optional

import torch

# core patch (views and version counters)
def _mark_as_view(
    tensor: torch.Tensor,
    base: torch.Tensor,
    *,
    is_bw_differentiable: bool = ...,
    is_fw_differentiable: bool = ...,
    view_fn: Optional[Callable[[torch.Tensor], torch.Tensor]] = ...,
    creation_meta: Optional[str] = ...,
    alias_storage: bool = ...,
) -> torch.Tensor: ...
def shares_version_counter(a: torch.Tensor, b: torch.Tensor) -> bool: ...
def _enable_view_tracking() -> bool: ...
def _restore_view_tracking(was_excluded: bool) -> None: ...
def _is_view_tracking_enabled() -> bool: ...
