"""The node agent's index of what its replicas' engines hold in their KV caches, from the engines'
own KV events (vLLM's ``--kv-events-config``; the simulator emits the same stream). See
docs/kv-events.md for why gateways read it from the agents rather than through the store."""
