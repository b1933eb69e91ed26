"""Placeholder: filled in by the loss-library work (issue 3)."""

LOSSES = {}
