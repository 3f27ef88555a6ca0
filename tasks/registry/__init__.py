"""The MLflow registry protocol, one concept in one package: reading it (`read`), writing aliases and tags (`write`),
the lock every writer holds (`lock`), the append-only alias history (`history`), the approval step (`approvals`),
the by-hand moves (`moves`), the state people read (`status`), a version's model card (`model_card`) and the
notifications claimed on the registered model (`notifications`). The service may import `read` and `history`."""
