"""The typed parameter specs: one pydantic section per stage of params.yaml, and `Params` holding them all.

Specs only (fields, defaults, rules); tasks/config.py loads params.yaml into them. Below every other layer of
tasks/, so core code can take a typed section without importing the loader.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# The default share of text cells above which a column is categorical: the strict parser
# (tasks/modalities/table/parse.py) uses it when it is called without the params.
MAX_NON_NUMERIC_SHARE = 0.2
# What the synthetic generator's `data.drift` moves: the features P(x), the labelling P(y|x), both, or nothing.
Shift = Literal["none", "covariate", "concept", "both"]
# serve.ship_to: a bucket and a prefix, nothing else (no credentials, query or fragment: keys come from the environment)
AUTO = "auto"
BUILT_IN = re.compile(r"^[a-z]+:[a-z0-9_]+$")   # a source that ships with torchship: `sklearn:iris`, `images:digits`
S3_URL = re.compile(r"s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:/(?P<prefix>[^?#@]*))?")

class Section(BaseModel):
    # Unknown keys are typos: refuse them instead of silently ignoring them.
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataParams(Section):
    """Where the rows come from and what to call the model."""

    source: str = Field("synthetic", description="Where the data comes from. Tables: `synthetic`, `sklearn:<name>` "
                                                 "(breast_cancer, digits, iris, wine) or a path to a CSV or Parquet "
                                                 "file. Images (docs/images.md): `images:digits` or `images:shapes` "
                                                 "(packaged), a folder with one subfolder per class, or a manifest "
                                                 "(CSV or Parquet with an `images.path_column` and a `data.target` "
                                                 "column). Texts (docs/text.md): `text:tickets` or `text:tweets` "
                                                 "(packaged), a CSV or Parquet file with a free-text column, or a "
                                                 "folder with one subfolder per class of `.txt` files.")
    modality: str = Field(AUTO, pattern=r"^[a-z][a-z0-9_]*$", description="What the source holds, a modality's name "
                                                                      "(`table`, `image`, ...: tasks/modalities/), "
                                                                      "or `auto`: the first modality that recognises "
                                                                      "the source (packaged sets, folders of images, "
                                                                      "manifests), else a table.")
    target: str | None = Field(None, description="Target column. Default: `churned` for synthetic, `target` for "
                                                 "sklearn; required for a file.")
    rows: int = Field(100_000, ge=200, le=20_000_000, description="Rows the synthetic generator makes.")
    seed: int = Field(42, description="Seed of the synthetic generator.")
    drift: float = Field(0.0, ge=0.0, le=1.0, description="Synthetic only: strength of the shift `shift` names (0 "
                                                          "= reference distribution).")
    shift: Shift = Field("both", description="Synthetic only: what `drift` moves. `covariate`: the feature "
                                             "distributions P(x), keeping the labelling P(y|x) (what a label-free "
                                             "performance estimate assumes); `concept`: P(y|x) only; `both`; `none`.")
    model_name: str | None = Field(None, description="Registered model name. Default: derived from the data source, so "
                                                     "each data set gets its own model.")
    max_source_mb: float = Field(2048, gt=0, description="Largest data file read, in MiB: on disk for a CSV, "
                                                         "uncompressed (as its metadata declares) for a Parquet file, "
                                                         "so a small file that expands to more is refused before it is "
                                                         "read.")

    def registered_model_name(self) -> str:
        """The registry name: explicit, or derived from the source."""
        if self.model_name:
            return self.model_name
        if self.source == "synthetic":
            return "synthetic-churn"
        if BUILT_IN.match(self.source):   # a built-in source, `kind:name`
            stem = self.source.replace(":", "-")
        else:
            stem = Path(self.source.split(":", 1)[-1]).stem
        return re.sub(r"[^a-z0-9]+", "-", stem.lower()).strip("-") or "model"


class PretrainedParams(Section):
    """Weights to start training from: a local safetensors file, pinned by its sha256 (nothing comes from a hub)."""

    path: str | None = Field(None, description="A .safetensors file of the model's state dict (tensors only: nothing "
                                               "in it can run). null = train from scratch.")
    sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$", description="The file's sha256: a file with another "
                                                                            "is refused before training starts.")
    freeze: Literal["none", "backbone"] = Field("none", description="`backbone`: only the classifier head trains "
                                                                    "(the baseline stage adds a linear probe on the "
                                                                    "frozen features, which the fine-tune must "
                                                                    "beat).")

    @model_validator(mode="after")
    def _pinned(self) -> PretrainedParams:
        if self.path and not self.sha256:
            raise ValueError("train.pretrained.path needs train.pretrained.sha256 (run `sha256sum FILE`): weights are "
                             "pinned, so a swapped file is refused")
        return self


class PrepareParams(Section):
    """Strict parsing and the stratified train / validation / holdout split."""

    val_fraction: float = Field(0.15, gt=0.0, lt=0.5, description="Share of rows for validation during training (early "
                                                                  "stopping).")
    holdout_fraction: float = Field(0.15, gt=0.0, lt=0.5, description="Share of rows kept for benchmarking, blessing "
                                                                      "and the canary replay.")
    seed: int = Field(42, description="Seed of the stratified split.")
    max_categories: int = Field(50, ge=2, description="Most frequent categories kept per categorical column; rarer "
                                                      "ones map to 'unknown'.")


class ValidateParams(Section):
    """The Great Expectations gate on the prepared splits."""

    min_rows: int = Field(100, ge=1, description="Fewest training rows the gate accepts.")
    max_null_share: float = Field(0.5, ge=0.0, le=1.0, description="Largest share of missing values allowed in a "
                                                                   "feature column.")
    warn_blocks: bool = Field(False, description="Whether a `warn` gate result stops the pipeline like a `fail`.")
    max_non_numeric_share: float = Field(
        MAX_NON_NUMERIC_SHARE, ge=0.0, lt=1.0,
        description="A column whose filled cells are numbers except for at most this share is 'mostly numeric' and "
                    "refused (prepare), naming the text cells; above it, the column is categorical. 0: never refuse.")


class TrainParams(Section):
    """The model and its training under torchrun; `adapt` fits batch, epochs and patience to the table."""

    model: str = Field(AUTO, description="The teacher: `auto` (below `cv_max_rows` training rows: `linear` or "
                                         "`mlp_plr`, whichever scores better out of fold; else by rows: `mlp` below "
                                         "`train.ft_min_rows`, `ft_transformer` from it; the summary says which and "
                                         "why), a model's name (each file in models/ declares its own in `MODELS`; "
                                         "the `train.model_args.<name>` sections below list them), or "
                                         "`package.module:Class` for your own nn.Module "
                                         "(called as Class(layout, **model_args[that name])). The served model is "
                                         "usually its distilled student (see `distill`).")
    model_args: dict[str, dict[str, Any]] = Field({}, description="Arguments per model name, e.g. `{mlp: {hidden: "
                                                                  "[256, 128]}, ft_transformer: {layers: 3}}`. A "
                                                                  "built-in model's entry is checked against its "
                                                                  "`Config` (a key it does not take is an error), so "
                                                                  "arguments never silently apply to another model "
                                                                  "when `auto` picks. Your own class's entry is passed "
                                                                  "as given and not checked: your class checks it "
                                                                  "when it is built. A model without an entry takes "
                                                                  "its defaults. See the model sections below.")
    ft_min_rows: int = Field(5_000, ge=0, description="`model: auto` picks the FT-Transformer from this many training "
                                                      "rows, the MLP below (bench/results/auto_model.json has the "
                                                      "figures behind the rule).")
    cv_max_rows: int = Field(2_000, ge=0, description="Below this many training rows, train `cv_folds` members by "
                                                       "cross-validation (each early-stopped on its own fold) and "
                                                       "serve them as one graph averaging their probabilities; their "
                                                       "out-of-fold score is the model-selection figure, and "
                                                       "`model: auto` picks the family on it. 0 = never.")
    cv_folds: int = Field(5, ge=2, le=20, description="Folds (= ensemble members) below `cv_max_rows`.")
    adapt: bool = Field(True, description="Fit the schedule to the table: shrink the batch so every epoch has at least "
                                          "16 optimizer steps (never below 32 rows), raise epochs to reach "
                                          "`min_steps`, and stretch `patience` with them; on a GPU, grow the batch "
                                          "(up to 8,192) while an epoch keeps at least 128 steps, with the learning "
                                          "rate scaled by the square root of the growth. `false` = exactly the "
                                          "values below.")
    min_steps: int = Field(1000, ge=0, description="With `adapt`: optimizer steps a run gets at least (epochs are "
                                                   "raised to reach it, up to `max_epochs`).")
    max_epochs: int = Field(200, ge=1, description="With `adapt`: the most epochs `min_steps` may raise `epochs` to.")
    epochs: int = Field(8, ge=1, description="Epochs (at least, with `adapt`); early stopping may end sooner.")
    batch_size: int = Field(512, ge=1, description="Global batch size (split across processes); with `adapt`, the "
                                                   "largest on a CPU, the smallest on a GPU.")
    lr: float | None = Field(None, gt=0.0, description="Peak AdamW learning rate; null = the model's own (`default_lr` "
                                                       "in its file in models/; 1e-3 for yours without one).")
    weight_decay: float = Field(1e-4, ge=0.0, description="AdamW weight decay.")
    warmup_fraction: float = Field(0.05, ge=0.0, lt=1.0, description="Share of steps spent warming the learning rate "
                                                                     "up.")
    patience: int = Field(3, ge=1, description="Epochs without validation improvement before early stopping (stretched "
                                               "with epochs under `adapt`); the best epoch's weights are kept.")
    grad_clip: float = Field(1.0, gt=0.0, description="Max gradient norm.")
    seed: int = Field(42, description="Seed of initialisation and shuffling.")
    nproc: int = Field(1, ge=1, description="Processes per node launched by torchrun.")
    nnodes: int = Field(1, ge=1, description="Nodes in the job; above 1, torchrun meets the others at "
                                             "train.rdzv_endpoint (c10d).")
    rdzv_endpoint: str = Field("127.0.0.1:29400", description="host:port of the c10d rendezvous (multi-node only).")
    rdzv_id: str = Field("torchship", description="Job id shared by all nodes of one run (multi-node only).")
    max_restarts: int = Field(0, ge=0, description="torchrun restarts of failed workers; they resume from the last "
                                                   "checkpoint.")
    strategy: Literal["ddp", "fsdp"] = Field("ddp", description="`ddp` (replicas) or `fsdp` (FSDP2 fully_shard per "
                                                                "Linear layer).")
    precision: Literal["fp32", "bf16", "fp16"] = Field("fp32", description="Autocast precision; falls back to fp32 "
                                                                           "where it would not pay (the reason is "
                                                                           "logged).")
    compile: bool = Field(False, description="torch.compile the model for training. `false`: nothing in the training "
                                             "processes compiles (TORCH_COMPILE_DISABLE).")
    compile_mode: Literal["default", "reduce-overhead"] = Field(
        "default", description="With `compile`: torch.compile's mode; `reduce-overhead` also records CUDA graphs, "
                               "which pay where a GPU waits on kernel launches. bench/gpu_check.py measures eager, "
                               "`default` and `reduce-overhead` on a GPU (docs/performance.md).")
    checkpoint_every: int = Field(200, ge=0, description="Steps between checkpoints (0 = only at epoch ends).")
    collective_timeout_s: int = Field(300, ge=10, description="A rank stuck this long in a collective fails the job "
                                                              "instead of hanging it.")
    threads: int = Field(0, ge=0, description="Torch intra-op threads per process; 0 = cores / nproc.")
    loader_workers: int | None = Field(
        None, ge=0, le=32, description="Images: where each training batch comes from. `0` = the training split held "
                                       "on the training device as one uint8 tensor, each batch a slice of it, "
                                       "augmented there. N = a DataLoader whose N worker processes per training "
                                       "process gather and augment each batch from the split in host memory; on a "
                                       "GPU the batches are pinned and copied without blocking. null = automatic: on "
                                       "the device while the split fits in a quarter of the GPU's free memory "
                                       "(always on a CPU), else a DataLoader with half the process's cores as "
                                       "workers (1 to 4). A batch depends only on seed, epoch and step, so every "
                                       "choice trains the same weights and resumes the same run; metrics.json "
                                       "`notes` says which was used. The validation split stays on the device. "
                                       "Tables always slice their rows on the device.")
    pretrained: PretrainedParams = PretrainedParams()

    @field_validator("model_args", mode="before")
    @classmethod
    def _keyed_by_model(cls, value: Any) -> Any:
        if isinstance(value, dict):
            flat = [key for key, args in value.items() if not isinstance(args, dict)]
            if flat:
                raise ValueError(f"model_args is keyed by model name, e.g. {{mlp: {{{flat[0]}: ...}}}}; "
                                 f"{flat} look like one model's own arguments")
        return value


class RuntimeParams(Section):
    """Threads the pipeline's own scoring uses (parity probes, holdout scores in compress and bless)."""

    threads: int = Field(2, ge=1, description="ONNX Runtime intra-op threads when a step scores a holdout; "
                                              "the profile stage times with `profile.threads` instead.")


