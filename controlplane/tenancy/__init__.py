"""Tenancy: who may hold how much (today: per-tenant GPU quotas, controlplane.tenancy.quotas)."""
