"""Small training/inference steps of real tensor-subclass clients.

Each workload returns a dict of plain tensors (outputs, gradients, updated
parameters). ``test_real_clients.py`` runs each one in-process with aliasguard
imported (correction on, and inside ``audit()``) and compares with the same
workload run by ``python real_client_workloads.py NAME OUT`` in a process that
never imports aliasguard: that is "stock".
"""

from __future__ import annotations

import contextlib
import socket
import sys
import warnings

import torch


def _plain(t: torch.Tensor) -> torch.Tensor:
    """A plain dense copy of ``t`` (subclasses unwrapped)."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t.full_tensor()
    if getattr(t, "is_nested", False):
        return t.values().detach().clone()
    if type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter:
        for attr in ("elem", "a"):
            if hasattr(t, attr):
                return _plain(getattr(t, attr))
        if hasattr(t, "dequantize"):
            return t.dequantize().detach().clone()
    return t.detach().clone()


def two_tensor_training():
    from torch.testing._internal.two_tensor import TwoTensor

    torch.manual_seed(0)
    w = torch.randn(8, 4)
    x = torch.randn(3, 8)
    tw = TwoTensor(w.clone(), w.clone()).requires_grad_()
    opt = torch.optim.SGD([tw], lr=0.1, momentum=0.9)
    for _ in range(2):
        opt.zero_grad()
        out = (TwoTensor(x, x.clone()) @ tw).relu()
        out[:, 1:3].sum().backward()
        opt.step()
    return {"out": _plain(out), "grad": _plain(tw.grad), "w": _plain(tw)}


def logging_tensor_training():
    from torch.testing._internal.logging_tensor import LoggingTensor, capture_logs

    import logging

    # LoggingTensor's records can only be formatted by capture_logs' handler;
    # once any capture_logs block has run, its logger stays at INFO and any
    # other handler (pytest's log capture) fails on them. Keep them to ourselves.
    logger = logging.getLogger("LoggingTensor")
    saved = logger.propagate, logger.level, logger.handlers[:]
    logger.propagate = False
    logger.handlers.clear()
    try:
        with capture_logs() as logs:
            torch.manual_seed(0)
            w = LoggingTensor(torch.randn(6, 5), requires_grad=True)
            x = LoggingTensor(torch.randn(2, 6))
            h = x @ w
            v = h.view(10).narrow(0, 2, 6)
            y = (v.tanh() * 2).sum()
            y.backward()
            with torch.no_grad():
                w.sub_(0.1 * w.grad)
    finally:
        logger.propagate, logger.level, logger.handlers[:] = saved
    ops = torch.tensor([len(logs)])
    return {"y": _plain(y), "grad": _plain(w.grad), "w": _plain(w), "ops_logged": ops}


def nested_jagged_training():
    torch.manual_seed(0)
    parts = [torch.randn(n, 6) for n in (2, 5, 3)]
    lin = torch.nn.Linear(6, 4)
    nt = torch.nested.nested_tensor(parts, layout=torch.jagged, requires_grad=True)
    out = torch.nn.functional.gelu(lin(nt))
    out.values().sum().backward()
    unbound = [u.detach().clone() for u in out.unbind()]
    return {
        "out": _plain(out),
        "unbind0": unbound[0],
        "unbind2": unbound[2],
        "grad_w": lin.weight.grad.clone(),
        "grad_in": nt.grad.values().clone(),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def gloo_world_of_one():
    """A gloo process group of world size 1 on loopback, in this process."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def dtensor_training():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    own_group = not dist.is_initialized()
    ctx = gloo_world_of_one() if own_group else contextlib.nullcontext()
    with ctx:
        mesh = init_device_mesh("cpu", (1,))
        torch.manual_seed(0)
        w = torch.randn(8, 4)
        x = torch.randn(5, 8)
        dw = torch.nn.Parameter(distribute_tensor(w, mesh, [Shard(0)]))
        dx = distribute_tensor(x, mesh, [Replicate()])
        opt = torch.optim.SGD([dw], lr=0.05)
        out = (dx @ dw).relu()
        out.sum().backward()
        opt.step()
        return {"out": _plain(out), "grad": _plain(dw.grad), "w": _plain(dw)}


def dtensor_tensor_parallel_attention():
    """Attention with a fused qkv projection sharded by heads, split into q, k, v on DTensor."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    own_group = not dist.is_initialized()
    ctx = gloo_world_of_one() if own_group else contextlib.nullcontext()
    with ctx:
        mesh = init_device_mesh("cpu", (1,))
        torch.manual_seed(0)
        x = distribute_tensor(torch.randn(2, 5, 8), mesh, [Replicate()])
        w_qkv = torch.nn.Parameter(distribute_tensor(torch.randn(24, 8), mesh, [Shard(0)]))
        w_out = torch.nn.Parameter(distribute_tensor(torch.randn(8, 8), mesh, [Shard(1)]))
        q, k, v = torch.nn.functional.linear(x, w_qkv).chunk(3, dim=-1)
        heads = [h.softmax(-1) for h in (q @ k.transpose(-2, -1)).unbind(0)]
        attn = torch.stack(heads) @ v
        out = torch.nn.functional.linear(torch.cat(attn.split(4, dim=-1), dim=-1), w_out)
        out.sum().backward()
        return {"out": _plain(out), "grad_qkv": _plain(w_qkv.grad), "grad_out": _plain(w_out.grad)}


def torchao_optimizer_state_slices():
    """Slices of torchao's quantized optimizer states (what dcp.load does when re-sharding)."""
    warnings.filterwarnings("ignore")
    from torchao.optim.subclass_4bit import OptimState4bit
    from torchao.optim.subclass_8bit import OptimState8bit

    torch.manual_seed(0)
    out = {}
    for cls in (OptimState4bit, OptimState8bit):
        state = cls.zeros((256, 256))
        state.copy_(torch.randn(256, 256))
        part = state[128:256]
        part.copy_(torch.randn(128, 256))  # written through the slice, into the state
        out[cls.__name__] = state.dequantize()
        out[cls.__name__ + "_part"] = part.dequantize()
    return out


def torchao_int8_inference():
    warnings.filterwarnings("ignore")
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    quantize_(model, Int8WeightOnlyConfig())
    x = torch.randn(4, 16)
    with torch.no_grad():
        y = model(x)
    return {"y": y.clone(), "w0": _plain(model[0].weight)}


WORKLOADS = {
    "two_tensor": two_tensor_training,
    "logging_tensor": logging_tensor_training,
    "nested_jagged": nested_jagged_training,
    "dtensor": dtensor_training,
    "dtensor_tp_attention": dtensor_tensor_parallel_attention,
    "torchao_int8": torchao_int8_inference,
    "torchao_optim_state": torchao_optimizer_state_slices,
}


if __name__ == "__main__":
    name, out_path = sys.argv[1], sys.argv[2]
    assert "aliasguard" not in sys.modules
    result = WORKLOADS[name]()
    assert "aliasguard" not in sys.modules, "the stock run must not import aliasguard"
    torch.save(result, out_path)
