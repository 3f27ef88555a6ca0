"""bless's stages, each a short pure core with thin edges: `quality` (baselines, champion, classes, slices),
`performance` (latency, throughput and size of candidate and champion in the same run), `service` (the candidate
in the real service under a short load, against the SLOs); `stages` runs them in order and combines the gates."""
