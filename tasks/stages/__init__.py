"""The pipeline's stages as DVC knows them: the one stage list (`stage_list`: dvc.yaml and the Prefect-only steps),
running a stage through `dvc repro` (`repro`), the entry point of `python -m tasks.<stage>` (`entry`), what a run
would do (`plan`), overrides written where DVC sees them (`overrides`), the run cache on a shared remote
(`run_cache`), each stage's code deps (`code_graph`, `code_deps`), the run's summary, lineage and rebuild."""
