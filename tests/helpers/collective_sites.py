"""One rank of tests/unit/test_collectives.py: `python -m tests.helpers.collective_sites RANK WORLD FOLDER` runs the
training engine's collective call sites in two real gloo groups and writes what happened to FOLDER/rank-RANK.json.

1. "refusing": a group bound to the meta device ("meta:gloo"). gloo then refuses a CPU tensor with nccl's own words
   ("No backend type associated with device type cpu") and accepts a meta one. A meta tensor holds no data, so once
   the real collective has accepted a tensor, the wrapper below stops the call site there (Reached): what is checked
   is where each call site put its tensor, not what came back.
2. "values": a plain CPU gloo group, where data flows: what the same call sites return.
"""
from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

# torch.distributed's collectives that the call sites below may reach (wrapped in phase 1)
WRAPPED = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce", "reduce_scatter_tensor",
           "gather", "scatter", "barrier")


class Reached(Exception):
    """A collective accepted the call site's tensor."""


def stop_after_each_collective() -> dict:
    """Wrap the collectives: run the real one (gloo refuses a tensor on a device it does not serve), then raise
    Reached with the tensor's device. Returns the originals."""
    originals = {name: getattr(dist, name) for name in WRAPPED if hasattr(dist, name)}

    def wrap(name, real):
        def collective(tensor=None, *args, **kwargs):
            real(tensor, *args, **kwargs) if tensor is not None else real(*args, **kwargs)
            raise Reached(f"{name} on {getattr(tensor, 'device', None)}")
        return collective

    for name, real in originals.items():
        setattr(dist, name, wrap(name, real))
    return originals


def tiny_trainer(rank: int, world: int):
    """The engine's Trainer on 256 random rows of 3 features (a linear model): one epoch, no checkpoints."""
    from tasks.core.params_spec import TrainParams
    from tasks.training.loop import Split, Trainer

    generator = torch.Generator().manual_seed(0)
    features = torch.randn(256, 3, generator=generator)
    labels = (features[:, 0] > 0).long()
    settings = TrainParams(model="mlp", epochs=1, batch_size=64, lr=0.01, checkpoint_every=0, patience=5, seed=0)
    trainer = Trainer(settings, 2, rank, world)
    torch.manual_seed(0)
    trainer.setup(nn.Linear(3, 2), Split(features, labels), Split(features[:64], labels[:64]))
    return trainer


def sites(rank: int, world: int) -> dict:
    """Each call site as a function of nothing (imported at call time: a missing name is that site's own error)."""
    def rss():
        from tasks.training.job import summed_peak_rss_mb
        return summed_peak_rss_mb()

    def loss():
        return tiny_trainer(rank, world).train().history[-1]["train_loss"]

    def state():
        from tasks.training.distributed import broadcast_state
        sent = {"weights": torch.arange(6.0).reshape(2, 3) * 1.5, "step": 7} if rank == 0 else None
        received = broadcast_state(sent, rank, world)
        return {"weights": received["weights"].tolist(), "step": received["step"]}

    return {"job.summed_peak_rss_mb": rss, "loop.Trainer.train loss sum": loss, "distributed.broadcast_state": state}


def outcome(site) -> dict:
    try:
        return {"returned": site()}
    except Reached as reached:
        return {"reached": str(reached)}
    except Exception as exc:   # what the test reports: refused by the backend, or another error
        return {"error": f"{type(exc).__name__}: {exc}"}


def main(rank: int, world: int, folder: Path) -> None:
    torch.set_num_threads(1)
    result = {}
    dist.init_process_group("meta:gloo", store=dist.FileStore(str(folder / "refusing.store"), world), rank=rank,
                            world_size=world)
    originals = stop_after_each_collective()
    result["refusing"] = {name: outcome(site) for name, site in sites(rank, world).items()}
    for name, real in originals.items():
        setattr(dist, name, real)
    dist.destroy_process_group()
    dist.init_process_group("gloo", store=dist.FileStore(str(folder / "values.store"), world), rank=rank,
                            world_size=world)
    own_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["values"] = {name: outcome(site) for name, site in sites(rank, world).items()}
    result["own_peak_rss_mb"] = [own_before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024]
    dist.destroy_process_group()
    (folder / f"rank-{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
