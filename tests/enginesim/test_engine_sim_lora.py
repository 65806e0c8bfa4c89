"""The simulator's runtime LoRA API (vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter)
over real HTTP: loaded adapters are model names, listed with their parent, bounded by --max-loras;
a load reads the adapter's directory (--lora-root is what the replica sees as /adapters), so an
adapter that was never fetched fails the load."""

from __future__ import annotations

import httpx

from enginesim.process import EngineProcess
from lab.tiny_model import write_tiny_adapter

CHAT = {"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


def test_load_use_list_unload(tmp_path):
    for name in ("sql", "poem", "code"):
        write_tiny_adapter(tmp_path / name)
    (tmp_path / "empty").mkdir()
    with EngineProcess.start(["--model", "sim-m", "--tokens-per-s", "0", "--prefill-tokens-per-s", "0",
                              "--max-loras", "2", "--lora-root", str(tmp_path)]) as e:
        def load(n, path=None):
            return httpx.post(e.url + "/v1/load_lora_adapter",
                              json={"lora_name": n, "lora_path": path or f"/adapters/{n}"})

        assert httpx.post(e.url + "/v1/chat/completions", json={"model": "sql", **CHAT}).status_code == 404
        for name, path in (("gone", None), ("empty", None), ("sql", "/a/sql"), ("sql", "/adapters/../sql"),
                           ("sql", str(tmp_path / "sql"))):  # only /adapters/NAME under the root counts
            refused = load(name, path)
            assert refused.status_code == 404 and "No adapter found" in refused.text, (name, path)
        assert load("sql").status_code == 200
        assert "already been loaded" in load("sql").text and load("sql").status_code == 400
        assert load("poem").status_code == 200
        assert load("code").status_code == 400  # --max-loras 2
        r = httpx.post(e.url + "/v1/chat/completions", json={"model": "sql", **CHAT})
        assert r.status_code == 200 and r.json()["model"] == "sql"
        cards = httpx.get(e.url + "/v1/models").json()["data"]
        assert [(c["id"], c["parent"]) for c in cards] == [("sim-m", None), ("sql", "sim-m"), ("poem", "sim-m")]
        assert cards[1]["root"] == "/adapters/sql"
        assert httpx.post(e.url + "/v1/unload_lora_adapter", json={"lora_name": "sql"}).status_code == 200
        assert httpx.post(e.url + "/v1/unload_lora_adapter", json={"lora_name": "sql"}).status_code == 404
        assert httpx.post(e.url + "/v1/chat/completions", json={"model": "sql", **CHAT}).status_code == 404
        assert httpx.post(e.url + "/v1/load_lora_adapter", json={"lora_name": ""}).status_code == 400
        state = httpx.get(e.url + "/sim/state").json()["lora"]
        assert state == {"loaded": ["poem"], "loads": 2, "unloads": 1}
