"""The model card of a registered version: what a reviewer in the MLflow UI reads before moving an alias. Data
(version, contract result), training (configuration, hardware), quality against the scikit-learn baselines and
the champion, the gates (parity, accuracy budget, bless), the serving benchmark of this run and the lineage.
Markdown for the version's description, and the same as a self-contained HTML artifact."""
from __future__ import annotations

from pathlib import Path

from tasks.core import paths
from tasks.core.artifacts import read_json
from tasks.core.machine import describe_machine
from tasks.core.params_spec import Params
from tasks.core.schema_spec import Schema
from tasks.core.verdicts import BLESS_STAGES, Blessing
from tasks.modalities import modality_of


def _read(path: Path) -> dict:
    return read_json(path) if path.exists() else {}


def machine(described: dict | None = None) -> str:
    m = described or describe_machine(threads=0)
    threads = f", {m['threads']} thread(s)" if m.get("threads") else ""
    return (f"{m['cpu']}, {m['cores']} cores{threads}, {m['gpu'] or 'no GPU'}, torch {m['torch']}, "
            f"onnxruntime {m['onnxruntime']}, python {m['python']}")


def stage_table(blessing: Blessing) -> str:
    """bless's stages in order: status, key figures and reasons; those after a failure did not run."""
    rows = []
    for name in BLESS_STAGES:
        report = blessing.stage(name)
        if report is None:
            rows.append(f"| {name} | not run | — | stopped at the first failure |")
            continue
        reasons = "; ".join(report.gate.reasons).replace("|", "/")
        rows.append(f"| {name} | **{report.gate.status}** | {report.headline.replace('|', '/') or '—'} | {reasons} |")
    performance = blessing.stage("performance")
    measured_on = (f"\n\nPerformance measured in this run on {machine(performance.details['machine'])}"
                   if performance is not None and "machine" in performance.details else "")
    return "| stage | status | key figures | reasons |\n|---|---|---|---|\n" + "\n".join(rows) + measured_on


def quality_table(blessing: Blessing, baselines: dict) -> str:
    champion = blessing.champion_metrics or {}
    models = baselines.get("models", {})
    head = (f"| holdout metric | this version | champion v{blessing.champion_version or '—'} |"
            + "".join(f" {name.replace('_', ' ')} (scikit-learn) |" for name in models)
            + "\n|---|---|---|" + "---|" * len(models))
    rows = [f"| {metric} | {value:.4f} | " + (f"{champion[metric]:.4f}" if metric in champion else "—") + " | "
            + "".join(f"{figures[metric]:.4f} | " for figures in models.values())
            for metric, value in blessing.candidate_metrics.items()]
    return head + "\n" + "\n".join(row.rstrip() for row in rows)


def benchmark_table(profile: dict) -> str:
    rows = [f"| {'**' + name + '**' if name == profile.get('selected') else name} | {v['p50_us']:.0f} | "
            f"{v['p99_us']:.0f} | {v['rows_per_s']:,.0f} | {v['accuracy']:.4f} | {v['f1_macro']:.4f} |"
            for name, v in profile.get("variants", {}).items()]
    return ("| variant | batch-1 p50 µs | p99 µs | rows/s at batch " + str(profile.get("batch_size", "")) +
            " | accuracy | macro-F1 |\n|---|---|---|---|---|---|\n" + "\n".join(rows))


def inputs_line(prepared: dict, schema: dict) -> str:
    """What the model takes, as its modality describes it from prepare's metrics (a table's features by kind, the
    images' size and mode and how many were refused)."""
    return modality_of(Schema.model_validate(schema)).describe_inputs(prepared) if schema else "inputs: unknown"


def search_line(tags: dict[str, str]) -> str:
    """A sweep's winner says how much the search flattered it (docs/sweep.md); other versions say nothing."""
    if "sweep_study" not in tags:
        return ""
    return (f"**Search:** the winner of sweep study `{tags['sweep_study']}` (trial {tags.get('sweep_trial', '?')}): "
            f"validation {tags.get('sweep_validation', '?')}, optimism {tags.get('sweep_optimism', '?')} (validation "
            "minus holdout)\n\n")