class ExportParams(Section):
    """ONNX and torch.export variants and their parity gate."""

    onnx_exporter: Literal["dynamo", "legacy"] = Field("dynamo", description="ONNX exporter: `dynamo` (torch.export "
                                                                             "based) or `legacy` (TorchScript, "
                                                                             "deprecated). Measured on the FT teacher "
                                                                             "in ONNX Runtime "
                                                                             "(bench/results/variants.json): dynamo "
                                                                             "68.5 µs vs legacy 81.6 µs batch-1 p50, "
                                                                             "legacy about 17% faster at batch 256; "
                                                                             "serving is batch-1, so dynamo. Recorded "
                                                                             "in the file's metadata.")
    parity_atol: float = Field(1e-4, gt=0.0, description="Largest allowed |logit difference| between a variant and "
                                                         "eager.")
    min_argmax_agreement: float = Field(0.999, ge=0.0, le=1.0, description="Smallest share of probe rows whose "
                                                                           "predicted class must match eager.")
    probe_rows: int = Field(512, ge=16, description="Holdout rows (or images) in the parity probe set (edge rows, "
                                                    "or black, white, noise and checkerboard images, are added).")
    max_accuracy_delta: float = Field(0.002, ge=0.0, le=1.0, description="Largest change of accuracy on the "
                                                                          "probe's holdout rows a variant may show "
                                                                          "against eager (0.002 = 0.2 points).")
    compile: bool = Field(True, description="Also parity-gate `torch.compile` of the eager model (a runtime option, "
                                            "not a file); the profile measures where it pays.")


