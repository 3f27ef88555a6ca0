"""The closed loop's shared code: windows of the request log, Evidently drift, and the retrain guards."""
