"""docs/checkpoint-guide.md's example: torch's SAC is silently wrong, aliasguard's refuses the write.

The guide's ``decoder_example.py`` block (a llama-style decoder checkpointed
per block with torchtitan's save list and policy, whose feed-forward writes
``g.mul_(0.5)`` to the output of a saved projection) is taken from the page as
it is and run on a small decoder:

* stock torch, in a child process that never imports aliasguard: torch's SAC
  gives gradients that differ from the un-checkpointed run for every parameter
  behind a checkpointed block, while plain checkpointing (the control) and the
  parameters after the blocks match bitwise;
* aliasguard, on the mode path (``fast_path=False``) and on the fast path
  (``ops=``): ``CheckpointMutationError`` before the write, naming the writing
  op and its line and the saved op's line, in the message and in the
  attributes; nothing was written; and the message is the one the guide shows.
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections import defaultdict
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, List, Tuple

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from aliasguard.checkpoint import CheckpointMutationError, create_selective_checkpoint_contexts
from subprocess_snippets import assert_clean_exit, run_snippet

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "checkpoint-guide.md"
EXAMPLE_FILE = "decoder_example.py"
# A small decoder: the guide's runs 4 blocks of dim 256 on 4 x 128 tokens.
SMALL = {"layers": 2, "dim": 32, "heads": 2, "hidden": 64, "vocab": 64}
TOKENS_SHAPE = (2, 16)
# Each path with the guide's ops= (the dispatcher ops of the save list).
PATHS = {"mode path": {"fast_path": False}, "fast path": {}}


def guide_blocks(language: str) -> List[str]:
    """The fenced code blocks of the guide in ``language``, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```$", GUIDE.read_text(), re.MULTILINE | re.DOTALL)


def example_source() -> str:
    """The guide's ``decoder_example.py`` block: the python block whose first line names that file."""
    blocks = [b for b in guide_blocks("python") if b.startswith(f"# {EXAMPLE_FILE}")]
    assert len(blocks) == 1, f"{GUIDE} must hold one python block starting with '# {EXAMPLE_FILE}'"
    return blocks[0]


def line_of(source: str, text: str) -> int:
    """The 1-based number of the one line of ``source`` that contains ``text``."""
    numbers = [n for n, line in enumerate(source.splitlines(), 1) if text in line]
    assert len(numbers) == 1, f"{text!r} is on lines {numbers} of the example"
    return numbers[0]


@pytest.fixture(scope="module")
def example_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The guide's example, written to a file of its own (its lines are the ones errors name)."""
    path = tmp_path_factory.mktemp("checkpoint_guide") / EXAMPLE_FILE
    path.write_text(example_source())
    return path


@pytest.fixture(scope="module")
def example(example_path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("checkpoint_guide_decoder_example", example_path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def small_model_and_tokens(example: ModuleType) -> Tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = example.Decoder(**SMALL)
    return model, torch.randint(0, SMALL["vocab"], TOKENS_SHAPE)


def dispatcher_ops(example: ModuleType) -> List[Any]:
    """The guide's ``OPS``: the save list's dispatcher ops (its higher-order ops left out)."""
    return [op for op in example.SAVE_LIST if isinstance(op, torch._ops.OpOverload)]


def aliasguard_context_fn(example: ModuleType, **options: Any) -> Any:
    ops = dispatcher_ops(example)

    def context_fn() -> Any:
        return create_selective_checkpoint_contexts(example.get_custom_policy(defaultdict(int)), ops=ops, **options)

    return context_fn


# --- stock torch ------------------------------------------------------------------------------

STOCK_PROGRAM = r"""
import copy, importlib.util, json, sys
from collections import defaultdict

import torch
import torch.utils.checkpoint as torch_checkpoint

path, small, tokens_shape = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
spec = importlib.util.spec_from_file_location("decoder_example", path)
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)

torch.manual_seed(0)
model = example.Decoder(**small)
tokens = torch.randint(0, small["vocab"], tokens_shape)
expected = example.gradients(model, tokens)


def checkpointed_gradients(context_fn):
    checkpointed = copy.deepcopy(model)
    example.apply_ac(checkpointed, context_fn)
    return example.gradients(checkpointed, tokens)


def sac_context_fn():  # the guide's stock context_fn
    return torch_checkpoint.create_selective_checkpoint_contexts(example.get_custom_policy(defaultdict(int)))


sac = checkpointed_gradients(sac_context_fn)
plain = checkpointed_gradients(torch_checkpoint.noop_context_fn)
print(json.dumps({
    "aliasguard_imported": "aliasguard" in sys.modules,
    "sac_relative_error": {n: ((sac[n] - g).norm() / g.norm()).item() for n, g in expected.items()},
    "sac_equal": {n: torch.equal(sac[n], g) for n, g in expected.items()},
    "plain_equal": {n: torch.equal(plain[n], g) for n, g in expected.items()},
}))
"""


@pytest.fixture(scope="module")
def stock(example_path: Path) -> Dict[str, Any]:
    """What the guide's example gives with stock torch alone: torch's SAC and plain checkpointing."""
    program = f"import sys; sys.argv[1:] = {[str(example_path), json.dumps(SMALL), json.dumps(TOKENS_SHAPE)]!r}\n"
    result = run_snippet(program + STOCK_PROGRAM, timeout=300)
    assert_clean_exit(result)
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_stock_runs_without_aliasguard(stock: Dict[str, Any]) -> None:
    assert stock["aliasguard_imported"] is False


def test_stock_plain_checkpoint_gives_the_uncheckpointed_gradients(stock: Dict[str, Any]) -> None:
    # The control: the write itself is fine where the recompute reruns w1.
    assert all(stock["plain_equal"].values()), [n for n, same in stock["plain_equal"].items() if not same]


def test_stock_sac_gives_wrong_gradients_behind_every_checkpointed_block(stock: Dict[str, Any]) -> None:
    errors: Dict[str, float] = stock["sac_relative_error"]
    behind_blocks = [n for n in errors if n.startswith(("tok_embeddings.", "layers."))]
    after_blocks = [n for n in errors if n not in behind_blocks]
    assert behind_blocks and after_blocks
    # Not float noise: float32 rounding is ~1e-7 relative; the write halves g twice.
    assert all(errors[n] > 1e-3 for n in behind_blocks), {n: errors[n] for n in behind_blocks}
    assert max(errors.values()) > 0.1
    # The forward pass is right, so what comes after the blocks is bitwise right.
    assert all(stock["sac_equal"][n] for n in after_blocks)


# --- aliasguard -------------------------------------------------------------------------------


class Written:
    """The input and output of a module's calls (the output is the tensor the caller goes on to use)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.calls: List[Tuple[torch.Tensor, torch.Tensor]] = []
        self.handle = module.register_forward_hook(self.record)

    def record(self, module: torch.nn.Module, inputs: Tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        self.calls.append((inputs[0], output))


def refused_write(example: ModuleType, path: str) -> Tuple[CheckpointMutationError, Written, torch.nn.Module]:
    """Runs the small example under aliasguard's SAC on ``path``; the error, and what the first w1 returned."""
    model, tokens = small_model_and_tokens(example)
    first_w1 = model.layers[0].feed_forward.w1
    written = Written(first_w1)
    example.apply_ac(model, aliasguard_context_fn(example, **PATHS[path]))
    with pytest.raises(CheckpointMutationError) as info:
        example.gradients(model, tokens)
    written.handle.remove()
    return info.value, written, first_w1


@pytest.mark.parametrize("path", list(PATHS))
def test_the_path_is_the_one_named(example: ModuleType, path: str) -> None:
    forward, recompute = aliasguard_context_fn(example, **PATHS[path])()
    modes = isinstance(forward, TorchDispatchMode) and isinstance(recompute, TorchDispatchMode)
    assert modes == (path == "mode path")


@pytest.mark.parametrize("path", list(PATHS))
def test_the_write_is_refused_naming_the_writing_op_and_both_lines(example: ModuleType, path: str) -> None:
    error, _, _ = refused_write(example, path)
    source = example_source()
    here = example.FeedForward.forward.__code__.co_filename
    mutated_at = f"{here}:{line_of(source, 'g.mul_(0.5)')}"
    cached_at = f"{here}:{line_of(source, 'g = self.w1(x)')}"
    message = str(error)
    for fact in ("aten.mul_.Tensor", mutated_at, "aten.mm.default", cached_at):
        assert fact in message, f"{fact!r} not in: {message}"
    assert (error.mutating_op, error.mutated_at) == ("aten.mul_.Tensor", mutated_at)
    assert (error.cached_op, error.cached_at) == ("aten.mm.default", cached_at)


@pytest.mark.parametrize("path", list(PATHS))
def test_nothing_was_written(example: ModuleType, path: str) -> None:
    _, written, w1 = refused_write(example, path)
    assert len(written.calls) == 1  # the first block's forward stopped at its write
    ((x, g),) = written.calls
    with torch.no_grad():
        unwritten = w1(x)
    assert torch.equal(g, unwritten), "g was written before the error"


@pytest.mark.parametrize("path", list(PATHS))
def test_the_guide_shows_the_message_raised(example: ModuleType, example_path: Path, path: str) -> None:
    error, _, _ = refused_write(example, path)
    raised = f"{type(error).__name__}: {error}".replace(f"{example_path.parent}/", "")
    shown = [b for b in guide_blocks("text") if b.startswith(type(error).__name__)]
    assert len(shown) == 1, "the guide shows the error in one text block"
    assert " ".join(shown[0].split()) == " ".join(raised.split())
