"""Autoscaling: the pure decision (decide) and the loop that applies it (loop)."""
