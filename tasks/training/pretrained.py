"""Starting from pretrained weights: a local safetensors file (tensors only, so loading it runs nothing), pinned by its
sha256 in params (`train.pretrained`), loaded into the freshly built model where names and shapes match (a classifier
head of another class count starts fresh), and optionally frozen but for that head.

Nothing comes from a hub: the file is the user's (tests make their own)."""
from __future__ import annotations

import hashlib
from pathlib import Path

from torch import nn

from tasks.core.errors import ConfigError
from tasks.core.params_spec import PretrainedParams


def head_of(model: nn.Module) -> str:
    """The classifier's module name: the model's `head` attribute, else its last Linear layer."""
    declared = getattr(model, "head", None)
    if isinstance(declared, str):
        modules = dict(model.named_modules())
        if declared not in modules or not any(True for _ in modules[declared].parameters()):
            raise ConfigError(f"{type(model).__name__}.head is {declared!r}, which names no module with parameters: "
                              "it must name the classifier layer (e.g. head = \"fc\" for self.fc).")
        return declared
    linears = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    if not linears:
        raise ConfigError(f"{type(model).__name__} has no Linear layer and no `head` attribute: with "
                          "train.pretrained.freeze=backbone torchship must know which layer is the classifier.")
    return linears[-1]


def backbone_parameters(model: nn.Module) -> set[str]:
    """The parameters outside the classifier head (all of them when the head cannot be told)."""
    names = {name for name, _ in model.named_parameters()}
    try:
        head = head_of(model)
    except ConfigError:
        return names
    return {name for name in names if not name.startswith(head + ".")}


def checked_weights(params: PretrainedParams) -> bytes:
    """The weights file's bytes, read once: refused unless it is a .safetensors file whose sha256 is the pinned one.
    What is hashed is what is loaded (read_weights takes these bytes), so a file changed between the two cannot slip
    through."""
    path = Path(params.path)
    if not path.is_file():
        raise ConfigError(f"train.pretrained.path {path} does not exist (weights are read from a local file).")
    if path.suffix != ".safetensors":
        raise ConfigError(f"train.pretrained.path {path}: only .safetensors files are read (a pickle could run "
                          "code when loaded); convert it with safetensors.torch.save_file(state_dict, ...).")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != params.sha256:
        raise ConfigError(f"train.pretrained.path {path} has sha256 {digest}, not the pinned "
                          f"train.pretrained.sha256 {params.sha256}: the file changed; it was not loaded. If the new "
                          "file is meant, pin its sha256.")
    return data


def check_pretrained(params: PretrainedParams) -> None:
    """Before any stage runs: the pinned weights file is there, a safetensors file, and has its pinned sha256 (the
    training stage checks the bytes it loads again)."""
    if params.path:
        read_weights(checked_weights(params), params.path)


def read_weights(data: bytes, path: Path | str) -> dict:
    """{name: tensor} of a safetensors file's bytes; bytes that are not one (a pickle renamed, a truncated copy) are
    refused, naming `path`."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        return load(data)
    except SafetensorError as exc:
        raise ConfigError(f"train.pretrained.path {path} is not a readable safetensors file ({exc}); write it with "
                          "safetensors.torch.save_file(model.state_dict(), ...).") from None


def load_pretrained(model: nn.Module, params: PretrainedParams) -> dict[str, list[str]]:
    """Load the pinned weights into `model` where name and shape match, freeze the backbone if asked; returns
    {"loaded": names, "fresh": names left as built (another shape, or not in the file), "unused": file names the
    model has not}. Refused, with the model untouched: a file that matches none of the backbone's parameters (it is
    another model's: the preprocessing statistics and a same-sized head alone are no backbone), and a frozen
    backbone that the file does not cover (its missing layers would stay at their random start)."""
    state = read_weights(checked_weights(params), params.path)
    head = head_of(model) if params.freeze == "backbone" else None
    own = model.state_dict()
    loaded = [name for name, tensor in state.items() if name in own and own[name].shape == tensor.shape]
    backbone = backbone_parameters(model)
    anchors = backbone or {name for name, _ in model.named_parameters()}   # a model that is all head
    if not anchors & set(loaded):
        raise ConfigError(f"train.pretrained.path {params.path}: none of its {len(state)} tensors matches a "
                          f"backbone parameter of {type(model).__name__} by name and shape (e.g. {sorted(state)[:3]}; "
                          f"the model has e.g. {sorted(anchors)[:3]}); it is another model's weights.")
    if params.freeze == "backbone" and backbone - set(loaded):
        missing = sorted(backbone - set(loaded))
        raise ConfigError(f"train.pretrained.freeze backbone, but {len(missing)} backbone parameters of "
                          f"{type(model).__name__} are not in {params.path} by name and shape (e.g. {missing[:3]}): "
                          "frozen, they would never leave their random start. Use freeze none, or weights of this "
                          "architecture.")
    model.load_state_dict({name: state[name] for name in loaded}, strict=False)
    if head is not None:
        for name, parameter in model.named_parameters():
            parameter.requires_grad = name.startswith(head + ".")
    return {"loaded": loaded, "fresh": sorted(set(own) - set(loaded)), "unused": sorted(set(state) - set(own))}
