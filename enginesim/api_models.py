"""Request bodies the engine accepts (pydantic at the HTTP boundary).

OpenAI routes tolerate unknown fields (clients send many sampling options the
simulator ignores); the /sim control routes forbid them so a typo is an error.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Lenient):
    include_usage: bool = False


class ChatMessage(_Lenient):
    role: str
    # A string, a list of content parts ({"type": "text", "text": ...}), or null
    # (assistant messages with tool calls).
    content: str | list[dict] | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        if isinstance(self.content, list):
            return "".join(str(p.get("text", "")) for p in self.content if isinstance(p, dict))
        return ""


class ChatCompletionRequest(_Lenient):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    ignore_eos: bool = False
    # vLLM's chat extras: continue the final (assistant) message instead of opening a new one.
    add_generation_prompt: bool = True
    continue_final_message: bool = False

    @model_validator(mode="before")
    @classmethod
    def _one_prompt_end(cls, data):
        # vLLM 0.32 refuses the pair with this message (ChatCompletionRequest.check_generation_prompt).
        if isinstance(data, dict) and data.get("continue_final_message") and data.get("add_generation_prompt"):
            raise ValueError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
        return data

    def prompt_text(self) -> str:
        # A stand-in for a chat template: role tags plus contents; a continued final message is
        # left open (no line end), as continue_final_message renders it.
        text = "".join(f"<|{m.role}|>{m.text()}\n" for m in self.messages)
        return text[:-1] if self.continue_final_message else text

    def continued_from(self) -> tuple[str, str] | None:
        """(the prompt before the final message, that message's text) when the final message is
        continued (its text is then the output so far), else None. The stand-in template's
        generation prompt is implicit, so the prompt before it is the uncontinued call's."""
        if not self.continue_final_message or self.messages[-1].role != "assistant":
            return None
        return "".join(f"<|{m.role}|>{m.text()}\n" for m in self.messages[:-1]), self.messages[-1].text()

    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Lenient):
    model: str
    prompt: str | list[str] | list[int] | list[list[int]]
    # OpenAI's legacy completions default, which vLLM also uses.
    max_tokens: int | None = 16
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    echo: bool = False
    ignore_eos: bool = False

    def single_prompt(self) -> tuple[str, int | None]:
        """(text, token count if the caller sent token ids)."""
        p = self.prompt
        if isinstance(p, str):
            return p, None
        if len(p) != 1 and (not p or not isinstance(p[0], int)):
            raise ValueError("the simulator serves one prompt per request; send a string or a one-item list")
        if isinstance(p[0], int):
            return " ".join(map(str, p)), len(p)
        item = p[0]
        if isinstance(item, str):
            return item, None
        return " ".join(map(str, item)), len(item)


class EmbeddingRequest(_Lenient):
    model: str
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)

    def texts(self) -> list[str]:
        i = self.input
        if isinstance(i, str):
            return [i]
        if not i:
            raise ValueError("input must not be empty")
        if isinstance(i[0], int):
            return [" ".join(map(str, i))]
        return [x if isinstance(x, str) else " ".join(map(str, x)) for x in i]


class RerankDocument(_Lenient):
    text: str


class RerankRequest(_Lenient):
    model: str
    query: str
    documents: list[str | RerankDocument] = Field(min_length=1)
    top_n: int | None = Field(default=None, ge=0)

    def document_texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]


class FaultsUpdate(BaseModel):
    """POST /sim/faults: fields left out keep their current value."""

    model_config = ConfigDict(extra="forbid")
    fail_health: bool | None = None
    error_rate: float | None = Field(default=None, ge=0.0, le=1.0)
    added_latency_ms: int | None = Field(default=None, ge=0)


class LoadUpdate(BaseModel):
    """POST /sim/load: synthetic load shown in metrics; `queue` is a synonym of `waiting`."""

    model_config = ConfigDict(extra="forbid")
    waiting: int | None = Field(default=None, ge=0)
    queue: int | None = Field(default=None, ge=0)
    running: int | None = Field(default=None, ge=0)
    kv_tokens: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _one_queue_name(self) -> LoadUpdate:
        if self.waiting is not None and self.queue is not None and self.waiting != self.queue:
            raise ValueError("give either waiting or queue, not two different values")
        return self