class CompressParams(Section):
    """int8 quantisation (ONNX Runtime and eager) and the accuracy budget every compressed variant must meet."""

    metric: Literal["accuracy", "f1_macro"] = Field("f1_macro", description="Holdout metric the accuracy budget is "
                                                                            "measured on.")
    max_drop: float = Field(0.005, ge=0.0, description="Largest allowed metric drop of a compressed or distilled "
                                                       "variant vs the fp32 teacher (0.005 = 0.5 points).")
    bootstrap: int = Field(1000, ge=100, description="Paired bootstrap resamples of the holdout behind each drop's "
                                                     "confidence interval.")
    confidence: float = Field(0.95, gt=0.5, lt=1.0, description="Confidence level of the reported interval (the gate "
                                                                "uses the point estimate).")
    static_int8: bool = Field(False, description="Also build a static int8 ONNX model calibrated on training rows "
                                                 "(slower to build; ONNX Runtime QDQ).")
    calibration_rows: int = Field(2000, ge=16, description="Training rows fed to static int8 calibration.")


class DistillParams(Section):
    """The student: a small MLP trained on the teacher's soft targets by the same torchrun engine (in the compress
    stage)."""

    enabled: bool = Field(True, description="Train, export and quantise a student.")
    hidden: list[int] = Field([64], min_length=1, description="Hidden layer widths of the student MLP.")
    embedding_dim: int = Field(4, ge=1, description="Embedding width per categorical column in the student.")
    widths: list[int] = Field([8, 16], min_length=1, description="Images: the student ResNet's channels per stage "
                                                                 "(each stage after the first halves the "
                                                                 "resolution; one block each).")
    epochs: int = Field(8, ge=1, description="Most student epochs (early stopping as in train.patience).")
    lr: float = Field(3e-3, gt=0.0, description="Peak AdamW learning rate of the student.")
    temperature: float = Field(4.0, gt=0.0, description="Softmax temperature of the soft targets (higher = softer).")
    alpha: float = Field(0.9, ge=0.0, le=1.0, description="Weight of the soft-target loss; 1 - alpha weighs the true "
                                                          "labels.")


