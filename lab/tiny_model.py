"""The lab's tiny model, made here: a deterministic Llama-shaped causal LM that the real vLLM
engine loads on a CPU, laid out like a Hugging Face repository; and a LoRA adapter of it, laid out
as PEFT saves one.

``write_tiny_model`` writes
  config.json               LlamaForCausalLM: hidden 128, 4 heads of 32 (CPU attention needs a head
                            size >= 32), 2 KV heads, 2 layers, 2048 positions, bfloat16 (the CPU engine's own dtype)
  tokenizer.json            a byte-level BPE (1024 tokens) trained with ``tokenizers`` on
                            tiny_corpus.txt beside this file, text written for Fabric
  tokenizer_config.json     special tokens and a Llama-3-style chat template
  model-0000N-of-0000M.safetensors + model.safetensors.index.json   the weights (``shards`` files)
Every byte follows from the arguments: the weights come from ``numpy.random.default_rng(seed)``,
the tokenizer from the shipped text, and no file carries a time stamp, so the same call writes the
same digest on every machine. The words it generates mean nothing; they arrive, token by token,
through the real engine, which is what the lab needs. ``llama_layout`` adds what a Llama 3.x
repository carries beside its safetensors and no runtime loads: Meta's ``original/`` checkpoint
(``consolidated.00.pth``, a pickle, with ``params.json`` and ``tokenizer.model``), a
``pytorch_model.bin`` copy, README.md and .gitattributes (the lab's mirror serves it this way). ``extra_bytes`` adds one more tensor
(``fabric.padding``, uint8) to make a file big enough to interrupt mid-download; the engine does not
load a model with it.

``write_tiny_adapter`` writes adapter_config.json (rank ``r``, alpha, q_proj/v_proj) and
adapter_model.safetensors with the A and B matrices of each layer: what vLLM's --enable-lora loads.
Its B matrices are not zero, so a request through the adapter gets other tokens than the base.
"""

from __future__ import annotations

import json
import pickle
import struct
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

CORPUS = Path(__file__).with_name("tiny_corpus.txt")
VOCAB = 1024
HEAD_DIM = 32  # the CPU engine's attention refuses smaller heads
HEADS, KV_HEADS = 4, 2
INTERMEDIATE = 256
MAX_POSITIONS = 2048
BOS, EOS, PAD = "<|begin_of_text|>", "<|eot_id|>", "<|pad|>"
SPECIAL = [BOS, "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", EOS, PAD]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n{{ message['content'] | trim }}<|eot_id|>"
    "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def bfloat16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounded to nearest even."""
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def save_bf16(tensors: dict[str, np.ndarray], path: Path) -> None:
    """A safetensors file: float32 tensors stored as BF16, uint8 ones as U8 (numpy has no bfloat16,
    so the file is written here: an 8-byte little-endian header size, the JSON header padded to
    8 bytes, then the data)."""
    header: dict = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name in sorted(tensors):
        t = tensors[name]
        raw = t.tobytes() if t.dtype == np.uint8 else bfloat16_bits(t).tobytes()
        dtype = "U8" if t.dtype == np.uint8 else "BF16"
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for raw in blobs:
            f.write(raw)


