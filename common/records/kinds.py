"""The resource record modules by the kind name the API and events use ("model", "deployment", ...)."""

from __future__ import annotations

from common.records import deployments, endpoints, models, profiles
from common.records.resource import Records

BY_KIND: dict[str, Records] = {"model": models.RECORDS, "profile": profiles.RECORDS,
                               "deployment": deployments.RECORDS, "endpoint": endpoints.RECORDS}
