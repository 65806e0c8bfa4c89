"""POST /v1/embeddings and vLLM's POST /v1/rerank (also /rerank, /v2/rerank).

These do not take a sequence slot: pooling requests are one cheap forward pass,
and keeping them out of the generate queue keeps queue metrics about generation.
"""

from __future__ import annotations

import time
import uuid

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from enginesim import openai_format as fmt
from enginesim.api_models import EmbeddingRequest, RerankRequest
from enginesim.engine import Engine
from enginesim.generate_routes import check_common
from enginesim.generation_plan import estimate_tokens
from enginesim.http_util import JsonBytes, bad_request, parse_openai
from enginesim.synthetic_output import embedding, encode_base64, relevance_score


def make_pooling_routes(engine: Engine) -> list[Route]:
    settings = engine.settings

    async def embeddings(request: Request) -> Response:
        req = await parse_openai(request, EmbeddingRequest)
        if isinstance(req, Response):
            return req
        try:
            texts = req.texts()
        except ValueError as err:
            return bad_request(str(err), "input")
        refused = check_common(engine, req.model)
        if refused:
            return refused
        dim = req.dimensions or settings.embedding_dim
        data = []
        for index, text in enumerate(texts):
            vector = embedding(text, dim)
            value = encode_base64(vector) if req.encoding_format == "base64" else vector
            data.append({"index": index, "object": "embedding", "embedding": value})
        prompt_tokens = sum(estimate_tokens(t, settings.chars_per_token) for t in texts)
        body = {
            "id": f"embd-{uuid.uuid4().hex}",
            "object": "list",
            "created": int(time.time()),
            "model": settings.model,
            "data": data,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens, "completion_tokens": 0},
        }
        return JsonBytes(fmt.to_json(body))

    async def rerank(request: Request) -> Response:
        req = await parse_openai(request, RerankRequest)
        if isinstance(req, Response):
            return req
        refused = check_common(engine, req.model)
        if refused:
            return refused
        docs = req.document_texts()
        scored = sorted(
            ((i, relevance_score(req.query, d)) for i, d in enumerate(docs)), key=lambda p: (-p[1], p[0])
        )
        if req.top_n:
            scored = scored[: req.top_n]
        tokens = sum(estimate_tokens(req.query + d, settings.chars_per_token) for d in docs)
        body = {
            "id": f"rerank-{uuid.uuid4().hex}",
            "model": settings.model,
            "usage": {"total_tokens": tokens},
            "results": [
                {"index": i, "document": {"text": docs[i]}, "relevance_score": score} for i, score in scored
            ],
        }
        return JsonBytes(fmt.to_json(body))

    return [
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        *(Route(path, rerank, methods=["POST"]) for path in ("/v1/rerank", "/rerank", "/v2/rerank")),
    ]