def _dump(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n")


def tokenizer_json(vocab_size: int = VOCAB) -> str:
    """The tokenizer as tokenizer.json text: byte-level BPE trained on the shipped corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    lines = CORPUS.read_text().splitlines()
    tok.train_from_iterator(lines, trainer=trainer, length=len(lines))
    bos = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                       special_tokens=[(BOS, bos)])
    return tok.to_str()


def _tensors(rng: np.random.Generator, hidden: int, layers: int, vocab: int) -> dict[str, np.ndarray]:
    """Llama's weight names and shapes, small normal values (std 0.02, norms at 1)."""
    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    kv = KV_HEADS * HEAD_DIM
    out = {"model.embed_tokens.weight": w(vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}"
        out |= {
            f"{p}.input_layernorm.weight": np.ones(hidden, np.float32),
            f"{p}.post_attention_layernorm.weight": np.ones(hidden, np.float32),
            f"{p}.self_attn.q_proj.weight": w(HEADS * HEAD_DIM, hidden),
            f"{p}.self_attn.k_proj.weight": w(kv, hidden),
            f"{p}.self_attn.v_proj.weight": w(kv, hidden),
            f"{p}.self_attn.o_proj.weight": w(hidden, HEADS * HEAD_DIM),
            f"{p}.mlp.gate_proj.weight": w(INTERMEDIATE, hidden),
            f"{p}.mlp.up_proj.weight": w(INTERMEDIATE, hidden),
            f"{p}.mlp.down_proj.weight": w(hidden, INTERMEDIATE),
        }
    out["model.norm.weight"] = np.ones(hidden, np.float32)
    out["lm_head.weight"] = w(vocab, hidden)
    return out


def write_tiny_model(path: Path, *, shards: int = 2, hidden: int = HEADS * HEAD_DIM, layers: int = 2,
                     seed: int = 0, extra_bytes: int = 0, llama_layout: bool = False) -> Path:
    """Write the model under ``path`` and return it (see the module's docstring)."""
    path.mkdir(parents=True, exist_ok=True)
    tok_text = tokenizer_json()
    vocab = len(json.loads(tok_text)["model"]["vocab"])
    (path / "tokenizer.json").write_text(tok_text)
    _dump(path / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS, "pad_token": PAD,
        "chat_template": CHAT_TEMPLATE, "model_max_length": MAX_POSITIONS, "clean_up_tokenization_spaces": False,
    })
    rng = np.random.default_rng(seed)
    tensors = _tensors(rng, hidden, layers, vocab)
    if extra_bytes:
        tensors["fabric.padding"] = rng.integers(0, 255, extra_bytes, dtype=np.uint8)
    names = sorted(tensors, key=lambda k: (k != "fabric.padding", k))  # padding in the first file
    shards = max(1, min(shards, len(names)))
    per = -(-len(names) // shards)
    weight_map: dict[str, str] = {}
    for shard in range(shards):
        file = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        part = names[shard * per:(shard + 1) * per]
        save_bf16({k: tensors[k] for k in part}, path / file)
        weight_map |= dict.fromkeys(part, file)
    total = sum(t.nbytes if t.dtype == np.uint8 else t.nbytes // 2 for t in tensors.values())
    _dump(path / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})
    _dump(path / "config.json", {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": INTERMEDIATE, "num_hidden_layers": layers, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "vocab_size": vocab, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "dtype": "bfloat16",
        "bos_token_id": json.loads(tok_text)["model"]["vocab"][BOS],
        "eos_token_id": json.loads(tok_text)["model"]["vocab"][EOS],
        "attention_bias": False, "mlp_bias": False,
    })
    if llama_layout:
        _write_llama_extras(path, hidden, layers, vocab)
    return path


def _write_llama_extras(path: Path, hidden: int, layers: int, vocab: int) -> None:
    # Pickle bytes (protocol 4 header and a plain dict) as torch.save's payload would be: only the
    # supply chain's selection keeps them off a node, nothing ever unpickles them.
    original = path / "original"
    original.mkdir(exist_ok=True)
    payload = pickle.dumps({"fabric": "Meta-format checkpoint stand-in"}, protocol=4)
    (original / "consolidated.00.pth").write_bytes(payload)
    _dump(original / "params.json", {"dim": hidden, "n_layers": layers, "n_heads": HEADS,
                                     "n_kv_heads": KV_HEADS, "vocab_size": vocab, "norm_eps": 1e-5})
    (original / "tokenizer.model").write_text("IQ== 0\n")  # tiktoken's format: base64 token, rank
    (path / "pytorch_model.bin").write_bytes(payload)
    (path / "README.md").write_text("# tiny-chat\n\nFabric's lab model, laid out like a Llama 3.x repository.\n")
    (path / ".gitattributes").write_text("*.safetensors filter=lfs diff=lfs merge=lfs -text\n")


def write_tiny_adapter(path: Path, *, rank: int = 8, hidden: int = HEADS * HEAD_DIM, layers: int = 2, seed: int = 1,
                       base: str = "fab/tiny") -> Path:
    """A LoRA adapter of ``write_tiny_model``'s model, laid out as PEFT saves one."""
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    outs = {"q_proj": HEADS * HEAD_DIM, "v_proj": KV_HEADS * HEAD_DIM}
    tensors = {}
    for layer in range(layers):
        for module, out in outs.items():
            stem = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{stem}.lora_A.weight"] = (rng.standard_normal((rank, hidden)) * 0.1).astype(np.float32)
            tensors[f"{stem}.lora_B.weight"] = (rng.standard_normal((out, rank)) * 0.1).astype(np.float32)
    save_file(tensors, str(path / "adapter_model.safetensors"), metadata={"format": "pt"})
    _dump(path / "adapter_config.json", {
        "peft_type": "LORA", "base_model_name_or_path": base, "r": rank, "lora_alpha": 2 * rank,
        "lora_dropout": 0.0, "target_modules": sorted(outs), "bias": "none", "task_type": "CAUSAL_LM",
        "fan_in_fan_out": False, "modules_to_save": None,
    })
    return path
