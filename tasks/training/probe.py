"""Your own module, checked in seconds before any stage runs: the class behind `train.model: package.module:Class`
is built and run on a small batch of the modality's own input, and each rule of the contract (docs/own-model.md) it
breaks fails with the rule's name, instead of a NaN loss after an epoch or an export error after the whole training.

The rules, per modality (what `forward` receives and must return):
- constructed as `Class(layout, **train.model_args[name])`; an nn.Module with trainable parameters;
- tables: `forward(x)`, x (B, F) float32: numbers as they are, NaN where missing, category codes 1..K (0 = unknown
  or missing); images: x (B, H, W, C) uint8 pixels at the model's size (normalising them is the module's job:
  models.cnn.ImagePreprocessor does it);
- returns one tensor (B, n_classes) of floating logits, finite for every input, rows with missing values included;
- in eval mode a row's answer does not depend on the rows batched with it;
- gradients reach its parameters;
- a second instance built the same way loads the first one's state dict (so saved weights rebuild it);
- torch.export traces it with a dynamic batch (what the export stage does after training).
"""
from __future__ import annotations

import copy
import logging
import os
import sys

import torch
from torch import nn

from models import build_model
from tasks.core.errors import ConfigError
from tasks.core.params_spec import Params
from tasks.modalities.interface import Probe

log = logging.getLogger("torchship.train")


class ModelRuleBroken(ConfigError):
    """The model class breaks a rule of the own-module contract."""


def _refuse(name: str, rule: str, detail: str) -> ModelRuleBroken:
    detail = detail if detail.endswith((".", ")")) else detail + "."
    return ModelRuleBroken(f"train.model {name} breaks the model contract, rule: {rule}. {detail} "
                           "The contract per modality is in docs/own-model.md; nothing was trained.")


def probe_model(name: str, kwargs: dict, probe: Probe, export: bool = True) -> None:
    """Build `name` on the probe's layout and check every rule; raises ModelRuleBroken naming the first broken."""
    n_classes, inputs = probe.layout.n_classes, probe.inputs
    try:
        model = build_model(name, probe.layout, **kwargs)
    except KeyError as exc:
        raise _refuse(name, "importable as package.module:Class", str(exc).strip("'\"")) from None
    except Exception as exc:
        layout = type(probe.layout)
        raise _refuse(name, "constructed as Class(layout, **train.model_args[name])",
                      f"Building it raised {type(exc).__name__}: {exc}. The layout it is given is a "
                      f"{layout.__module__}.{layout.__name__} ({', '.join(layout.__dataclass_fields__)}).") from None
    if not isinstance(model, nn.Module) or not any(p.requires_grad for p in model.parameters()):
        raise _refuse(name, "an nn.Module with trainable parameters", f"It built a {type(model).__name__} "
                      f"with {sum(p.numel() for p in model.parameters()) if isinstance(model, nn.Module) else 0} "
                      "trainable values.")
    model.train()
    output = _forward(name, model, inputs, probe.what)
    if not isinstance(output, torch.Tensor) or output.shape != (len(inputs), n_classes) \
            or not output.is_floating_point():
        got = (f"a {tuple(output.shape)} {output.dtype} tensor" if isinstance(output, torch.Tensor)
               else f"a {type(output).__name__}")
        raise _refuse(name, f"forward returns one (B, n_classes) floating tensor of logits ({len(inputs)}, "
                      f"{n_classes} here)", f"It returned {got}.")
    if not torch.isfinite(output).all():
        bad = sorted({int(i) for i in torch.nonzero(~torch.isfinite(output))[:, 0]})
        hint = (" A table module must handle NaN inputs itself: start with models.tabular.TabularPreprocessor "
                "(imputes, standardises, embeds)." if inputs.is_floating_point() else "")
        raise _refuse(name, "finite logits for every input (rows with missing values included)",
                      f"Rows {bad} of the probe gave NaN or inf for {probe.what}.{hint}")
    output.float().logsumexp(1).sum().backward()
    if not any(p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0
               for p in model.parameters() if p.requires_grad):
        raise _refuse(name, "gradients reach the parameters", "After a backward pass no parameter has a finite, "
                      "non-zero gradient (is the output detached, or computed without the parameters?).")
    _eval_rules(name, model, kwargs, probe)
    if export:
        _exports(name, model.eval(), inputs)


def _forward(name: str, model: nn.Module, inputs: torch.Tensor, what: str):
    try:
        return model(inputs)
    except Exception as exc:
        raise _refuse(name, f"forward(x) takes x {what}", f"Calling it raised {type(exc).__name__}: {exc}.") from None


def _eval_rules(name: str, model: nn.Module, kwargs: dict, probe: Probe) -> None:
    model.eval()
    with torch.no_grad():
        batched = model(probe.inputs).float()
        alone = torch.cat([model(probe.inputs[i:i + 1]).float() for i in range(len(probe.inputs))])
    if not torch.allclose(batched, alone, rtol=1e-3, atol=1e-4):
        raise _refuse(name, "in eval mode a row's answer does not depend on the rows batched with it",
                      f"Scored alone the probe rows differ from scored together by up to "
                      f"{float((batched - alone).abs().max()):.3g}.")
    try:
        twin = build_model(name, probe.layout, **copy.deepcopy(kwargs))
        twin.load_state_dict(model.state_dict())
    except Exception as exc:
        raise _refuse(name, "a second instance built the same way loads the first one's state dict",
                      f"Loading failed: {type(exc).__name__}: {exc}.") from None


def _exports(name: str, model: nn.Module, inputs: torch.Tensor) -> None:
    """What the export stage will do: torch.export with a dynamic batch, the input passed by position (so its name
    is the module's own choice)."""
    batch = torch.export.Dim("batch", min=1, max=1 << 16)
    try:
        program = torch.export.export(model, (inputs,), dynamic_shapes=({0: batch},))
        with torch.no_grad():
            exported, eager = program.module()(inputs[:3]), model(inputs[:3])
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise _refuse(name, "torch.export traces forward with a dynamic batch (no Python control flow on tensor "
                      "values or sizes)", f"torch.export said: {type(exc).__name__}: {first}") from None
    if not torch.allclose(exported.float(), eager.float(), rtol=1e-3, atol=1e-4):
        raise _refuse(name, "the exported program answers as the module does",
                      "torch.export's program differs from eager on three probe rows.")
    log.info("train.model %s: the model contract holds on %s", name, "the probe batch")


def probe_own_model(params: Params) -> None:
    """Before any stage runs: the `package.module:Class` in train.model, checked against the contract of the source's
    modality on a probe batch (the module is imported from the project folder, as torchrun's workers will)."""
    from tasks.modalities import detect_modality
    from tasks.modalities.sources import resolve_target

    name = params.train.model
    if ":" not in name:
        return
    if os.getcwd() not in sys.path:   # a console script's sys.path starts at its own folder, not the project's
        sys.path.insert(0, os.getcwd())
    modality = detect_modality(params.data, params)
    classes = modality.source_classes(params, resolve_target(params))
    probe_model(name, params.train.model_args.get(name, {}), modality.model_probe(params, classes))
