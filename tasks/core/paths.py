"""Where each stage writes, for the code that reads and writes it: dvc.yaml declares the same paths (its outs and
metrics), tests/unit/test_paths.py keeps the two in step, and tasks/stages/stage_list.py reads dvc.yaml itself."""
from pathlib import Path

DATA = Path("data")
SOURCE_FINGERPRINT = DATA / "source.json"
QUARANTINE = DATA / "quarantine"
BATCHES = DATA / "batches"           # labelled batches accepted by `torchship ingest` (prepare reads them)
BATCHES_DVC = DATA / "batches.dvc"   # their DVC snapshot: the accepted-batch index (tasks/monitoring/batch_index.py)
SERVE = DATA / "serve"               # the service's request log and feedback (format: tasks/core/servelog.py)
MONITOR = DATA / "monitor"           # drift reports and summaries, the trigger decisions, retrain windows
MONITOR_REPORTS = MONITOR / "reports"
MONITOR_LATEST = MONITOR / "latest.json"
DECISIONS = MONITOR / "decisions.jsonl"
WINDOWS = MONITOR / "windows"        # labelled windows a retrain took (before the batch gate)

PREPARE = DATA / "prepare"
TRAIN_SPLIT = PREPARE / "train.parquet"
VAL_SPLIT = PREPARE / "val.parquet"
HOLDOUT_SPLIT = PREPARE / "holdout.parquet"
SCHEMA = PREPARE / "schema.json"
PREPARE_METRICS = PREPARE / "metrics.json"

VALIDATE = DATA / "validate"
VALIDATE_REPORT = VALIDATE / "report.json"
DATA_DOCS = VALIDATE / "docs"

BASELINE = DATA / "baseline"
BASELINE_REPORT = BASELINE / "report.json"
BASELINE_PREDICTIONS = BASELINE / "predictions.json"   # the gate's baseline's holdout predictions (bless bootstraps)

TRAIN = DATA / "train"
MODEL_WEIGHTS = TRAIN / "model.pt"
TRAIN_METRICS = TRAIN / "metrics.json"
TRAIN_HISTORY = TRAIN / "history.csv"
TRAIN_PLOTS = TRAIN / "plots"
CHECKPOINTS = TRAIN / "checkpoints"
TRAIN_LOGS = TRAIN / "logs"          # each torchrun worker's output (not a DVC output)

EXPORT = DATA / "export"
ONNX_MODEL = EXPORT / "model.onnx"
PT2_MODEL = EXPORT / "model.pt2"
PARITY_REPORT = EXPORT / "parity.json"

COMPRESS = DATA / "compress"
VARIANTS = COMPRESS / "variants"     # every compressed ONNX file (one DVC output folder)
INT8_MODEL = VARIANTS / "model.int8.onnx"
STATIC_INT8_MODEL = VARIANTS / "model.int8-static.onnx"
STUDENT_ONNX = VARIANTS / "student.onnx"
STUDENT_INT8 = VARIANTS / "student.int8.onnx"
STUDENT = COMPRESS / "student"       # the distilled student's weights, metrics, history and plots
STUDENT_WEIGHTS = STUDENT / "model.pt"
STUDENT_CHECKPOINTS = COMPRESS / "checkpoints"
STUDENT_LOGS = COMPRESS / "logs"
COMPRESS_REPORT = COMPRESS / "report.json"

PROFILE = DATA / "profile"
PROFILE_REPORT = PROFILE / "report.json"
RAW_MODEL = PROFILE / "model.onnx"   # the selected variant behind raw per-column inputs: what is registered
LATENCY_PLOT = PROFILE / "latency.png"
