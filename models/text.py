"""Text classifiers on token ids: (B, W) int64 in (0 pads, as the run's tokenizer writes them), logits out. The
tokenizer itself lives in the served graph's front, so the module sees ids only, and every export takes them. A row
holds `layout.max_tokens` word ids in order, then `layout.gram_slots` ids of the text's character n-grams (none when
the tokenizer has none): W = layout.width.

`TextBag` is a fastText-style bag of n-gram embeddings (Joulin et al. 2017): the mean of the tokens' embeddings, of
hashed embeddings of adjacent token pairs and of the character n-grams' embeddings, then a linear head.
`TextTransformer` is a small pre-norm Transformer encoder (token + learned position embeddings,
`scaled_dot_product_attention` with a padding mask, GELU MLP) over the words, mean-pooled over the real tokens.
Both answer a text without tokens (a row of padding) with finite logits."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

BIGRAM_MULTIPLIER = 1_000_003   # a prime: hash(a, b) = (a * it + b) mod buckets, exact in int64 for any vocabulary


@dataclass(frozen=True)
class TextLayout:
    """The ids a model takes: vocab_size ids (0 = padding), max_tokens words per text then gram_slots character
    n-grams, n_classes logits out."""

    vocab_size: int
    max_tokens: int
    n_classes: int
    pad_id: int = 0
    gram_slots: int = 0

    @property
    def width(self) -> int:
        return self.max_tokens + self.gram_slots

    def to_dict(self) -> dict:
        return asdict(self)


def trimmed(ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """The ids without the trailing columns that pad every row (one column at least): both families read a batch
    the same either way, at the cost of its longest text instead of the padded width (the run's tokenizer pads
    to `tokens_per_text`; tweets fill a fifth of it). Eager only: a trace, an export or a compiled graph keeps the
    width fixed, since the cut depends on the data."""
    if fixed_width():
        return ids
    used = (ids != pad_id).any(dim=0).nonzero()
    return ids[:, : int(used.max()) + 1 if len(used) else 1]


def fixed_width() -> bool:
    """Whether the module runs under a trace, an export or a compiler, which keep every width as given."""
    return torch.jit.is_tracing() or torch.compiler.is_compiling() or torch.compiler.is_exporting()


def summed(table: nn.Embedding, ids: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """(B, T) ids, (B, T) bool -> (B, D): the sum of the present ids' rows. Eagerly one `embedding_bag` (no (B, T, D)
    states: a bag of hundreds of character n-grams a text trains several times faster); traced or exported the
    plain gather and sum, which every exporter writes as stock operators. Both add the same rows."""
    if fixed_width() or not ids.shape[1]:
        return (table(ids) * present.to(table.weight.dtype).unsqueeze(-1)).sum(dim=1)
    return F.embedding_bag(ids, table.weight, mode="sum", per_sample_weights=present.to(table.weight.dtype))


def masked_mean(states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T, D) states, (B, T) bool mask -> (B, D) mean over the masked-in positions; zeros for a row with none."""
    weights = mask.to(states.dtype).unsqueeze(-1)                      # (B, T, 1)
    return (states * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


@dataclass(frozen=True)
class BagConfig:
    """`train.model_args` of the `bag` model."""

    dim: int = field(default=32, metadata={
        "doc": "Width of each token, token-pair and character n-gram embedding. 32 rather than 64: with hundreds of "
               "n-grams a text, the narrower bag overfits less (tweets' holdout macro-F1 0.742 against 0.736)."})
    buckets: int = field(default=16384, metadata={
        "doc": "Hash buckets for adjacent token pairs (word bigrams); 0 = tokens only."})
    dropout: float = field(default=0.0, metadata={"doc": "Dropout on the pooled embedding, before the head."})

    def __post_init__(self):
        if self.dim < 1 or self.buckets < 0:
            raise ValueError(f"dim {self.dim} must be at least 1 and buckets {self.buckets} at least 0")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout {self.dropout} must be in [0, 1)")


def embedding_table(rows: int, dim: int, std: float, pad_id: int | None = None) -> nn.Embedding:
    """(rows, dim) embeddings drawn from N(0, std); the padding row (if any) zero and never trained."""
    table = nn.Embedding(rows, dim, padding_idx=pad_id)
    nn.init.normal_(table.weight, std=std)
    if pad_id is not None:
        with torch.no_grad():
            table.weight[pad_id].zero_()
    return table


class PooledTextClassifier(nn.Module):
    """What both families share: `embed(ids)` (B, D) -> dropout -> the Linear `classifier` -> logits (B, C)."""

    modality = "text"   # what it takes (tasks/modalities/: a model without it takes the fallback's, tables)
    head = "classifier"   # the classifier: what trains when a pretrained backbone is frozen

    def __init__(self, dim: int, n_classes: int, dropout: float):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(dim, n_classes)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> (B, D) pooled features (each family's own)."""
        raise NotImplementedError

    def logits_and_embedding(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Both in one pass: the served graph outputs a projection of the embedding beside the logits."""
        embedding = self.embed(ids)
        return self.classifier(self.dropout(embedding)), embedding

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.logits_and_embedding(ids)[0]


class TextBag(PooledTextClassifier):
    """Token, hashed bigram and character n-gram embeddings -> their mean (the embedding, (B, dim)) -> dropout ->
    Linear."""

    Config = BagConfig
    default_lr = 1e-2   # embedding bags train best with a high rate (fastText's own default is 0.1 with SGD)
    auto = "default"    # what `auto` trains on texts below text.transformer_min_rows training texts

    def __init__(self, layout: TextLayout, **hyper: Any):
        config = BagConfig(**hyper)
        super().__init__(config.dim, layout.n_classes, config.dropout)
        self.pad_id, self.buckets, self.words = layout.pad_id, config.buckets, layout.max_tokens
        self.tokens = embedding_table(layout.vocab_size, config.dim, 1.0 / config.dim, layout.pad_id)
        self.pairs = embedding_table(max(config.buckets, 1), config.dim, 1.0 / config.dim)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, W) ids -> (B, dim): the mean of every real token's, token pair's and character n-gram's embedding."""
        words, grams = trimmed(ids[:, :self.words], self.pad_id), trimmed(ids[:, self.words:], self.pad_id)
        mask = words != self.pad_id                                        # (B, T)
        total = summed(self.tokens, words, mask)
        count = mask.sum(dim=1)
        if grams.shape[1]:
            present = grams != self.pad_id
            total, count = total + summed(self.tokens, grams, present), count + present.sum(dim=1)
        if self.buckets:
            left, right = words[:, :-1], words[:, 1:]                      # (B, T-1) adjacent pairs
            pairs = mask[:, :-1] & mask[:, 1:]
            buckets = torch.remainder(left * BIGRAM_MULTIPLIER + right, self.buckets)
            total, count = total + summed(self.pairs, buckets, pairs), count + pairs.sum(dim=1)
        return total / count.clamp(min=1).unsqueeze(-1).to(total.dtype)


@dataclass(frozen=True)
class TextTransformerConfig:
    """`train.model_args` of the `text_transformer` model."""

    dim: int = field(default=64, metadata={"doc": "Width of the token states (a multiple of heads)."})
    layers: int = field(default=2, metadata={"doc": "Transformer blocks."})
    heads: int = field(default=4, metadata={"doc": "Attention heads per block."})
    mlp_factor: int = field(default=4, metadata={"doc": "MLP width as a multiple of dim."})
    dropout: float = field(default=0.1, metadata={"doc": "Dropout on the embeddings and on each block's attention and "
                                                          "MLP outputs."})
    attention_dropout: float = field(default=0.0, metadata={
        "doc": "Dropout on the attention weights themselves. Off by default: it sends scaled_dot_product_attention "
               "to its unfused path, which draws a random mask over every (query, key) pair of every head; on a CPU "
               "a training step takes several times as long (bench/results/text.json)."})
    checkpointing: bool = field(default=False, metadata={
        "doc": "Recompute each block's activations in the backward pass (less memory, about a third more compute); "
               "training only."})

    def __post_init__(self):
        small = [f"{name} {getattr(self, name)}" for name in ("dim", "layers", "heads", "mlp_factor")
                 if getattr(self, name) < 1]
        if small:
            raise ValueError(f"{', '.join(small)}: each must be at least 1")
        if self.dim % self.heads:
            raise ValueError(f"dim {self.dim} must be a multiple of heads {self.heads}")
        for name in ("dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} {getattr(self, name)} must be in [0, 1)")


class Block(nn.Module):
    """x + attention(LayerNorm(x)), then x + MLP(LayerNorm(x)): one pre-norm encoder block (FSDP wraps each)."""

    def __init__(self, dim: int, heads: int, mlp_factor: int, dropout: float, attention_dropout: float = 0.0):
        super().__init__()
        self.heads, self.attention_dropout = heads, attention_dropout
        self.attention_norm, self.mlp_norm = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.projection = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_factor * dim), nn.GELU(), nn.Linear(mlp_factor * dim, dim))
        self.residual_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, attend: torch.Tensor) -> torch.Tensor:
        """x (B, T, D); attend (B, 1, 1, T) bool: which keys each query may read."""
        batch, tokens, dim = x.shape
        heads = self.qkv(self.attention_norm(x)).view(batch, tokens, 3, self.heads, dim // self.heads)
        q, k, v = heads.permute(2, 0, 3, 1, 4).unbind(0)                   # each (B, H, T, D/H)
        mixed = F.scaled_dot_product_attention(q, k, v, attn_mask=attend,
                                               dropout_p=self.attention_dropout if self.training else 0.0)
        x = x + self.residual_dropout(self.projection(mixed.transpose(1, 2).reshape(batch, tokens, dim)))
        return x + self.residual_dropout(self.mlp(self.mlp_norm(x)))


class TextTransformer(PooledTextClassifier):
    """Token + position embeddings -> Blocks -> LayerNorm -> mean over real tokens (the embedding, (B, dim)) ->
    Linear -> logits (B, n_classes)."""

    Config = TextTransformerConfig
    default_lr = 1e-3
    auto = "large"      # `auto` trains it from text.transformer_min_rows training texts

    def __init__(self, layout: TextLayout, **hyper: Any):
        config = TextTransformerConfig(**hyper)
        super().__init__(config.dim, layout.n_classes, 0.0)
        self.pad_id, self.checkpointing, self.words = layout.pad_id, config.checkpointing, layout.max_tokens
        self.tokens = embedding_table(layout.vocab_size, config.dim, 0.02, layout.pad_id)
        self.positions = embedding_table(layout.max_tokens, config.dim, 0.02)
        self.embedding_dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config.dim, config.heads, config.mlp_factor, config.dropout,
                                          config.attention_dropout) for _ in range(config.layers))
        self.norm = nn.LayerNorm(config.dim)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, W) ids -> (B, dim): the final states' mean over the real tokens (words only: the character n-grams
        after them are a bag, with no order to attend over)."""
        ids = trimmed(ids[:, :self.words], self.pad_id)
        mask = ids != self.pad_id                                          # (B, T)
        # A row of padding only would mask every key (softmax over nothing: NaN): it attends to all positions
        # instead, and its pooled mean is zero anyway.
        attend = (mask | ~mask.any(dim=1, keepdim=True))[:, None, None, :]   # (B, 1, 1, T)
        x = self.tokens(ids) + self.positions.weight[: ids.shape[1]]       # (B, T, D)
        x = self.embedding_dropout(x)
        for block in self.blocks:
            if self.checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(block, x, attend, use_reentrant=False)
            else:
                x = block(x, attend)
        return masked_mean(self.norm(x), mask)


MODELS = {"bag": TextBag, "text_transformer": TextTransformer}   # the names `train.model` selects
