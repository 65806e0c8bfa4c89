"""The engine's block hashes of a request, computed in the gateway: what precise prefix routing
(gateway/replica_router.py) looks up in the agents' KV index (agent/kv_index).

``EngineTokenizer.from_model_dir(dir)`` reads the model's own tokenizer.json and the chat
template of its tokenizer_config.json (the files the supply chain fetched), so the token ids are
the engine's: a chat request is rendered with the template (``add_generation_prompt``, the
model's bos/eos tokens) and encoded without adding special tokens, a completion's prompt is
encoded with them -- vLLM's defaults for /v1/chat/completions and /v1/completions.
``SimTokenizer`` is the engine simulator's (common/kv_events.sim_token_ids over the simulator's
rendering of a chat). Both hash with common/kv_events.BlockHasher (block size, algorithm and
seed of the engine), adding the request's LoRA adapter and ``cache_salt`` as vLLM does.

``request_hashes`` returns None when the request cannot be tokenized here (no tokenizer, a
message part that is not text, token-id prompts of several prompts, a template error): the
router then uses the approximate router for it.

A chat template is a tenant's code (a model's files come from whoever registered it), so it runs
in ``BoundedSandbox``: jinja's immutable sandbox, plus a ``range`` of at most MAX_RANGE items and
``+``/``*``/``**`` that refuse a result longer than MAX_SEQUENCE (``'x' * 10**9``) or a power over
MAX_POWER_BITS, before anything is built. The sandbox bounds what one expression makes; nested
loops still multiply, which is why an EngineTokenizer only ever runs in a worker process with CPU,
memory and time limits (gateway/tokenize_pool.py), never on the gateway's event loop.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from common.kv_events import BlockHasher, sim_token_ids
from common.model_manifest import TOKENIZER_FILES

MAX_BLOCKS = 4096  # the agents' match route takes at most this many hashes
MAX_RANGE = 10_000  # items of one range() in a template (chat templates loop over messages)
MAX_SEQUENCE = 1 << 22  # characters or items one + or * in a template may build (4 Mi)
MAX_POWER_BITS = 4096  # bits of an integer ** result


class Untokenizable(ValueError):
    pass


def _text_content(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise Untokenizable("a message part that is not text")
            parts.append(p["text"])
        return "\n".join(parts)
    if content is None:
        return ""
    raise Untokenizable("message content is neither text nor parts")


def _bounded_range(*args):
    r = range(*args)
    if len(r) > MAX_RANGE:
        raise Untokenizable(f"chat template: range of {len(r)} items (at most {MAX_RANGE})")
    return r


def _seq_len(value) -> int | None:
    return len(value) if isinstance(value, (str, bytes, list, tuple)) else None


def _sandbox():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        """The immutable sandbox with bounded ranges, repetitions and powers (module docstring)."""

        intercepted_binops = frozenset(["+", "*", "**"])

        def call_binop(self, context, operator, left, right):
            if operator == "*":
                for seq, times in ((left, right), (right, left)):
                    n = _seq_len(seq)
                    if n is not None and isinstance(times, int) and n * max(times, 0) > MAX_SEQUENCE:
                        raise Untokenizable(f"chat template: a repetition of {n} x {times} (at most {MAX_SEQUENCE})")
            elif operator == "+":
                a, b = _seq_len(left), _seq_len(right)
                if a is not None and b is not None and a + b > MAX_SEQUENCE:
                    raise Untokenizable(f"chat template: a concatenation of {a + b} (at most {MAX_SEQUENCE})")
            elif operator == "**" and isinstance(left, int) and isinstance(right, int):
                if right > 0 and abs(left) > 1 and right * max(abs(left).bit_length(), 1) > MAX_POWER_BITS:
                    raise Untokenizable(f"chat template: a power of over {MAX_POWER_BITS} bits")
            return super().call_binop(context, operator, left, right)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's signature)
            if __obj is range:  # a range a template reached some other way than the global
                return _bounded_range(*args)
            return super().call(__context, __obj, *args, **kwargs)

    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["range"] = _bounded_range
    env.globals["raise_exception"] = _raise
    return env


class EngineTokenizer:
    """A model's tokenizer and chat template, as the engine applies them."""

    def __init__(self, tokenizer_json: str, config: dict) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_str(tokenizer_json)
        self._config = config
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            template = next((t.get("template") for t in template if t.get("name") == "default"), None)
        self._template = None
        if isinstance(template, str):
            self._template = _sandbox().from_string(template)

    @classmethod
    def from_model_dir(cls, path: Path) -> EngineTokenizer:
        path = Path(path)
        return cls.from_files({n: (path / n).read_text() for n in TOKENIZER_FILES if (path / n).exists()})

    @classmethod
    def from_files(cls, files: dict[str, str]) -> EngineTokenizer:
        """From the texts of tokenizer.json, tokenizer_config.json and chat_template.jinja (the
        last two optional; a template in the config wins, as in transformers)."""
        if "tokenizer.json" not in files:
            raise ValueError("no tokenizer.json")
        config = json.loads(files["tokenizer_config.json"]) if "tokenizer_config.json" in files else {}
        if not isinstance(config, dict):
            raise ValueError("tokenizer_config.json is not an object")
        if "chat_template.jinja" in files and "chat_template" not in config:
            config["chat_template"] = files["chat_template.jinja"]
        return cls(files["tokenizer.json"], config)

    def _special(self, name: str) -> str:
        value = self._config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        return value if isinstance(value, str) else ""

    def chat_ids(self, messages: list) -> list[int]:
        if self._template is None:
            raise Untokenizable("the model has no chat template")
        msgs = []
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise Untokenizable("a message without a role")
            msgs.append({"role": m["role"], "content": _text_content(m.get("content"))})
        try:
            text = self._template.render(messages=msgs, add_generation_prompt=True,
                                         bos_token=self._special("bos_token"), eos_token=self._special("eos_token"))
        except Untokenizable:
            raise
        except Exception as exc:  # a template's raise_exception or any rendering error
            raise Untokenizable(f"chat template: {exc}") from None
        return self._tok.encode(text, add_special_tokens=False).ids

    def prompt_ids(self, prompt: str) -> list[int]:
        return self._tok.encode(prompt, add_special_tokens=True).ids