class ProfileParams(Section):
    """Latency and accuracy of each variant on the holdout."""

    rounds: int = Field(300, ge=10, description="Timed batch-1 calls per variant.")
    batch_size: int = Field(256, ge=2, description="Batch size of the throughput figure.")
    throughput_seconds: float = Field(0.5, gt=0.0, description="How long each variant's throughput is measured.")
    threads: int = Field(1, ge=1, description="Threads per variant while timing (set on purpose: 2-core boxes collapse "
                                              "otherwise).")


class BaselineParams(Section):
    """scikit-learn baselines on the same splits (the `baseline` stage): a candidate must not be worse."""

    logistic_c: float = Field(1.0, gt=0.0, description="Inverse regularisation strength of the logistic regression.")
    logistic_max_iter: int = Field(1000, ge=10, description="Solver iterations of the logistic regression.")
    boosting_max_iter: int = Field(100, ge=1, description="Boosting rounds of the histogram gradient-boosting "
                                                          "classifier.")
    seed: int = Field(0, description="Seed of the gradient boosting (its early stopping split) and of the "
                                     "cross-validation folds that pick the gate's baseline.")
    cv_folds: int = Field(5, ge=2, description="Folds of the cross-validation on the training split that picks the "
                                               "one baseline bless compares with (below cv_max_rows).")
    cv_max_rows: int = Field(2000, ge=0, description="Below this many training rows the gate's baseline is the one "
                                                     "cross-validation picks (like with like: the holdout never "
                                                     "chooses it); from here, the best of all on the holdout. "
                                                     "0 = always the best on the holdout.")


class BlessParams(Section):
    """Staged benchmarking of the candidate, stopping at the first failure: quality (vs the scikit-learn baselines
    and the live champion re-scored on the same holdout), performance (candidate and champion timed in the same
    run), service (the candidate in the real service under a short load, judged against `slo`)."""

    metric: Literal["accuracy", "f1_macro"] = Field("f1_macro", description="Holdout metric the quality stage judges "
                                                                            "(candidate vs champion, slices, "
                                                                            "baselines).")
    max_regression: float = Field(0.01, ge=0.0, le=1.0, description="A candidate more than this below the live "
                                                                    "champion on the bless metric (point estimate, "
                                                                    "same holdout) fails; a smaller loss warns. A gain "
                                                                    "is claimed only when the paired bootstrap "
                                                                    "interval lies above 0.")
    max_baseline_gap: float = Field(0.01, ge=0.0, le=1.0, description="A candidate more than this below the gate's "
                                                                      "scikit-learn baseline (bless metric, holdout: "
                                                                      "the best of all, or below baseline.cv_max_rows "
                                                                      "the one cross-validation picked) is not "
                                                                      "blessed, first model included: refused when "
                                                                      "the paired bootstrap interval of baseline - "
                                                                      "candidate lies wholly beyond it (on the point "
                                                                      "figures if the baseline stage saved no "
                                                                      "predictions).")
    bootstrap: int = Field(1000, ge=100, description="Paired bootstrap resamples of the holdout (the same rows for "
                                                     "candidate and champion, or candidate and baseline) behind each "
                                                     "interval.")
    confidence: float = Field(0.95, gt=0.5, lt=1.0, description="Confidence level of the intervals.")
    slices: list[str] = Field(["plan"], description="Columns that cut the holdout into slices, each scored for "
                                                    "candidate and champion: one slice per category of a categorical "
                                                    "column, `slice_bins` quantile bins of a numeric one. A column the "
                                                    "data lacks is reported and skipped.")
    slice_bins: int = Field(4, ge=2, le=20, description="Quantile bins of a numeric slice column.")
    min_slice_rows: int = Field(100, ge=1, description="A slice with fewer holdout rows is reported but not judged.")
    max_slice_regression: float = Field(0.05, ge=0.0, le=1.0, description="A judged slice fails when the candidate is "
                                                                          "more than this below the champion there and "
                                                                          "the slice's interval lies below 0.")
    latency_rounds: int = Field(300, ge=20, description="Timed batch-1 calls per model in the performance stage "
                                                        "(candidate and champion alternate in blocks, so machine noise "
                                                        "hits both).")
    throughput_seconds: float = Field(0.2, gt=0.0, description="Seconds of batch calls (`profile.batch_size` rows) per "
                                                               "model in the performance stage.")
    max_latency_ratio: float = Field(3.0, gt=0.0, description="The candidate's batch-1 p99 may be at most this many "
                                                              "times the champion's (measured in the same run; one "
                                                              "noisy run on a shared 2-core box moved a p99 2.2x, "
                                                              "bench/results/bless.json).")
    startup_timeout_s: float = Field(60.0, gt=0.0, description="Seconds the service stage waits for the candidate's "
                                                               "service to come up.")


