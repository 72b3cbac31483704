"""aliasguard: correct aliasing below autograd for stock PyTorch.

Importing this package gives PyTorch the behaviour of the core patch:

* ``aten::detach`` below autograd keeps its input's version counter;
* :func:`torch.mark_as_view` (also :func:`aliasguard.mark_as_view`) turns a
  tensor into a view of another, like autograd's ``as_view``;
* the result of every ``__torch_dispatch__`` is alias-corrected after it
  returns (:func:`set_alias_correction`, :func:`correct_aliasing`), and
  :func:`audit` checks results against their schemas;
* every ``__torch_dispatch__`` runs with view and in-place tracking
  (:func:`set_view_tracking`, :func:`with_tracking`); :func:`track_views`
  re-enables it for a block where a class opted out.

Every change to torch's global state is made by :func:`install` (called
here, once) and undone by :func:`uninstall`; see ``aliasguard/_install.py``
and ``docs/design.md``.
"""

from __future__ import annotations

from aliasguard._loader import load_extension

# Checks the build first. See Note [Refuse a build for another torch].
_C = load_extension()
# The self-test of the torch internals runs on import; see aliasguard/_torch_internals.py.
from aliasguard import _torch_internals  # noqa: E402,F401
from aliasguard._aliasing import (  # noqa: E402
    AliasingError,
    AuditReport,
    audit,
    correct_aliasing,
    is_alias_correction_enabled,
    set_alias_correction,
)
from aliasguard._install import install, is_installed, uninstall  # noqa: E402
from aliasguard._tracking import (  # noqa: E402
    is_view_tracking_enabled,
    set_view_tracking,
    with_tracking,
)
from aliasguard._views import mark_as_view, shares_version_counter, track_views  # noqa: E402

__version__ = "0.1.0"

install()

# Selective checkpointing; imported after install() (its modes are aliasguard's own).
from aliasguard import checkpoint  # noqa: E402
from aliasguard.checkpoint import CheckpointMutationError, CheckpointPolicyError  # noqa: E402

__all__ = [
    "AliasingError",
    "AuditReport",
    "CheckpointMutationError",
    "CheckpointPolicyError",
    "__version__",
    "audit",
    "checkpoint",
    "correct_aliasing",
    "install",
    "is_alias_correction_enabled",
    "is_installed",
    "is_view_tracking_enabled",
    "mark_as_view",
    "set_alias_correction",
    "set_view_tracking",
    "shares_version_counter",
    "track_views",
    "uninstall",
    "with_tracking",
]
