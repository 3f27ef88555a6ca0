"""torchrun launch (and the GPU count it needs), device/backend/precision/strategy choice at run time, and
DDP / FSDP2 wrapping."""
from __future__ import annotations

import datetime
import io
import os
import platform
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from tasks.core.env import LOCAL_RANK_ENV
from tasks.core.errors import ConfigError
from tasks.core.params_spec import TrainParams
from tasks.training.collectives import broadcast_bytes


def torchrun_command(params: TrainParams, module: str = "tasks.train", log_dir: str | None = None) -> list[str]:
    """`torchrun` (its stores on 127.0.0.1 for a job on this machine: tasks/training/launch.py) for one node
    (standalone) or many (c10d rendezvous at train.rdzv_endpoint); with
    `log_dir`, each worker's output is also kept there (tee), so a failure can quote its last lines."""
    command = [sys.executable, "-m", "tasks.training.launch", f"--nproc_per_node={params.nproc}",
               f"--max_restarts={params.max_restarts}"]
    if log_dir:
        command += [f"--log_dir={log_dir}", "--tee=3"]
    if params.nnodes > 1:
        command += [f"--nnodes={params.nnodes}", "--rdzv_backend=c10d", f"--rdzv_endpoint={params.rdzv_endpoint}",
                    f"--rdzv_id={params.rdzv_id}"]
    else:
        command += ["--standalone"]
    return command + ["-m", module]


@dataclass(frozen=True)
class Runtime:
    device: torch.device
    backend: str
    precision: str          # what is used
    precision_note: str     # why, when it differs from what was asked
    rank: int
    world: int
    local_rank: int
    strategy: str = "ddp"   # what is used: fsdp with one process trains as ddp
    notes: tuple[str, ...] = ()   # what the run does beyond what params say, and why (metrics.json "notes")


def gpu_count() -> int:
    """The GPUs this node's processes may use (CUDA_VISIBLE_DEVICES narrows them); 0 without CUDA."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device_kind() -> str:
    """What the workers will train on: "cuda" where this node has a GPU, else "cpu" (what `adapt` fits to)."""
    return "cuda" if gpu_count() else "cpu"


def processes_problem(nproc: int, gpus: int) -> str | None:
    """Why `nproc` processes per node cannot train on `gpus` GPUs, or None. Without a GPU any count runs (gloo)."""
    if gpus == 0 or nproc <= gpus:
        return None
    return (f"train.nproc is {nproc}, but this node has {gpus} GPU{'s' if gpus > 1 else ''}: each training process "
            f"needs a GPU of its own (NCCL refuses two ranks on one device). Set train.nproc to {gpus} or less "
            f"(torchship run --set train.nproc={gpus}), or hide the GPUs (CUDA_VISIBLE_DEVICES=) to train on the CPU.")


def check_processes_fit(params: TrainParams) -> None:
    """Refuse, before torchrun starts, more processes on this node than it has GPUs (every node checks its own)."""
    problem = processes_problem(params.nproc, gpu_count())
    if problem:
        raise ConfigError(problem)


def resolve_precision(asked: str, device: torch.device) -> tuple[str, str]:
    """bf16/fp16 only where they pay; otherwise fp32 with the reason."""
    if asked == "fp32":
        return "fp32", ""
    if device.type == "cuda":
        if asked == "bf16" and not torch.cuda.is_bf16_supported():
            return "fp16", "this GPU has no bf16: using fp16 with a GradScaler"
        return asked, ""
    if asked == "fp16":
        return "fp32", "fp16 autocast needs CUDA: using fp32 on the CPU"
    capability = torch.backends.cpu.get_cpu_capability()
    if "AVX512" not in capability.upper() and "AMX" not in capability.upper():
        return "fp32", f"bf16 on a {capability} CPU (no AVX-512-BF16/AMX) is 5-20x slower: using fp32"
    return "bf16", ""


def tf32_note(precision: str, device_type: str, capability: tuple[int, int] | None) -> str:
    """Why fp32 matmuls run in TF32 (GPUs from compute capability 8.0, Ampere on), or '' where they do not."""
    if precision != "fp32" or device_type != "cuda" or capability is None or capability < (8, 0):
        return ""
    return ("fp32 on this GPU: matmuls and convolutions in TF32 (torch.set_float32_matmul_precision('high')); "
            "export's parity gates judge the result")


def resolve_strategy(strategy: str, world: int) -> tuple[str, str]:
    """(the strategy used, why it differs): FSDP with one process shards nothing and costs collectives, so it
    trains as DDP (one process: the plain model); FSDP stays for models that do not fit one device."""
    if strategy == "fsdp" and world == 1:
        return "ddp", "train.strategy fsdp with 1 process shards nothing: trained as ddp"
    return strategy, ""


def describe_device(device) -> str:
    """The GPU's name on CUDA, else the CPU's (with its vector extensions)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} CPU ({torch.backends.cpu.get_cpu_capability()})"


