"""The text front end as stock ONNX Runtime operators (tasks/modalities/text/graph.py) against the run's tokenizer:
the same ids on every code point's lower case, on generated and adversarial texts; the tokenization gate passing
the right tokenizer and refusing wrong ones; the composed served graph answering softmax(eager logits) on raw
strings, and MLflow's pyfunc answering as ONNX Runtime does."""
from __future__ import annotations

import dataclasses
import random

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from models import build_model
from models.text import TextLayout
from tasks.core.graph_nodes import OPSET, GraphNodes
from tasks.core.runtime import DECISION, EMBEDDING, RAW_INPUTS, open_onnx, softmax
from tasks.core.schema_spec import Schema
from tasks.modalities.text.gate import ADVERSARIAL, tokenization_gate
from tasks.modalities.text.graph import (
    IDS,
    TEXT_INPUT,
    TOKENIZER_KEY,
    compose_text_model,
    lowered,
    text_feed,
    text_signature,
    tokenizer_graph,
)
from tasks.modalities.text.tokenizer import LAST_CODE_POINT, Tokenizer, fit_tokenizer
from tasks.modalities.text.traced import ServedTextModel

WORDS = ("good", "bad", "great", "awful", "food", "service", "price", "straße", "istanbul", "café", "naïve", "σίσυφος",
         "مرحبا", "שלום", "日本", "😀", "👍🏽", "ǆemal", "ﬁne")
SEPARATORS = (" ", "  ", "\t", "\n", ", ", "! ", "\u200b", "\u200d", "\u00a0", "—", "...", "\x00")
SCHEMA = Schema(source="texts", target="label", classes=["negative", "neutral", "positive"])


def generated_texts(count: int, seed: int) -> list[str]:
    """Texts of vocabulary words in random cases and forms between random separators, with random code points."""
    rng = random.Random(seed)

    def word() -> str:
        chosen = rng.choice(WORDS)
        return rng.choice([chosen, chosen.upper(), chosen.title(), chosen.capitalize(),
                           "".join(rng.choice([c.upper(), c]) for c in chosen)])

    def noise() -> str:
        code = rng.randrange(LAST_CODE_POINT + 1)
        return "" if 0xD800 <= code <= 0xDFFF else chr(code)   # a lone surrogate is no valid text

    return ["".join(rng.choice([word(), word(), rng.choice(SEPARATORS), noise()])
                    for _ in range(rng.randint(0, 30))) for _ in range(count)]


# Character n-grams as a run fits them, small: a 40-character prefix cuts the long adversarial strings.
GRAMS = {"low": 3, "high": 5, "chars": 40, "slots": 48, "min_count": 2, "max_grams": 600}


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return fit_tokenizer(generated_texts(200, seed=0), max_tokens=24, grams=GRAMS)


def graph_ids(model: onnx.ModelProto, texts: list[str]) -> np.ndarray:
    return open_onnx(model.SerializeToString(), 1).run([IDS], text_feed(texts))[0]


def test_the_graph_lower_cases_every_code_point_as_the_tokenizers_table_does(tokenizer):
    """ONNX Runtime's StringNormalizer (the host C library's towlower) against the table the artifact carries, on
    all 1,112,064 code points that are valid text."""
    b = GraphNodes("lower")
    b.nodes.append(helper.make_node("Identity", [lowered(b, TEXT_INPUT)], ["lowered"]))
    strings = [helper.make_tensor_value_info(name, TensorProto.STRING, ["batch"]) for name in (TEXT_INPUT, "lowered")]
    graph = helper.make_model(helper.make_graph(b.nodes, "lower", strings[:1], strings[1:]),
                              opset_imports=[helper.make_opsetid("", OPSET)])
    codes = [c for c in range(LAST_CODE_POINT + 1) if not 0xD800 <= c <= 0xDFFF]
    texts = ["".join(map(chr, codes[i:i + 4096])) for i in range(0, len(codes), 4096)]
    got = open_onnx(graph.SerializeToString(), 1).run(None, text_feed(texts))[0]
    table = dict(tokenizer.lower)
    differ = [hex(ord(a)) for text, out in zip(texts, got) for a, b in zip(text, out)
              if chr(table.get(ord(a), ord(a))) != b]
    assert [len(out) for out in got] == [len(text) for text in texts] and differ == []


@pytest.mark.parametrize("lowercase, grams", [(True, GRAMS), (False, GRAMS), (True, None)])
def test_the_graph_gives_the_tokenizers_ids_on_generated_and_adversarial_texts(lowercase, grams):
    tokenizer = fit_tokenizer(generated_texts(200, seed=0) + list(ADVERSARIAL[:30]), 24, lowercase=lowercase,
                              grams=grams)
    graph = tokenizer_graph(tokenizer)
    texts = generated_texts(300, seed=1)
    expected = tokenizer.encode(texts)
    words = expected[:, :24]
    assert (words > 1).sum() > 1000 and (words == 1).sum() > 100   # known and unknown tokens both met
    if grams:   # grams met, some rows cut at their slots
        assert (expected[:, 24:] > 0).sum() > 3000 and (expected[:, -1] > 0).any()
    np.testing.assert_array_equal(graph_ids(graph, texts), expected)
    np.testing.assert_array_equal(graph_ids(graph, list(ADVERSARIAL)), tokenizer.encode(ADVERSARIAL))
    for text in ADVERSARIAL:   # alone: a batch's padding width is its longest row's
        np.testing.assert_array_equal(graph_ids(graph, [text]), tokenizer.encode([text]))
    assert graph_ids(graph, [""]).tolist() == [[0] * tokenizer.width]   # no text has a token or a gram
    assert graph_ids(graph, ["", " ", "\u200b"])[:, :24].tolist() == [[0] * 24] * 3


