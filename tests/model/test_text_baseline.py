"""The text baselines (tasks/modalities/text/baseline.py): the majority class and TF-IDF + logistic regression on
the same splits, in the return shapes the image and table baselines have; on the generated tickets the TF-IDF
baseline learns the words but not trivially (macro-F1 in 0.80-0.95)."""
from __future__ import annotations

import numpy as np

from tasks.core.params_spec import BaselineParams
from tasks.modalities.text.baseline import BALANCED, MAJORITY, TFIDF, fit_and_predict, gate_baseline, text_features
from tasks.modalities.text.generated import CLASSES, generate_tickets


def encoded(count: int, seed: int, drift: float = 0.0) -> tuple[list[str], np.ndarray]:
    frame = generate_tickets(count, seed, drift)
    return list(frame["text"]), frame["label"].map({c: i for i, c in enumerate(CLASSES)}).to_numpy()


def test_tfidf_learns_the_generated_tickets_but_not_trivially():
    train, train_labels = encoded(3000, seed=11)
    holdout, holdout_labels = encoded(1000, seed=12)
    results, predictions = fit_and_predict(train, train_labels, holdout, holdout_labels, len(CLASSES),
                                           BaselineParams(), add_balanced=True)
    assert set(results) == {MAJORITY, TFIDF, TFIDF + BALANCED} == set(predictions)
    assert 0.80 <= results[TFIDF]["f1_macro"] <= 0.95, results[TFIDF]
    assert results[MAJORITY]["f1_macro"] < 0.15 and (predictions[MAJORITY] == predictions[MAJORITY][0]).all()
    for name, prediction in predictions.items():
        assert prediction.shape == (1000,) and prediction.dtype == np.int64
        assert set(results[name]) == {"accuracy", "f1_macro", "fit_seconds"} and results[name]["fit_seconds"] >= 0
        assert results[name]["accuracy"] == np.mean(prediction == holdout_labels)
    assert gate_baseline(results, "f1_macro").startswith(TFIDF)


def test_the_features_are_fitted_on_training_texts_only_and_capped():
    train, _ = encoded(400, seed=1)
    features = text_features(max_features=300).fit(train)
    word, chars = (vectorizer for _, vectorizer in features.transformer_list)
    assert len(word.vocabulary_) <= 150 and len(chars.vocabulary_) <= 150
    assert word.ngram_range == (1, 2) and chars.analyzer == "char_wb" and chars.ngram_range == (2, 5)
    unseen = features.transform(["zyzzyva quokka"])
    assert unseen[:, :len(word.vocabulary_)].nnz == 0    # words never seen in training have no feature


def test_the_gate_baseline_is_the_best_on_the_holdout():
    results = {MAJORITY: {"f1_macro": 0.2}, TFIDF: {"f1_macro": 0.7}, TFIDF + BALANCED: {"f1_macro": 0.75}}
    assert gate_baseline(results, "f1_macro") == TFIDF + BALANCED