def init_runtime(params: TrainParams, inline: bool = False) -> Runtime:
    """Join the process group: nccl on CUDA, gloo on CPU, with the collective timeout from params. `inline`: the
    stage's own process is the job's only rank (no torchrun): a group of one on an in-memory store, no port."""
    local_rank = int(os.environ.get(LOCAL_RANK_ENV, 0))
    if torch.cuda.is_available():
        device, backend = torch.device("cuda", local_rank), "nccl"
        torch.cuda.set_device(device)
    else:
        device, backend = torch.device("cpu"), "gloo"
    timeout = datetime.timedelta(seconds=params.collective_timeout_s)
    if inline:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    else:
        dist.init_process_group(backend, timeout=timeout)
    precision, note = resolve_precision(params.precision, device)
    tf32 = tf32_note(precision, device.type, torch.cuda.get_device_capability(device) if device.type == "cuda"
                     else None)
    if tf32:
        torch.set_float32_matmul_precision("high")
        torch.backends.cudnn.allow_tf32 = True
    world = dist.get_world_size()
    strategy, fallback = resolve_strategy(params.strategy, world)
    return Runtime(device, backend, precision, note, dist.get_rank(), world, local_rank, strategy,
                   tuple(filter(None, (tf32, fallback))))


def wrap_model(model: nn.Module, runtime: Runtime) -> nn.Module:
    """DDP (replicas, gradients all-reduced) or FSDP2 (`fully_shard` per Linear, then the root), as
    `runtime.strategy` says."""
    model = model.to(runtime.device)
    if runtime.strategy == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(runtime.device.type, (runtime.world,))
        for layer in model.modules():
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    if runtime.world > 1:
        return nn.parallel.DistributedDataParallel(model, device_ids=[runtime.local_rank]
                                                   if runtime.device.type == "cuda" else None)
    return model


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> tuple[dict, dict | None]:
    """A copy of the unsharded model (and optimizer) state on the CPU, which later steps do not change; a
    collective under FSDP: every rank calls it, rank 0 gets the state (the others get empty dicts)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state = get_model_state_dict(model, options=options)
    optimizer_state = get_optimizer_state_dict(model, optimizer, options=options) if optimizer else None
    # On the CPU, "offloaded" tensors are the live parameters and moments themselves: copy them, or the
    # kept best weights would silently follow training.
    return _copied(model_state), _copied(optimizer_state)


def _copied(state):
    if isinstance(state, torch.Tensor):
        return state.detach().clone()
    if isinstance(state, dict):
        return {key: _copied(value) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_copied(value) for value in state)
    return state


def load_full_state(model: nn.Module, optimizer: torch.optim.Optimizer, model_state: dict,
                    optimizer_state: dict) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, model_state, options=options)
    set_optimizer_state_dict(model, optimizer, optimizer_state, options=options)


def broadcast_state(state: dict | None, rank: int, world: int) -> dict | None:
    """Rank 0's `state` (tensors and primitives, or None) on every rank: sent as `torch.save` bytes and loaded
    weights-only, so nothing received is unpickled; a rank on another machine cannot read rank 0's disk."""
    if world == 1:
        return state
    data = b""
    if rank == 0 and state is not None:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        data = buffer.getvalue()
    received = broadcast_bytes(data, rank)
    if not received:
        return None
    return state if rank == 0 else torch.load(io.BytesIO(received), weights_only=True)
