"""Model aliases: a stable model name clients send to the gateway's root ``/v1/...``, mapped to
one endpoint and, optionally, the model name its replicas serve (the gateway rewrites the body's
``model`` to it). Stored under /fabric/model-aliases/{name}; fabricd writes them (admin only),
the gateway reads them.
"""

from __future__ import annotations

import re
import time

from pydantic import BaseModel, ConfigDict, Field, field_validator

from common.schemas import check_name

# Model names as clients spell them (HF-style names included): no whitespace, no '/' at either
# end, nothing a path or a log line would misread.
MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}(/[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127})?$")


def check_model_name(value: str, what: str = "model name") -> str:
    if not isinstance(value, str) or not MODEL_NAME.match(value):
        raise ValueError(f"{what} {value!r}: 1-128 letters, digits or '._:@+-', optionally 'org/name'")
    return value


class ModelAlias(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    endpoint: str
    model_name: str | None = Field(None, description="the name the endpoint's replicas serve; "
                                   "default: the endpoint's deployment's model")
    created_at: float = Field(default_factory=time.time)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_model_name(v, "alias")

    @field_validator("model_name")
    @classmethod
    def _model_name(cls, v: str | None) -> str | None:
        return None if v is None else check_model_name(v, "model_name")

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        return check_name(v, "endpoint")
