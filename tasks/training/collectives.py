"""Every collective the training engine issues, in one place: each puts its tensor on the device the process
group's backend serves before the call, and hands the result back where the caller keeps it.

nccl refuses a CPU tensor ("No backend type associated with device type cpu") and gloo takes one from any device,
so a CPU-only run cannot see a tensor made on the wrong device: here no caller picks one. tests/unit/test_collectives.py
checks that no other module calls a torch.distributed collective, and runs the call sites in a group that refuses
CPU tensors as nccl does.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def served_device_types() -> list[str]:
    """The device types the default group's backends serve, in their order: 'cuda:nccl' -> [cuda],
    'cpu:gloo,cuda:gloo' -> [cpu, cuda] (dist.get_backend_config)."""
    return [entry.split(":")[0] for entry in dist.get_backend_config().split(",")]


def group_device() -> torch.device:
    """Where a tensor goes for a collective: the first device type the group serves; CUDA's is this rank's GPU."""
    kind = served_device_types()[0]
    return torch.device("cuda", torch.cuda.current_device()) if kind == "cuda" else torch.device(kind)


def on_group_device(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` itself where the group serves its device, else a copy on the group's device."""
    return tensor if tensor.device.type in served_device_types() else tensor.to(group_device())


def all_reduce(tensor: torch.Tensor, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> torch.Tensor:
    """`tensor` reduced over every rank (a collective: every rank calls it), on `tensor`'s own device."""
    moved = on_group_device(tensor)
    dist.all_reduce(moved, op=op)
    return moved.to(tensor.device)


def broadcast_bytes(data: bytes, rank: int) -> bytes:
    """Rank 0's `data` on every rank (a collective): its length first, then the bytes, both on the group's device."""
    device = group_device()
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    dist.broadcast(size, src=0)
    if int(size) == 0:
        return b""
    payload = (torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device) if rank == 0
               else torch.empty(int(size), dtype=torch.uint8, device=device))
    dist.broadcast(payload, src=0)
    return data if rank == 0 else payload.cpu().numpy().tobytes()
