"""Helpers shared by aliasguard's tests and benchmarks.

Not part of the library proper: small, dependency-free tools for measuring
memory and for exercising alias correction with a wrapper subclass or a
dispatch mode.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from aliasguard._torch_internals import TorchDispatchMode, tree_leaves, tree_map

__all__ = ["WrapperTensor", "InnerTensor", "PassThroughMode", "StorageTracker"]


class PassThroughMode(TorchDispatchMode):
    """A dispatch mode whose ``__torch_dispatch__`` runs every op unchanged.

    Entering it sends every op through a Python ``__torch_dispatch__`` that
    does nothing but forward the op: what alias correction, view tracking and
    ``audit()`` see for any mode (no ``kernels=True`` needed), and the
    baseline to compare a mode that does something against.
    """

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: Tuple[Any, ...] = (),
        kwargs: Optional[Dict[str, Any]] = None,
    ) -> Any:
        return func(*args, **(kwargs or {}))


class StorageTracker(TorchDispatchMode):
    """Remembers every storage an op returns; reports the bytes still alive.

    Use as a dispatch mode around a forward pass; afterwards :meth:`live`
    gives the storages (by ``_cdata``) that are still referenced, with their
    sizes: what the pass keeps alive for the backward.
    """

    def __init__(self) -> None:
        super().__init__()
        self.storages: Dict[int, Tuple[StorageWeakRef, int]] = {}

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: Tuple[Any, ...] = (),
        kwargs: Optional[Dict[str, Any]] = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                known = self.storages.get(storage._cdata)
                if known is None or known[0].expired():  # addresses get reused
                    self.storages[storage._cdata] = (StorageWeakRef(storage), storage.nbytes())
        return out

    def live(self, exclude: Tuple[torch.Tensor, ...] = ()) -> Dict[int, int]:
        """``{storage key: nbytes}`` of the storages still alive, minus those of ``exclude``."""
        excluded = {t.untyped_storage()._cdata for t in exclude}
        return {
            key: nbytes for key, (ref, nbytes) in self.storages.items() if not ref.expired() and key not in excluded
        }


class WrapperTensor(torch.Tensor):
    """A ``_make_wrapper_subclass`` tensor around one real tensor, ``elem``.

    Its ``__torch_dispatch__`` unwraps every ``WrapperTensor`` argument, runs
    the op on the wrapped tensors, calls :meth:`on_dispatch` (a hook for
    tests) and wraps every tensor result again: views of a wrapper are new
    wrappers with placeholder storage, exactly the case alias correction
    repairs. Subclass it and override :meth:`on_dispatch` (or
    ``__torch_dispatch__``) to observe or change what happens.
    """

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> "WrapperTensor":  # noqa: D102
        wrapper: WrapperTensor = torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype)
        return wrapper

    def __init__(self, inner: torch.Tensor) -> None:
        self.elem = inner

    @classmethod
    def on_dispatch(cls, func: Any, unwrapped_args: Tuple[Any, ...], out: Any) -> None:
        """Called with each op, its unwrapped arguments and its unwrapped result."""

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls,
        func: Any,
        types: Any,
        args: Tuple[Any, ...] = (),
        kwargs: Optional[Dict[str, Any]] = None,
    ) -> Any:
        unwrap: Callable[[Any], Any] = lambda a: a.elem if isinstance(a, WrapperTensor) else a  # noqa: E731
        unwrapped = tree_map(unwrap, args)
        out = func(*unwrapped, **tree_map(unwrap, kwargs or {}))
        cls.on_dispatch(func, unwrapped, out)
        return tree_map(lambda t: cls(t) if isinstance(t, torch.Tensor) else t, out)


class InnerTensor(torch.Tensor):
    """A ``_make_wrapper_subclass`` tensor around one real tensor, ``elem``, with its strides and offset.

    Only construction: no ``__torch_dispatch__`` of its own, so each subclass
    writes the dispatch it wants to test (unlike :class:`WrapperTensor`,
    whose wrappers are contiguous and share one dispatch).
    """

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> "InnerTensor":  # noqa: D102
        wrapper: InnerTensor = torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, strides=elem.stride(), storage_offset=elem.storage_offset(), dtype=elem.dtype
        )
        return wrapper

    def __init__(self, elem: torch.Tensor) -> None:
        self.elem = elem
