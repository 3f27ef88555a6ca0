"""A pretrained text encoder's checkpoint carries its tokenizer: the ids an encoder learnt mean what its tokenizer
said, so a run that starts from it (`train.pretrained`) must read its texts through that tokenizer, never a new one
fitted on the run's own training split.

The checkpoint is a folder: the weights (`train.pretrained.path`, a safetensors file, pinned by
`train.pretrained.sha256`) and `tokenizer.json` beside them (the tokenizer's canonical JSON, as a run's schema
carries it). The weights' safetensors metadata names the tokenizer file's sha256 (`torchship.tokenizer_sha256`),
so the one pin in params covers both: a swapped or edited tokenizer file is refused, as a swapped weights file is.
Prepare then uses that tokenizer instead of fitting one (docs/text.md). Nothing is fetched."""
from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

from tasks.core import paths
from tasks.core.errors import ConfigError, DataError
from tasks.core.params_spec import PretrainedParams
from tasks.modalities.text.tokenizer import Tokenizer

TOKENIZER_FILE = "tokenizer.json"          # beside the weights
TOKENIZER_PIN = "torchship.tokenizer_sha256"   # the weights' metadata key naming it
MAX_TOKENIZER_BYTES = 256 << 20            # a larger tokenizer file is refused unread (a million entries fit)


def weights_metadata(data: bytes, path: Path) -> dict[str, str]:
    """The `__metadata__` of a safetensors file's bytes (its header: an 8-byte length, then JSON); {} without one."""
    try:
        (length,) = struct.unpack("<Q", data[:8])
        if length > len(data) - 8:
            raise ValueError(f"a header of {length} bytes in a file of {len(data)}")
        header = json.loads(data[8:8 + length])
        metadata = header.get("__metadata__") or {}
        if not isinstance(metadata, dict):
            raise ValueError("its __metadata__ is not a mapping")
    except (struct.error, ValueError, AttributeError) as exc:
        raise ConfigError(f"train.pretrained.path {path} is not a readable safetensors file ({exc}).") from None
    return {str(key): str(value) for key, value in metadata.items()}


def pinned_weights(pretrained: PretrainedParams) -> bytes:
    """The weights file's bytes, refused unless they have the pinned sha256 (what pins the tokenizer pins these)."""
    path = Path(pretrained.path)
    if not path.is_file():
        raise ConfigError(f"train.pretrained.path {path} does not exist (weights are read from a local file).")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != pretrained.sha256:
        raise ConfigError(f"train.pretrained.path {path} has sha256 {digest}, not the pinned train.pretrained.sha256 "
                          f"{pretrained.sha256}: the file changed; its tokenizer was not read.")
    return data


def pretrained_tokenizer(pretrained: PretrainedParams) -> Tokenizer | None:
    """The tokenizer a pretrained text checkpoint carries (None without `train.pretrained`): `tokenizer.json` beside
    the pinned weights, held to the sha256 their metadata names. Refused (ConfigError), naming what to do: weights
    that name no tokenizer, a missing, oversized, changed or unreadable tokenizer file."""
    if not pretrained.path:
        return None
    path = Path(pretrained.path)
    pin = weights_metadata(pinned_weights(pretrained), path).get(TOKENIZER_PIN)
    if pin is None:
        raise ConfigError(f"train.pretrained.path {path} names no tokenizer (metadata {TOKENIZER_PIN}): a text "
                          "encoder's token ids mean nothing without the tokenizer it was trained with. Write the "
                          "checkpoint with tasks/modalities/text/pretrained.py write_checkpoint (docs/text.md).")
    beside = path.parent / TOKENIZER_FILE
    if not beside.is_file():
        raise ConfigError(f"train.pretrained.path {path} was trained with tokenizer sha256 {pin}, but {beside} "
                          "does not exist: keep the checkpoint's tokenizer.json beside its weights.")
    if beside.stat().st_size > MAX_TOKENIZER_BYTES:
        raise ConfigError(f"{beside} holds over {MAX_TOKENIZER_BYTES >> 20} MiB: refused unread.")
    text = beside.read_bytes()
    if (digest := hashlib.sha256(text).hexdigest()) != pin:
        raise ConfigError(f"{beside} has sha256 {digest}, not the {pin} the weights {path} were trained with: "
                          "the tokenizer changed, and the encoder's ids would mean other tokens. Put back the "
                          "checkpoint's own tokenizer.json.")
    try:
        return Tokenizer.from_json(text.decode("ascii"))
    except (UnicodeDecodeError, DataError) as exc:
        raise ConfigError(f"{beside}: {exc}") from None


def write_checkpoint(state: dict, tokenizer: Tokenizer, folder: Path, name: str = "model.safetensors"
                     ) -> PretrainedParams:
    """Write a text checkpoint: `folder/tokenizer.json` (canonical) and `folder/name`, the state dict's tensors as
    safetensors naming the tokenizer's sha256; returns `train.pretrained` pinned to it."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    text = tokenizer.to_json().encode("ascii")
    (folder / TOKENIZER_FILE).write_bytes(text)
    weights = folder / name
    save_file({key: tensor.contiguous() for key, tensor in state.items()}, str(weights),
              metadata={TOKENIZER_PIN: hashlib.sha256(text).hexdigest()})
    return PretrainedParams(path=str(weights), sha256=hashlib.sha256(weights.read_bytes()).hexdigest())


def write_run_checkpoint(folder: Path, weights: Path = paths.MODEL_WEIGHTS, schema: Path = paths.SCHEMA
                         ) -> PretrainedParams:
    """A finished text run's trained model as a checkpoint for the next: its weights (the train stage's file, read
    weights-only) beside the tokenizer its schema carries; returns `train.pretrained` pinned to it."""
    import torch

    from tasks.core.schema_spec import load_schema
    from tasks.modalities.text.inputs import schema_tokenizer

    state = torch.load(weights, weights_only=True)["state_dict"]
    return write_checkpoint(state, schema_tokenizer(load_schema(schema)), folder)
