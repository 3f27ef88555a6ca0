"""The text model families (models/text.py): shapes, padding and empty texts, a trivially separable task learnt,
activation checkpointing, and ONNX exports (dynamo and legacy) of the module the export stage traces
(tasks/modalities/text/traced.py ServedTextModel) that answer eager's logits and embedding projection."""
from __future__ import annotations

import dataclasses
import logging
import warnings

import numpy as np
import pytest
import torch

from models import MODELS, build_model, default_lr, model_modality
from models.text import Block, TextBag, TextLayout, TextTransformer
from tasks.core.runtime import EMBEDDING
from tasks.variants.exporters import unclash_outputs

LAYOUT = TextLayout(vocab_size=40, max_tokens=10, n_classes=3)
SMALL = {"bag": {"dim": 16, "buckets": 64}, "text_transformer": {"dim": 16, "layers": 2, "heads": 2, "dropout": 0.0}}
FAMILIES = sorted(SMALL)


def model(name: str, **extra) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(name, LAYOUT, **{**SMALL[name], **extra}).eval()


def padded_ids(rows: int, seed: int = 0) -> torch.Tensor:
    """(rows, max_tokens) ids of random lengths 1..T, padded with 0; the first row is all padding (an empty text)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, LAYOUT.vocab_size, (rows, LAYOUT.max_tokens), generator=generator)
    lengths = torch.randint(1, LAYOUT.max_tokens + 1, (rows, 1), generator=generator)
    ids = torch.where(torch.arange(LAYOUT.max_tokens) < lengths, ids, 0)
    ids[0] = 0
    return ids


def test_both_families_are_registered_as_text_models_and_their_defaults_build():
    for name, cls in (("bag", TextBag), ("text_transformer", TextTransformer)):
        assert MODELS[name] is cls and model_modality(name) == "text" and default_lr(name) == cls.default_lr
        built = build_model(name, LAYOUT, **dataclasses.asdict(cls.Config()))
        assert isinstance(built, cls) and built(padded_ids(3)).shape == (3, LAYOUT.n_classes)
    assert TextLayout(**LAYOUT.to_dict()) == LAYOUT
    with pytest.raises(ValueError, match="multiple of heads"):
        TextTransformer(LAYOUT, dim=10, heads=4)
    with pytest.raises(ValueError, match="buckets"):
        TextBag.Config(buckets=-1)
    with pytest.raises(ValueError, match="attention_dropout"):
        TextTransformer.Config(attention_dropout=1.0)


def test_attention_dropout_is_its_own_setting_and_off_by_default():
    """The default draws no mask over the attention weights (its unfused CPU path costs 3x a step): with the other
    dropout off, two training-mode passes agree; with attention dropout on, they differ."""
    ids = padded_ids(4)
    quiet, noisy = model("text_transformer").train(), model("text_transformer", attention_dropout=0.5).train()
    assert TextTransformer.Config().attention_dropout == 0.0
    torch.testing.assert_close(quiet(ids), quiet(ids))
    assert not torch.allclose(noisy(ids), noisy(ids))


@pytest.mark.parametrize("name", FAMILIES)
def test_shapes_and_an_empty_text_gives_finite_logits_and_gradients(name):
    net = model(name).train()
    ids = padded_ids(6)
    logits, embedding = net.logits_and_embedding(ids)
    assert logits.shape == (6, 3) and embedding.shape == (6, 16)
    assert torch.isfinite(logits).all() and torch.equal(embedding[0], torch.zeros(16))   # the empty row
    logits.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in net.parameters() if p.grad is not None)


@pytest.mark.parametrize("name", FAMILIES)
def test_padding_is_invisible_and_the_last_real_token_counts(name):
    """A text without its padding (fewer columns) answers the same logits; changing its last real token changes
    them, and only its own."""
    net = model(name)
    ids = padded_ids(5)
    length = int((ids[2] != 0).sum())
    assert length < LAYOUT.max_tokens
    with torch.no_grad():
        full = net(ids)
        unpadded = net(ids[2:3, :length])
        ids[2, length - 1] = 2 + (ids[2, length - 1] - 1) % (LAYOUT.vocab_size - 2)   # another real token
        moved = net(ids)
    torch.testing.assert_close(unpadded, full[2:3], atol=1e-5, rtol=0)
    assert not torch.allclose(full[2], moved[2]) and torch.equal(full[[0, 1, 3, 4]], moved[[0, 1, 3, 4]])


@pytest.mark.parametrize("name", FAMILIES)
def test_an_eager_batch_is_read_to_its_longest_text_not_the_padded_width(name, monkeypatch):
    """The columns that pad every row are cut before the embeddings (same logits as the short batch); exports keep
    the width (test_onnx_exports_... below fails when they do not)."""
    import models.text

    net, ids = model(name), padded_ids(5)
    ids[:, 4:], ids[1, :4] = 0, 2
    widths = []
    net.tokens.register_forward_hook(lambda module, args, output: widths.append(args[0].shape[1]))
    summed = models.text.summed   # the bag sums its token rows in one embedding_bag, not through the module

    def recorded(table, ids, present):
        if table is net.tokens:
            widths.append(ids.shape[1])
        return summed(table, ids, present)

    monkeypatch.setattr(models.text, "summed", recorded)
    torch.testing.assert_close(net(ids), net(ids[:, :4]))
    assert widths == [4, 4]


def test_the_bags_token_pairs_see_word_order_and_tokens_alone_do_not():
    ids = torch.tensor([[5, 6, 7, 0], [7, 6, 5, 0]])
    layout = dataclasses.replace(LAYOUT, max_tokens=4)
    torch.manual_seed(0)
    pairs, alone = TextBag(layout, dim=8, buckets=32), TextBag(layout, dim=8, buckets=0)
    with torch.no_grad():
        assert not torch.allclose(*pairs.embed(ids)) and torch.allclose(*alone.embed(ids))


def test_the_transformer_is_a_module_list_of_blocks_and_checkpointing_changes_no_gradient():
    plain, checkpointed = model("text_transformer").train(), model("text_transformer", checkpointing=True).train()
    assert isinstance(plain.blocks, torch.nn.ModuleList) and all(isinstance(b, Block) for b in plain.blocks)
    ids = padded_ids(4)
    for net in (plain, checkpointed):
        net(ids).square().sum().backward()
    for (name, a), (_, b) in zip(plain.named_parameters(), checkpointed.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-5, msg=name)


def separable_task(rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Texts of random filler tokens where the class is which of three marker tokens (2, 3, 4) appears once."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 3, (rows,), generator=generator)
    ids = torch.randint(5, LAYOUT.vocab_size, (rows, LAYOUT.max_tokens), generator=generator)
    lengths = torch.randint(2, LAYOUT.max_tokens + 1, (rows,), generator=generator)
    ids = torch.where(torch.arange(LAYOUT.max_tokens) < lengths[:, None], ids, 0)
    where = (torch.rand(rows, generator=generator) * lengths).long()
    ids[torch.arange(rows), where] = labels + 2
    return ids, labels


@pytest.mark.parametrize("name", FAMILIES)
def test_a_tiny_model_learns_a_trivially_separable_text_task(name):
    torch.set_num_threads(1)
    train_ids, train_labels = separable_task(512, seed=1)
    test_ids, test_labels = separable_task(256, seed=2)
    net = model(name).train()
    optimizer = torch.optim.AdamW(net.parameters(), lr=MODELS[name].default_lr * (1 if name == "bag" else 3))
    for step in range(300):
        batch = slice((step * 64) % 512, (step * 64) % 512 + 64)
        loss = torch.nn.functional.cross_entropy(net(train_ids[batch]), train_labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        accuracy = (net.eval()(test_ids).argmax(1) == test_labels).float().mean().item()
    assert accuracy > 0.9


def export(traced: torch.nn.Module, path, dynamo: bool) -> None:
    """As the export stage traces a text model: ids (N, T) in, `logits` and `embedding` (the projection) out."""
    example, outputs = (torch.zeros(4, LAYOUT.max_tokens, dtype=torch.long),), ["logits", EMBEDDING]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            for noisy in ("torch.onnx", "onnxscript", "onnx_ir"):
                logging.getLogger(noisy).setLevel(logging.ERROR)
            program = torch.onnx.export(traced, example, dynamo=True, input_names=["x"], output_names=outputs,
                                        verbose=False, dynamic_shapes=({0: torch.export.Dim("batch", max=1 << 16)},))
            unclash_outputs(program)
            program.save(str(path))
        else:
            torch.onnx.export(traced, example, str(path), dynamo=False, input_names=["x"], output_names=outputs,
                              opset_version=17, dynamic_axes={name: {0: "batch"} for name in ["x", *outputs]})


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "legacy"])
@pytest.mark.parametrize("name", FAMILIES)
def test_onnx_exports_answer_eagers_logits_and_projection_on_other_batch_sizes(tmp_path, name, dynamo):
    import onnx

    from tasks.core.runtime import open_onnx
    from tasks.modalities.text.traced import ServedTextModel

    traced = ServedTextModel(model(name), torch.zeros(4, LAYOUT.max_tokens, dtype=torch.long)).eval()
    export(traced, tmp_path / "model.onnx", dynamo)
    onnx.checker.check_model(onnx.load(str(tmp_path / "model.onnx")))
    session = open_onnx(tmp_path / "model.onnx", 1)
    for rows in (1, 7):
        ids = padded_ids(rows, seed=rows)
        with torch.no_grad():
            expected = [tensor.numpy() for tensor in traced(ids)]
        for got, want in zip(session.run(["logits", EMBEDDING], {"x": ids.numpy()}), expected):
            np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
