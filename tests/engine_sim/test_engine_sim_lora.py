"""The simulator's runtime LoRA API (vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter)
over real HTTP: loaded adapters are model names, listed with their parent, bounded by --max-loras."""

from __future__ import annotations

import httpx

from agent.engine_sim.process import EngineProcess

CHAT = {"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


def test_load_use_list_unload():
    with EngineProcess.start(["--model", "sim-m", "--tokens-per-s", "0", "--prefill-tokens-per-s", "0",
                              "--max-loras", "2"]) as e:
        load = lambda n: httpx.post(e.url + "/v1/load_lora_adapter", json={"lora_name": n, "lora_path": f"/a/{n}"})
        assert httpx.post(e.url + "/v1/chat/completions", json={"model": "sql", **CHAT}).status_code == 404
        assert load("sql").status_code == 200
        assert "already been loaded" in load("sql").text and load("sql").status_code == 400
        assert load("poem").status_code == 200
        assert load("code").status_code == 400  # --max-loras 2
        r = httpx.post(e.url + "/v1/chat/completions", json={"model": "sql", **CHAT})
        assert r.status_code == 200 and r.json()["model"] == "sql"
        cards = httpx.get(e.url + "/v1/models").json()["data"]
        assert [(c["id"], c["parent"]) for c in cards] == [("sim-m", None), ("sql", "sim-m"), ("poem", "sim-m")]
        assert cards[1]["root"] == "/a/sql"
        assert httpx.post(e.url + "/v1/unload_lora_adapter", json={"lora_name": "sql"}).status_code == 200
        assert httpx.post(e.url + "/v1/unload_lora_adapter", json={"lora_name": "sql"}).status_code == 404
        assert httpx.post(e.url + "/v1/chat/completions", json={"model": "sql", **CHAT}).status_code == 404
        assert httpx.post(e.url + "/v1/load_lora_adapter", json={"lora_name": ""}).status_code == 400
        state = httpx.get(e.url + "/sim/state").json()["lora"]
        assert state == {"loaded": ["poem"], "loads": 2, "unloads": 1}