class SloParams(Section):
    """Service level objectives of `/predict`: bless's service stage (and performance stage) judge a candidate
    against them; the service's alert rules derive from them."""

    p99_ms: float = Field(250.0, gt=0.0, description="99th-percentile latency of a one-row `/predict` request, in "
                                                     "milliseconds, as a client on the same host sees it (quiet 2-core "
                                                     "box: 10-50 ms at 4 clients; 250 leaves room for a busy laptop "
                                                     "without hiding a real regression).")
    max_error_rate: float = Field(0.01, ge=0.0, le=1.0, description="Largest share of `/predict` requests that fail "
                                                                    "(not 2xx, or no answer).")
    bless_requests: int = Field(300, ge=20, le=100_000, description="Requests bless's service stage sends the "
                                                                    "candidate (one holdout row each).")
    bless_concurrency: int = Field(4, ge=1, le=64, description="Client threads sending them at once.")
    bless_seconds: float = Field(10.0, gt=0.0, description="The most seconds that load may take; what is left unsent "
                                                           "then is reported.")
    runbook_base_url: str = Field("docs/runbooks.md", min_length=1, description="Where the runbooks are read: each "
                                                                                "generated alert rule's `runbook_url` "
                                                                                "is this plus `#` and its section's "
                                                                                "anchor. The default is the path in "
                                                                                "this repository, a placeholder: set "
                                                                                "the URL your team reads them at (e.g. "
                                                                                "the file on your Git host).")


class CanaryParams(Section):
    """The progressive canary: a shadow phase, then traffic steps, each judged on its own traffic; in the embedded
    default the canary replays holdout rows through a service it starts, against a running one it observes live
    traffic (torchship canary --url)."""

    requests: int = Field(5000, ge=10, le=100_000, description="Holdout rows the embedded canary replays (reused in "
                                                               "turn, each request under a fresh key; a step counts "
                                                               "each distinct row once, so it judges at most this many "
                                                               "pairs). The default holds the labelled pairs a drop of "
                                                               "max_metric_drop needs at a step's second look up to a "
                                                               "discordance of 0.2 (4,670 at the defaults; "
                                                               "docs/canary.md).")
    steps: list[float] = Field([0.05, 0.25, 0.5, 1.0], min_length=1, description="The challenger's share of traffic at "
                                                                                 "each step, after the shadow phase "
                                                                                 "(increasing; the last 1.0 promotes "
                                                                                 "on pass).")
    shadow: bool = Field(True, description="Start with a shadow phase (share 0: the challenger scores a copy of every "
                                           "request, logged, never returned). In every step the variant not answering "
                                           "shadows the request, so accuracy and PSI compare both on the same rows.")
    smoke_requests: int = Field(300, ge=1, description="With no challenger (a first model): replayed holdout rows the "
                                                       "champion answers in the embedded service to show it serves "
                                                       "(the smoke test).")
    min_samples: int = Field(50, ge=1, description="Requests the challenger must answer (shadow: score) in a step "
                                                   "before the step is judged (error rate, latency; the quality checks "
                                                   "read every row both variants scored, and ask for more when a "
                                                   "figure worries them but is not yet significant).")
    step_max_s: float = Field(120.0, gt=0.0, description="A step that has not reached min_samples after this many "
                                                         "seconds ends the canary: inconclusive, traffic back to the "
                                                         "champion.")
    replay_max_requests: int = Field(5000, ge=1, description="The embedded canary's replay sends at most this many "
                                                             "requests per step (bounded traffic).")
    poll_s: float = Field(1.0, gt=0.0, description="How often a canary on a running service reads its /metrics while a "
                                                   "step fills.")
    max_metric_drop: float = Field(0.02, gt=0.0, description="A step fails on accuracy only when the challenger trails "
                                                             "the champion by more than this on the labelled rows both "
                                                             "scored (one answers, the other in shadow) and the drop "
                                                             "is significant at canary.confidence (exact paired test).")
    confidence: float = Field(0.95, gt=0.5, lt=1.0, description="Confidence of the canary's quality checks (accuracy "
                                                                "drop, PSI), over the whole canary: 1 - confidence is "
                                                                "shared among the phases, the two checks and each "
                                                                "step's looks (docs/canary.md). A worrying but not "
                                                                "significant figure fills the step further; still not "
                                                                "significant within step_max_s: inconclusive, never a "
                                                                "rollback.")
    max_error_rate: float = Field(0.0, ge=0.0, le=1.0, description="Largest share of failed challenger requests in a "
                                                                   "step.")
    max_p95_ratio: float = Field(3.0, gt=0.0, description="Challenger p95 latency may be at most this many times the "
                                                          "champion's...")
    p95_slack_ms: float = Field(5.0, ge=0.0, description="...unless it is within this many milliseconds of it "
                                                         "(sub-millisecond models on a busy box: a ratio alone is "
                                                         "noise).")
    max_psi: float = Field(0.2, gt=0.0, description="Largest PSI between the two variants' predicted-class "
                                                    "distributions on the step's rows (0.1-0.25: moderate shift, over "
                                                    "0.25: large).")
    startup_timeout_s: float = Field(60.0, gt=0.0, description="Seconds to wait for the service to come up (and to "
                                                               "load the challenger).")

    @field_validator("steps")
    @classmethod
    def steps_grow_to_one(cls, steps: list[float]) -> list[float]:
        if any(not 0.0 < s <= 1.0 for s in steps) or steps != sorted(set(steps)) or steps[-1] != 1.0:
            raise ValueError(f"canary.steps {steps}: shares must rise strictly within (0, 1] and end at 1.0 "
                             "(the step that promotes), e.g. [0.05, 0.25, 0.5, 1.0]")
        return steps


