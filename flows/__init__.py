"""Prefect flows (composition only) and the torchship CLI."""
