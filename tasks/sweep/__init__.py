"""`torchship sweep`: a hyperparameter search whose trials are train-stage runs, each in a workspace of its own, and
whose winner is judged by bless on the holdout the search never saw (docs/sweep.md). space: what is searched and
what is fixed; study: the Optuna study, its storage and budget; workspace: the study's template and each trial's
folder; trial: one trial; worker: the loop a local process or a Prefect flow run runs; report: the finalists, the
optimism and the summary."""