class PromotionParams(Section):
    """Whether a person must approve a blessed challenger before its canary starts (`torchship approve|reject`, or
    the version's `approval` tag in the MLflow UI)."""

    approval: Literal["none", "required"] = Field("none", description="`required`: register leaves a blessed "
                                                                      "candidate `awaiting approval` (tag `approval`, "
                                                                      "no alias: nothing routes traffic to it) and "
                                                                      "the run ends; the canary starts when a person "
                                                                      "approves. A first model still becomes "
                                                                      "champion (nothing serves yet to protect).")
    approval_timeout_s: float = Field(259200.0, gt=0.0, description="A version nobody approved or rejected within "
                                                                    "this many seconds is rejected by the next "
                                                                    "pipeline, monitor or status that sees it (the "
                                                                    "default, 3 days, outlasts a weekend; later, its "
                                                                    "blessing against the champion of its day is "
                                                                    "stale).")


NotifyEvent = Literal["approval-waiting", "canary-rolled-back", "retrain-fired", "retrain-suppressed",
                      "champion-unblessed"]


class NotifyParams(Section):
    """The webhook torchship posts a JSON notification to, once per change of state. Its URL is a secret (a Slack or
    Teams webhook holds its token in the path): it comes from the environment (TORCHSHIP_WEBHOOK_URL), never
    from this file; unset, nothing is sent."""

    events: list[NotifyEvent] = Field(["approval-waiting", "canary-rolled-back", "retrain-fired", "retrain-suppressed",
                                       "champion-unblessed"], description="Which changes of state are sent: a version "
                                                                          "awaits approval, the canary rolled back, a "
                                                                          "retrain fired, retrains began to be "
                                                                          "suppressed, an unblessed or rejected "
                                                                          "champion serves.")
    timeout_s: float = Field(5.0, gt=0.0, description="Seconds one POST may take (connect and answer).")
    retries: int = Field(3, ge=0, le=10, description="Attempts after the first when the receiver is unreachable or "
                                                     "answers 5xx, 408 or 429; other 4xx are not retried. Every "
                                                     "attempt failed: the notification is not marked sent, so the next "
                                                     "observer of the same state sends it again.")
    retry_delay_s: float = Field(1.0, ge=0.0, description="Wait before the first retry, doubled before each next one.")


