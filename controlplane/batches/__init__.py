"""Batch job records: what a batch job is, and the moves between its states (jobs.py)."""