def test_the_gate_passes_the_right_tokenizer_and_refuses_wrong_ones(tokenizer):
    graph, holdout = tokenizer_graph(tokenizer), generated_texts(100, seed=2)
    passed = tokenization_gate(tokenizer, graph, holdout)
    assert passed.status == "pass" and f"{len(ADVERSARIAL)} adversarial" in passed.reasons[0]
    unlowered = dataclasses.replace(tokenizer, lowercase=False)
    latin_only = dataclasses.replace(tokenizer, lower=tuple(pair for pair in tokenizer.lower if pair[0] < 0x250))
    shifted = dataclasses.replace(tokenizer, vocabulary=tokenizer.vocabulary[1:] + tokenizer.vocabulary[:1])
    grams = tokenizer.grams
    shifted_grams = dataclasses.replace(tokenizer, grams=dataclasses.replace(
        grams, vocabulary=grams.vocabulary[1:] + grams.vocabulary[:1]))
    longer_prefix = dataclasses.replace(tokenizer, grams=dataclasses.replace(grams, chars=grams.chars + 20))
    for wrong in (unlowered, latin_only, shifted, shifted_grams, longer_prefix):
        refused = tokenization_gate(wrong, graph, holdout)
        assert refused.status == "fail" and "texts get other token ids" in refused.reasons[0]
    # Without any holdout, the case probes alone (the vocabulary upper-cased: its Greek) catch the Latin-only rule.
    assert tokenization_gate(latin_only, graph, []).status == "fail"


def served(tokenizer: Tokenizer, name: str, path) -> tuple[torch.nn.Module, onnx.ModelProto]:
    """A text model of `name` with wide random weights (probabilities far from uniform), exported as the export
    stage traces it (ServedTextModel; the legacy exporter, the fast one: tests/model/test_text_models.py runs the
    dynamo one on the same module), composed behind the tokenizer."""
    torch.manual_seed(0)
    layout = TextLayout(tokenizer.vocab_size, tokenizer.max_tokens, len(SCHEMA.classes),
                        gram_slots=tokenizer.grams.slots)
    net = build_model(name, layout, dim=16, **({"buckets": 64} if name == "bag" else {"layers": 1, "heads": 2}))
    for parameter in net.parameters():
        torch.nn.init.normal_(parameter, std=2.0)
    example = torch.zeros(4, tokenizer.width, dtype=torch.long)
    torch.onnx.export(ServedTextModel(net.eval(), example).eval(), (example,), str(path), dynamo=False,
                      input_names=["x"], output_names=["logits", EMBEDDING], opset_version=17,
                      dynamic_axes={name: {0: "batch"} for name in ("x", "logits", EMBEDDING)})
    bare = onnx.load(str(path))
    helper.set_model_props(bare, {"torchship.schema": SCHEMA.model_dump_json()})
    return net, compose_text_model(bare, SCHEMA, tokenizer)


@pytest.mark.parametrize("name", ["bag", "text_transformer"])
def test_the_served_graph_answers_softmax_of_eager_logits_on_raw_strings(tokenizer, tmp_path, name):
    net, composed = served(tokenizer, name, tmp_path / "bare.onnx")
    metadata = {p.key: p.value for p in composed.metadata_props}
    assert metadata[TOKENIZER_KEY] == tokenizer.sha256 and all(metadata[k] == v for k, v in RAW_INPUTS.items())
    assert "torchship.schema" in metadata and [i.name for i in composed.graph.input] == [TEXT_INPUT]
    texts = generated_texts(40, seed=3) + list(ADVERSARIAL)
    session = open_onnx(composed.SerializeToString(), 1)
    probabilities, decision, embedding = session.run(["probabilities", DECISION, EMBEDDING],
                                                     text_feed(texts))
    with torch.no_grad():
        expected = softmax(net(torch.from_numpy(tokenizer.encode(texts))).numpy())
    np.testing.assert_allclose(probabilities, expected, atol=1e-5, rtol=0)
    assert expected.max(axis=1).mean() > 0.6   # far from uniform: the comparison means something
    assert np.array_equal(decision.argmax(1), probabilities.argmax(1)) and embedding.shape == (len(texts), 16)
    assert tokenization_gate(tokenizer, composed, texts).status == "pass"   # the served graph's own front
    with pytest.raises(ValueError, match="token ids per text"):
        compose_text_model(onnx.load(str(tmp_path / "bare.onnx")), SCHEMA, dataclasses.replace(tokenizer, max_tokens=8))


def test_mlflow_pyfunc_answers_raw_strings_as_onnx_runtime_does(tokenizer, tmp_path):
    import mlflow.onnx
    import mlflow.pyfunc
    import pandas as pd

    _, composed = served(tokenizer, "bag", tmp_path / "bare.onnx")
    mlflow.onnx.save_model(composed, str(tmp_path / "model"), signature=text_signature(SCHEMA, 16),
                           save_as_external_data=False)
    texts = generated_texts(30, seed=4) + list(ADVERSARIAL)   # NUL characters among them
    answered = mlflow.pyfunc.load_model(str(tmp_path / "model")).predict(pd.DataFrame({TEXT_INPUT: texts}))
    direct = open_onnx(composed.SerializeToString(), 1).run(["probabilities"],
                                                            text_feed(texts))[0]
    assert np.asarray(answered["probabilities"]).shape == (len(texts), len(SCHEMA.classes))
    assert np.abs(np.asarray(answered["probabilities"]) - direct).max() <= 1e-5
