"""Training: configuration, the per-rank trainer, the worker entry point,
the launcher-facing ``train`` command and the equivalence self-test."""