def _raise(message: str):
    raise Untokenizable(message)


class SimTokenizer:
    """The engine simulator's tokens (enginesim: its chat rendering, sim_token_ids)."""

    def __init__(self, chars_per_token: int = 4) -> None:
        self.chars_per_token = chars_per_token

    def chat_ids(self, messages: list) -> list[int]:
        text = ""
        for m in messages:
            if not isinstance(m, dict):
                raise Untokenizable("a message that is not an object")
            text += f"<|{m.get('role', '')}|>{_text_content(m.get('content'))}\n"
        return sim_token_ids(text, self.chars_per_token)

    def prompt_ids(self, prompt: str) -> list[int]:
        return sim_token_ids(prompt, self.chars_per_token)


@dataclass(frozen=True)
class RequestHasher:
    tokenizer: EngineTokenizer | SimTokenizer
    hasher: BlockHasher = BlockHasher()
    lora_paths: tuple[tuple[str, str], ...] = ()  # adapter name -> the path the engine loaded it from

    def token_ids(self, data: dict) -> list[int]:
        msgs = data.get("messages")
        if isinstance(msgs, list):
            return self.tokenizer.chat_ids(msgs)
        prompt = data.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if isinstance(prompt, str):
            return self.tokenizer.prompt_ids(prompt)
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return list(prompt)  # token ids given: the engine hashes them as sent
        raise Untokenizable("no single text prompt or messages")

    async def hash_request(self, data: dict) -> list[int] | None:
        """``request_hashes`` for the router: only the simulator's tokenizer hashes in process (its
        rendering is ours); a model's own template runs in gateway/tokenize_pool.py."""
        return self.request_hashes(data)

    def request_hashes(self, data: dict) -> list[int] | None:
        """The request's block hashes (see the module), or None when it cannot be tokenized."""
        try:
            ids = self.token_ids(data)
        except (Untokenizable, ValueError, TypeError):
            return None
        model = data.get("model")
        lora = None
        for name, path in self.lora_paths:
            if name == model:
                lora = (name, path)
        salt = data.get("cache_salt")
        return self.hasher.hashes(ids, lora=lora, cache_salt=salt if isinstance(salt, str) and salt else None,
                                  max_blocks=MAX_BLOCKS)