class ServeParams(Section):
    """`torchship serve`: the HTTP service."""

    host: str = Field("127.0.0.1", description="Bind address; loopback unless you mean to expose it.")
    port: int = Field(8000, ge=0, le=65535, description="Port of `torchship serve`.")
    challenger_share: float = Field(0.0, ge=0.0, le=1.0, description="Share of live traffic routed to the `challenger` "
                                                                     "alias.")
    poll_seconds: float = Field(5.0, gt=0.0, description="How often the service checks the registry for moved aliases.")
    request_log: str = Field("data/serve/requests.jsonl", description="Where served rows are appended (JSON lines, one "
                                                                      "per row) for the monitor; feedback labels go to "
                                                                      "feedback.jsonl beside it; empty = no log.")
    log_flush_seconds: float = Field(0.25, gt=0.0, le=60.0, description="The request log is buffered and written this "
                                                                        "often (and at shutdown): the most a crash of "
                                                                        "the service loses, and what it holds in "
                                                                        "memory (bench/results/serving.json).")
    log_rotate_mb: float = Field(64.0, gt=0.0, description="Rotate the request log to requests-<time>.jsonl beside it "
                                                           "when it grows past this size...")
    log_rotate_hours: float = Field(24.0, gt=0.0, description="...or when it is older than this.")
    threads: int = Field(1, ge=1, description="ONNX Runtime intra-op threads per loaded variant (requests are small: "
                                              "more threads only add overhead).")
    max_body_mb: float = Field(4.0, gt=0.0, description="A request body (any endpoint) larger than this is refused "
                                                        "with 413 before it is read whole: the first limit a request "
                                                        "meets (an image file needs 4/3 of its size as base64).")
    max_decodes: int = Field(4, ge=1, description="Request bodies decoded at once in the thread pool, per worker "
                                                  "(every body of an image model; a table's only when large): the "
                                                  "rest wait their turn on the event loop, holding no thread.")
    batch: bool = Field(True, description="Micro-batch concurrent /predict requests into one ONNX Runtime run "
                                          "(bench/results/serving.json: about 2x the requests/s at 32 connections on "
                                          "both tables measured).")
    batch_max_rows: int = Field(64, ge=1, description="A micro-batch is scored once it holds this many rows...")
    batch_wait_ms: float = Field(0.0, ge=0.0, le=100.0, description="...or this long after its first request; 0 = at "
                                                                    "the event loop's next turn (what arrived "
                                                                    "together, no added wait).")
    workers: int = Field(1, ge=1, le=64, description="Server processes (uvicorn workers): each loads the models and "
                                                     "polls the aliases itself; they append to one request log under a "
                                                     "cross-process lock and share the challenger split "
                                                     "(bench/results/serving.json: whether more pay).")
    ship_to: str = Field("", description="Ship the closed segments of the request log and feedback to this bucket, "
                                         "`s3://<bucket>[/<prefix>]`, under `<prefix>/requests/<host>/` and "
                                         "`<prefix>/feedback/<host>/`; the monitor and retrain then read their "
                                         "windows there (every host's). "
                                         "Endpoint and keys come from the environment (AWS_ENDPOINT_URL_S3 or "
                                         "AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), never from "
                                         "here. Empty = the log stays on this host (docs/serving.md).")
    ship_seconds: float = Field(30.0, gt=0.0, le=3600.0, description="With ship_to: how often the active files are "
                                                                     "closed into segments and shipped. A clean stop "
                                                                     "ships everything; a lost host loses at most "
                                                                     "this plus log_flush_seconds of rows (a crashed "
                                                                     "process's rows on disk ship at its next "
                                                                     "start).")

    @field_validator("ship_to")
    @classmethod
    def ship_to_is_a_bucket(cls, url: str) -> str:
        if url and S3_URL.fullmatch(url) is None:
            raise ValueError(f"serve.ship_to {url!r}: expected s3://<bucket>[/<prefix>] (bucket: 3-63 lower-case "
                             "letters, digits, dots, hyphens; no credentials, query or fragment: keys come from the "
                             "environment), or empty")
        return url


class MonitorParams(Section):
    """`torchship monitor`: drift of the served rows against the training split (Evidently)."""

    window_rows: int = Field(2000, ge=50, description="The newest served rows a window holds (the request log is read "
                                                      "newest first).")
    window_minutes: float = Field(0.0, ge=0.0, description="Also bound the window to rows served in the last N "
                                                           "minutes; 0 = by count only.")
    sample_rows: int = Field(5000, ge=100, description="Rows of window and reference each given to Evidently at most "
                                                       "(a seeded sample): keeps the monitor's time flat in the log "
                                                       "size.")
    max_drifted_share: float = Field(0.3, gt=0.0, le=1.0, description="Share of drifted features at or above which the "
                                                                      "window counts as drifted (Evidently's "
                                                                      "per-column tests).")
    prediction_drift: bool = Field(True, description="A drifted prediction column (vs the serving version's answers on "
                                                     "the reference) also counts as drift.")
    max_quality_drop: float = Field(0.05, ge=0.0, le=1.0, description="Accuracy on feedback-labelled rows this far "
                                                                      "below the champion's holdout accuracy counts as "
                                                                      "drift.")
    max_estimated_drop: float = Field(0.05, ge=0.0, le=1.0, description="The label-free accuracy estimate (CBPE: the "
                                                                        "chance each served answer is right, from its "
                                                                        "logged probability through reliability curves "
                                                                        "fitted on the holdout) this far below the "
                                                                        "champion's holdout accuracy counts as drift. "
                                                                        "It assumes P(y|x) unchanged (covariate shift "
                                                                        "only); a retrain it starts still needs "
                                                                        "`retrain.min_new_labels` new labels.")
    min_labelled: int = Field(50, ge=1, description="Labelled rows a window needs before its accuracy is judged.")
    seed: int = Field(0, description="Seed of the Evidently samples (reproducible reports).")


class RetrainParams(Section):
    """Drift-triggered retraining and its guards: every trigger decision is recorded in data/monitor/decisions.jsonl."""

    enabled: bool = Field(True, description="Let material drift start a retrain (false: the monitor only reports).")
    min_new_labels: int = Field(200, ge=1, description="Feedback-labelled rows, not used by an earlier retrain, a "
                                                       "retrain needs.")
    cooldown_minutes: float = Field(60.0, ge=0.0, description="Minimum time between two retrains that fired.")
    max_per_day: int = Field(3, ge=0, description="Retrains fired per UTC day at most.")
    workspace_wait_s: float = Field(2.0, ge=0.0, description="How long a retrain, pipeline or canary waits for the "
                                                             "workspace's Prefect concurrency slot before giving up.")


