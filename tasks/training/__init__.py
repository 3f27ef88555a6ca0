"""The training engine: one torchrun job shape for the teacher (train) and the student (distill)."""
