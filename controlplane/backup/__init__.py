"""Backup and restore of desired state (document.py builds and diffs; api/backup.py serves)."""
