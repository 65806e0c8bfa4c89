"""Which files of a repository listing a node downloads (agent.models.file_selection)."""

from __future__ import annotations

from agent.models.file_selection import select_files

LLAMA_31 = [
    ".gitattributes", "LICENSE", "README.md", "USE_POLICY.md", "config.json", "generation_config.json",
    "model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors", "model-00003-of-00004.safetensors",
    "model-00004-of-00004.safetensors", "model.safetensors.index.json", "original/consolidated.00.pth",
    "original/params.json", "original/tokenizer.model", "special_tokens_map.json", "tokenizer.json",
    "tokenizer_config.json", "pytorch_model.bin", "training_args.bin", "optimizer.pt",
]


def test_llama_3_listing_keeps_config_tokenizer_and_safetensors_only():
    sel = select_files(LLAMA_31)
    assert sel.keep == (
        "config.json", "generation_config.json", "model-00001-of-00004.safetensors",
        "model-00002-of-00004.safetensors", "model-00003-of-00004.safetensors",
        "model-00004-of-00004.safetensors", "model.safetensors.index.json", "special_tokens_map.json",
        "tokenizer.json", "tokenizer_config.json")
    assert set(sel.skipped) == set(LLAMA_31) - set(sel.keep)
    assert "original/consolidated.00.pth" in sel.skipped and "pytorch_model.bin" in sel.skipped


def test_bin_only_repository_keeps_its_bin_weights():
    sel = select_files(["config.json", "pytorch_model.bin", "vocab.txt", "README.md"])
    assert sel.keep == ("config.json", "pytorch_model.bin", "vocab.txt")


def test_pickle_only_repository_keeps_the_pickle_for_the_scan_to_refuse():
    sel = select_files(["original/params.json", "original/consolidated.00.pth", "original/tokenizer.model"])
    assert sel.keep == ("original/params.json", "original/consolidated.00.pth", "original/tokenizer.model")


def test_gguf_embedding_and_triton_layouts():
    assert select_files(["Q4_K_M.gguf", "README.md", "config.json"]).keep == ("Q4_K_M.gguf", "config.json")
    tei = ["model.safetensors", "modules.json", "1_Pooling/config.json", "sentence_bert_config.json",
           "onnx/model.onnx", "pytorch_model.bin"]
    assert select_files(tei).keep == ("model.safetensors", "modules.json", "1_Pooling/config.json",
                                      "sentence_bert_config.json", "onnx/model.onnx")
    assert select_files(["ensemble/config.pbtxt", "model/1/model.plan"]).keep == (
        "ensemble/config.pbtxt", "model/1/model.plan")


def test_nothing_loadable_selects_nothing():
    assert select_files(["README.md", ".gitattributes", "modeling_x.py"]).keep == ()
