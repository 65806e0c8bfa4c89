"""Pure decisions about one request: prompt size, output length, timing, KV usage.

Everything here is deterministic from its inputs, so tests use plain data and the
request handlers only apply the plan (sleep, emit tokens).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from enginesim.settings import EngineSettings
from enginesim.synthetic_output import VOCABULARY, generated_text, token_text

# Below this a sleep costs more than it models; we skip it so very high token rates
# run at full speed instead of paying an event-loop wake per token.
MIN_SLEEP_S = 0.0005


class PlanRejected(ValueError):
    """The request cannot be served as asked (maps to an OpenAI 400)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(frozen=True)
class GenerationPlan:
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" | "length"
    prefill_s: float
    token_interval_s: float  # 0 = as fast as possible
    seed: int  # drives the generated words
    start: int = 0  # the index of the first token generated: > 0 when the prompt ends in its own output


def estimate_tokens(text: str, chars_per_token: int) -> int:
    # vLLM counts real tokenizer tokens; ~4 characters per token is the usual rule.
    return max(1, math.ceil(len(text) / chars_per_token))


def text_seed(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def natural_length(seed: int, around: int) -> int:
    """A deterministic length in [around/2, 3*around/2] for this prompt."""
    low = max(1, around // 2)
    return low + seed % (around + 1)


def continued(text: str, base: str | None = None) -> tuple[str, int] | None:
    """Greedy decoding's promise, kept by the simulator: a prompt that ends in the first k tokens
    this engine generated for a shorter prompt continues that output from token k, as a real
    engine at temperature 0 does. -> (the shorter prompt, k), or None (a new output).
    ``base``: where the output must start (a chat's prompt before its final assistant message,
    which holds the output); None: any split of ``text`` (a completions prompt extended by its
    output). Only the trailing run of vocabulary words is tried, and a candidate split is
    hashed only when its first word is the output's first, so a plain prompt costs one scan."""
    if base is not None:
        out = text[len(base):] if text.startswith(base) else ""
        k = out.count(" ") + 1
        return (base, k) if out and generated_text(text_seed(base), k) == out else None
    end, k, found = len(text), 0, None
    while k < MAX_CONTINUED:  # the longest output wins: a short one can match by chance (1 in 32 a word)
        i = text.rfind(" ", 0, end)
        segment = text[i + 1:end]
        k += 1
        for word in VOCABULARY:  # the output's first token: no space before it, so a segment's tail
            if segment.endswith(word):
                head = text[:end - len(word)]
                seed = text_seed(head)
                if token_text(seed, 0) == word and generated_text(seed, k) == text[len(head):]:
                    found = head, k
        if segment not in VOCABULARY or i < 0:
            break
        end = i
    return found


MAX_CONTINUED = 8192  # generated words looked back over


def plan_generation(
    settings: EngineSettings,
    prompt_text: str,
    max_tokens: int | None,
    ignore_eos: bool = False,
    prompt_tokens: int | None = None,
    seed_text: str | None = None,
    start: int = 0,
) -> GenerationPlan:
    """Decide how many tokens to generate, why it stops and how long each phase takes.

    finish_reason is "length" when the caller's max_tokens cut the output, and "stop"
    when the engine ended it itself (natural length, or no max_tokens given, which
    models an EOS at default_max_tokens). ``seed_text`` and ``start``: a continuation
    (``continued``): the words of seed_text's output from token ``start`` on, its natural
    end where the uncontinued output ends.
    """
    if max_tokens is not None and max_tokens < 1:
        raise PlanRejected("max_tokens must be at least 1", param="max_tokens")
    n_prompt = prompt_tokens if prompt_tokens is not None else estimate_tokens(
        prompt_text, settings.chars_per_token
    )
    seed = text_seed(prompt_text if seed_text is None else seed_text)
    if max_tokens is not None:
        wanted, reason = max_tokens, "length"
        if settings.natural_length and not ignore_eos:
            natural = max(0, natural_length(seed, settings.natural_length) - start)
            if natural < wanted:
                wanted, reason = natural, "stop"
    else:
        natural = natural_length(seed, settings.natural_length) if settings.natural_length else settings.default_max_tokens
        wanted = max(0, natural - start)
        reason = "stop"
    if n_prompt + wanted > settings.max_model_len:
        if max_tokens is None and n_prompt < settings.max_model_len:
            # Like vLLM: without max_tokens the output fills what the context allows.
            wanted, reason = settings.max_model_len - n_prompt, "length"
        else:
            raise PlanRejected(
                f"This model's maximum context length is {settings.max_model_len} tokens. However, you "
                f"requested {n_prompt + wanted} tokens ({n_prompt} in the messages, {wanted} in the "
                "completion). Please reduce the length of the messages or completion.",
                param="max_tokens" if max_tokens is not None else "messages",
            )
    prefill_s = n_prompt / settings.prefill_tokens_per_s if settings.prefill_tokens_per_s > 0 else 0.0
    interval = 1.0 / settings.tokens_per_s if settings.tokens_per_s > 0 else 0.0
    return GenerationPlan(
        prompt_tokens=n_prompt,
        completion_tokens=wanted,
        finish_reason=reason,
        prefill_s=prefill_s,
        token_interval_s=interval,
        seed=seed,
        start=start,
    )


def token_delay(first_token_at: float, index: int, interval_s: float, now: float) -> float:
    """Seconds to wait before emitting token `index` (0 = the first token).

    Tokens are due on an absolute schedule from the first token, so a slow consumer
    or a busy loop catches up instead of drifting; tiny waits are skipped.
    """
    if interval_s <= 0:
        return 0.0
    delay = first_token_at + index * interval_s - now
    return delay if delay >= MIN_SLEEP_S else 0.0


def kv_usage(held_tokens: int, capacity_tokens: int) -> float:
    return min(1.0, max(0.0, held_tokens / capacity_tokens))