class TrackingParams(Section):
    """MLflow tracking and registry."""

    uri: str = Field("sqlite:///mlflow/mlflow.db", description="MLflow tracking and registry URI.")
    artifacts: str | None = Field("mlflow/artifacts", description="Artifact folder of the experiment (local "
                                  "default), or a URI; null = the tracking server's own store, which a server with "
                                  "basic auth needs (it judges proxied artifacts by their experiment id).")
    experiment: str = Field("torchship", description="MLflow experiment name.")

    def resolved_uri(self) -> str:
        """The URI with a relative SQLite path made absolute (subprocesses may run elsewhere)."""
        prefix = "sqlite:///"
        if self.uri.startswith(prefix) and not self.uri.startswith(prefix + "/"):
            return prefix + str(Path(self.uri[len(prefix):]).resolve())
        return self.uri


class SearchRange(Section):
    """One searched param of `sweep.space`: a range (`low`, `high`, `log`; integers when both bounds are) or a list
    of `choices`."""

    low: int | float | None = Field(None, description="Smallest value tried.")
    high: int | float | None = Field(None, description="Largest value tried.")
    log: bool = Field(False, description="Sample the range on a log scale (learning rates, weight decay).")
    choices: list[Any] | None = Field(None, min_length=1, description="The values tried, instead of a range (null is "
                                                                      "one: the model's own default).")

    @model_validator(mode="after")
    def _range_or_choices(self) -> SearchRange:
        ranged = self.low is not None and self.high is not None
        if ranged == (self.choices is not None) or (not ranged and (self.low, self.high) != (None, None)):
            raise ValueError("give either low and high, or choices")
        if ranged and (self.low >= self.high or (self.log and self.low <= 0)):
            raise ValueError(f"need low < high (and low > 0 with log), got {self.low}..{self.high}")
        return self


class SweepParams(Section):
    """`torchship sweep` (docs/sweep.md): a search over params, each trial the train stage in a workspace of its own,
    the winner judged by bless on the holdout the search never saw."""

    trials: int = Field(12, ge=1, le=10_000, description="Trials the study holds when it ends (a second `sweep` of "
                                                         "the same study runs only the missing ones). Trial 0 is the "
                                                         "live champion's configuration (params.yaml's without one).")
    timeout_minutes: float = Field(0.0, ge=0.0, description="No trial starts after this many minutes of the study; "
                                                            "0 = no time budget.")
    workers: int = Field(2, ge=1, le=64, description="Embedded default: local worker processes on the one study "
                                                     "(each takes the next trial when its last one ends). Team stack: "
                                                     "flow runs of the `sweep-trial` deployment.")
    top_k: int = Field(3, ge=1, le=20, description="Finishers by validation score re-judged by bless on the holdout; "
                                                   "the first that passes is the winner.")
    study: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$",
                              description="The study's name; null = `<registered model name>-sweep`.")
    seed: int = Field(0, description="Seed of the sampler (multivariate TPE with the constant liar).")
    pruner: Literal["median", "none"] = Field("median", description="Stop a trial whose validation score at an "
                                                                    "epoch is below the median of earlier trials' "
                                                                    "at that epoch.")
    prune_startup_trials: int = Field(4, ge=0, description="Trials that finish before any is pruned.")
    prune_warmup_epochs: int = Field(2, ge=0, description="Epochs of each trial before it may be pruned.")
    require_better: bool = Field(True, description="The winner takes `challenger` only when bless finds it better "
                                                   "than the live champion (the paired interval above 0), not merely "
                                                   "no worse: picked from many trials on validation, it owes the "
                                                   "holdout that evidence. A first model needs bless's pass only.")
    heartbeat_s: int = Field(10, ge=1, description="How often a running trial tells the study it is alive.")
    grace_s: int = Field(60, ge=2, description="A running trial silent this long (its worker died) is marked failed "
                                               "and queued again for another worker.")
    space: dict[str, SearchRange] = Field(
        {"train.lr": SearchRange(low=0.0003, high=0.01, log=True),
         "train.weight_decay": SearchRange(low=1e-6, high=0.01, log=True)},
        description="The searched params, `section.key` (prepare, train, images.augment) -> a range or choices, "
                    "e.g. `train.model_args.mlp.hidden: {choices: [[64], [128, 64]]}`. The params that define the "
                    "splits (`data.*`, `prepare.seed`, the fractions) are fixed for a study.")


class Params(Section):
    data: DataParams = DataParams()
    prepare: PrepareParams = PrepareParams()
    validate_: ValidateParams = Field(ValidateParams(), alias="validate")
    train: TrainParams = TrainParams()
    runtime: RuntimeParams = RuntimeParams()
    export: ExportParams = ExportParams()
    compress: CompressParams = CompressParams()
    distill: DistillParams = DistillParams()
    profile: ProfileParams = ProfileParams()
    baseline: BaselineParams = BaselineParams()
    bless: BlessParams = BlessParams()
    slo: SloParams = SloParams()
    promotion: PromotionParams = PromotionParams()
    canary: CanaryParams = CanaryParams()
    serve: ServeParams = ServeParams()
    monitor: MonitorParams = MonitorParams()
    retrain: RetrainParams = RetrainParams()
    notify: NotifyParams = NotifyParams()
    tracking: TrackingParams = TrackingParams()
    sweep: SweepParams = SweepParams()

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _splits_leave_training_rows(self) -> Params:
        if self.prepare.val_fraction + self.prepare.holdout_fraction >= 0.8:
            raise ValueError("prepare.val_fraction + prepare.holdout_fraction must leave at least 20% for training")
        return self
