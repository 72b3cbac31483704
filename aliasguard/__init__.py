"""aliasguard: correct aliasing below autograd for stock PyTorch.

Importing this package gives PyTorch the behaviour of the core patch:

* ``aten::detach`` below autograd keeps its input's version counter;
* :func:`torch.mark_as_view` (also :func:`aliasguard.mark_as_view`) turns a
  tensor into a view of another, like autograd's ``as_view``;
* every ``__torch_dispatch__`` runs with view and in-place tracking
  (:func:`set_view_tracking`, :func:`with_tracking`); :func:`track_views`
  re-enables it for a block where a class opted out.
"""

from __future__ import annotations

import torch

from aliasguard._loader import load_extension

# Checks the build first. See Note [Refuse a build for another torch].
_C = load_extension()
# The self-test of the torch internals runs on import; see aliasguard/_torch_internals.py.
from aliasguard import _torch_internals  # noqa: E402,F401
from aliasguard._views import mark_as_view, shares_version_counter, track_views  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "mark_as_view",
    "shares_version_counter",
    "track_views",
]

# See DESIGN.md: the core patch would add this to torch/__init__.py.
torch.mark_as_view = mark_as_view  # type: ignore[attr-defined]

# --- issue 3: alias correction (aliasguard/_aliasing.py) ---
from aliasguard._aliasing import (  # noqa: E402
    AliasingError,
    audit,
    correct_aliasing,
    is_alias_correction_enabled,
    set_alias_correction,
)

__all__ += [
    "AliasingError",
    "audit",
    "correct_aliasing",
    "is_alias_correction_enabled",
    "set_alias_correction",
]
# --- issue 9: automatic view tracking in __torch_dispatch__ (aliasguard/_tracking.py) ---
from aliasguard._tracking import (  # noqa: E402
    is_view_tracking_enabled,
    set_view_tracking,
    with_tracking,
)

__all__ += ["is_view_tracking_enabled", "set_view_tracking", "with_tracking"]
# --- issue 4: selective checkpointing (aliasguard/checkpoint.py) ---
from aliasguard import checkpoint  # noqa: E402
from aliasguard.checkpoint import CheckpointMutationError  # noqa: E402

__all__ += ["CheckpointMutationError", "checkpoint"]
