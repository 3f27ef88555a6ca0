"""Operations around the stages: DVC, params overrides, MLflow tracking and registry writes, lineage, child
processes."""