def model_card_markdown(params: Params, blessing: Blessing, tags: dict[str, str], version: str | None = None) -> str:
    prepared, validate, train = _read(paths.PREPARE_METRICS), _read(paths.VALIDATE_REPORT), _read(paths.TRAIN_METRICS)
    parity, compress, profile = _read(paths.PARITY_REPORT), _read(paths.COMPRESS_REPORT), _read(paths.PROFILE_REPORT)
    baselines, schema = _read(paths.BASELINE_REPORT), _read(paths.SCHEMA)
    classes = schema.get("classes", [])
    selected = profile.get("selected", "")
    budget = (compress.get("variants") or {}).get(selected)
    budget_line = (f"{budget['gate']['status']}: {budget['gate']['reasons'][0]} vs the fp32 teacher" if budget
                   else "the fp32 teacher itself (parity-gated export)")
    rows = prepared.get("rows", {})
    shares = ", ".join(f"{k} {v:.0%}" for k, v in prepared.get("class_share", {}).items())
    title = f"{blessing.model_name} v{version}" if version else blessing.model_name
    names = [b for b in tags.get("data_batches", "none").split(",") if b and b != "none"]
    batches = f"plus {len(names)} accepted batch(es) ({', '.join(names)})" if names else "no accepted batches"
    return (
        f"## torchship model card: {title}\n\n"
        f"**Verdict:** bless {blessing.gate.status}: {'; '.join(blessing.gate.reasons)}\n\n"
        f"{search_line(tags)}"
        f"### Data\n- source `{params.data.source}`, {batches}; "
        f"rows: train {rows.get('train', '?'):,}, validation {rows.get('val', '?'):,}, "
        f"holdout {rows.get('holdout', '?'):,}; "
        f"classes: {shares}; {inputs_line(prepared, schema)}\n"
        f"- data contract gate: {validate.get('headline', '?')} (Data Docs in the validate run)\n"
        f"- DVC: training split md5 `{tags.get('dvc_train_md5', '?')}`, source fingerprint md5 "
        f"`{tags.get('dvc_source_md5', '?')}`\n\n"
        f"### Training\n- {training_line(params, train)}, "
        f"{train.get('parameters', '?'):,} parameters; "
        f"{train.get('epochs_run', '?')} epochs (best {train.get('best_epoch', '?')}); "
        f"{train.get('strategy', '?')} × {train.get('world_size', '?')} "
        f"({train.get('backend', '?')}, {train.get('device', '?')}, {train.get('precision', '?')}); "
        f"{train.get('train_seconds', 0):.0f} s\n- trained on: {device_line(train)}\n"
        f"- decision: {decision_line(train, classes)}\n"
        f"- machine: {machine()}\n\n"
        f"### Quality on the holdout\n{quality_table(blessing, baselines)}\n\n"
        f"### Gates\n- parity of the exports: {parity.get('headline', '?')}\n- accuracy budget of `{selected}`: "
        f"{budget_line}\n- bless: {blessing.gate.summary()}\n\n"
        f"### Bless stages (quality → performance → service, stopping at the first failure)\n"
        f"{stage_table(blessing)}\n\n"
        f"### Serving benchmark (this run, {profile.get('threads', '?')} thread(s); served: **{selected}**)\n"
        f"{benchmark_table(profile)}\n\n"
        f"### Lineage\n- git {tags.get('git_commit', '?')[:12]} (dirty: {tags.get('git_dirty')}); pipeline run "
        f"`{tags.get('pipeline_run', '?')}`"
        + (f"; parent v{tags['parent_version']}" if 'parent_version' in tags else "")
        + (f"; trigger `{tags['trigger']}` ({tags.get('retrain_batch', '')})" if 'trigger' in tags else "") + "\n"
        f"- exact `params.yaml`, `dvc.lock` under `lineage/` in this version's run; data {tags.get('dvc_push', '?')}; "
        f"rebuild: `torchship rebuild {version}`\n")


def model_card_html(markdown: str) -> str:
    """The markdown as one self-contained HTML page (markdown-it comes with rich)."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark").enable("table").render(markdown)
    style = ("body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;line-height:1.45}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.25rem .5rem;text-align:left}")
    return f"<!doctype html><html><head><meta charset='utf-8'><style>{style}</style></head><body>{body}</body></html>"


def training_line(params: Params, train: dict) -> str:
    """The model and schedule the train stage really used (`auto` and `adapt` resolved), and why."""
    fitted = train.get("fitted")
    if not fitted:
        return f"model `{params.train.model}`, batch {params.train.batch_size}, lr {params.train.lr}"
    args = params.train.model_args.get(fitted["model"]) or "(defaults)"
    why = f" ({'; '.join(fitted['reasons'])})" if fitted["reasons"] else ""
    return (f"model `{fitted['model']}` {args}, batch {fitted['batch_size']}, up to {fitted['epochs']} epochs, "
            f"lr {fitted['lr']:g}{why}")


def device_line(train: dict) -> str:
    """What trained the model, how fast, and the peak memory it took (the GPU's own where there was one)."""
    memory = (f"peak GPU memory {train['peak_device_memory_mb']:,.0f} MB" if train.get("peak_device_memory_mb")
              is not None else f"peak resident memory {train.get('peak_rss_mb', 0):,.0f} MB summed over ranks")
    notes = "".join(f"; {note}" for note in train.get("notes", []))
    device = train.get("device_name", train.get("device", "?"))
    return f"{device}, {train.get('samples_per_s', 0):,.0f} samples/s, {memory}{notes}"


def decision_line(train: dict, classes: list[str]) -> str:
    """How the served graph turns probabilities into labels: the temperature, a binary model's threshold with its
    evidence, and the class weighting the loss used."""
    temperature = f"temperature {train.get('temperature', 1.0):.3g}"
    weights = f"class weights {train.get('class_weights', 'balanced')}"
    decision = train.get("decision")
    if not decision:
        return f"argmax of the probabilities ({temperature}; {weights})"
    if decision["threshold"] == 0.5:
        return (f"threshold 0.5, the argmax: no other gained {decision['min_gain']} or more of {decision['source']} "
                f"{decision['metric']} ({decision['at_default']:.4f}; {temperature}; {weights})")
    evidence = (f"{decision['source']} {decision['metric']} {decision['at_threshold']:.4f} vs "
                f"{decision['at_default']:.4f} at 0.5")
    positive = classes[1] if len(classes) == 2 else "class 1"
    return (f"`{positive}` where its probability > {decision['threshold']:.2f}, else the other class ({evidence}; "
            f"{temperature}; {weights})")
