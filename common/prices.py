"""The price sheet (/fabric/prices, one document, admin-set through PUT /api/ai/prices): what a
million input, output and cached tokens cost per model, and what one GPU-hour costs. Usage views
and cost budgets turn the ledger's figures into money with ``cost`` (one function, so the API,
fabricctl, the console and the gateway's budgets agree).

A model without a price costs 0 for its tokens (its GPU-hours still cost); prices are in the
sheet's one currency.
"""

from __future__ import annotations

import time

from pydantic import Field, field_validator

from common.schemas import Spec

MAX_PRICE = 1e9


class ModelPrice(Spec):
    input_per_mtok: float = Field(0.0, ge=0, le=MAX_PRICE, description="per million input tokens")
    output_per_mtok: float = Field(0.0, ge=0, le=MAX_PRICE, description="per million output tokens")
    cached_per_mtok: float | None = Field(None, ge=0, le=MAX_PRICE,
                                          description="per million cached input tokens; absent: the input price")


class PriceSheet(Spec):
    currency: str = Field("USD", pattern=r"^[A-Z]{3}$")
    gpu_hour: float = Field(0.0, ge=0, le=MAX_PRICE, description="one GPU held for one hour")
    models: dict[str, ModelPrice] = Field(default_factory=dict, description="model name -> its token prices")
    updated_at: float = Field(default_factory=time.time)

    @field_validator("models")
    @classmethod
    def _bounded(cls, v: dict[str, ModelPrice]) -> dict[str, ModelPrice]:
        if len(v) > 10_000:
            raise ValueError("at most 10000 model prices")
        for name in v:
            if not 0 < len(name) <= 256:
                raise ValueError("a model name is 1-256 characters")
        return v


def cost(sheet: PriceSheet | None, model: str, input_tokens: int, output_tokens: int, cached_tokens: int,
         gpu_seconds: float = 0.0) -> float:
    """What the figures cost. Cached tokens are part of the input tokens: they are charged at the
    cached price instead of the input price."""
    if sheet is None:
        return 0.0
    total = gpu_seconds / 3600.0 * sheet.gpu_hour
    p = sheet.models.get(model)
    if p is not None:
        cached = min(cached_tokens, input_tokens)
        cached_price = p.input_per_mtok if p.cached_per_mtok is None else p.cached_per_mtok
        total += ((input_tokens - cached) * p.input_per_mtok + cached * cached_price
                  + output_tokens * p.output_per_mtok) / 1e6
    return total
