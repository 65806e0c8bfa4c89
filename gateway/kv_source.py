"""Where a gateway's precise prefix routing reads what the engines hold: the node agents' KV
index (agent/kv_index), one POST /v1/kv-index/match per node that hosts a candidate replica,
concurrently, each bounded by ``timeout_s`` (a node that does not answer in time leaves its
replicas blind for this call: the approximate router scores them). See docs/kv-events.md for
why the gateways ask the agents instead of watching the store.

Tokenizers, per deployment, first found wins:

  1. ``tokenizer_root`` (FABRIC_GATEWAY_KV_TOKENIZERS, an override): ``DEPLOYMENT/`` holding the
     model's tokenizer.json (and tokenizer_config.json / chat_template.jinja), or a file
     ``DEPLOYMENT.sim`` marking a deployment of engine simulators;
  2. the supply chain's copy: the deployment's model record names its verified digest
     (status.digest), and the agent of a node hosting one of its replicas serves that model's
     tokenizer files from its cache (GET /v1/kv-index/tokenizer/{digest}); an agent whose
     engines are simulators answers ``engine: sim``. The agent serves the model's manifest
     with the files and the gateway checks both against the digest
     (common/model_manifest.verify_served_files): files that do not match are not used (the
     deployment routes approximately until another node serves the right ones), so a
     compromised node cannot plant a template or a tokenizer.

A model's files are never parsed in the gateway process: the hasher handed to the router sends
them to gateway/tokenize_pool.py (bounded worker processes with a deadline per call); only the
simulator's tokenizer, whose rendering is ours, hashes in process.

A fetched tokenizer is kept while the model's digest stays the same (re-read from the store
every CHECK_S); a deployment without one is asked again after RETRY_S. A call does not wait
more than ``timeout_s`` for a fetch: it is routed approximately meanwhile and the fetch goes on.

One tokenizer per deployment: the model of the deployment's revision when it was fetched. During
a rollout that changes the model, a replica of a revision whose template names another model
(or whose revision record is gone) is not asked: its state is ``other_model`` and the
approximate router scores it, since hashes from another model's tokenizer would match nothing it
holds. An override directory serves every replica of its deployment.

Without traffic the states do not go stale: every REFRESH_S (a task started by the first match)
each endpoint this process routed precisely and has not asked since is re-read from the store and
its agents asked with no hashes, so the blind gauge and events follow the replicas as they are
(a deleted endpoint, or one no longer ``prefix``, loses its gauge).

Block size: the one the agents report from the engines' events (``block_size``), learned per
deployment (the size most of its replicas report); 16 until the first answer. A live replica
whose engine reports another size than the one a call's hashes were made with (a revision that
changed --block-size, or the first call) is ``other_block_size`` for that call: scored
approximately, since those hashes match nothing it holds.

Evictions: each answer says per replica whether its engine evicted a cached block lately
(``evicting``, the agent's 10 s window, common/kv_index.EVICT_WINDOW_S; null for a replica that
sent no events). ``evicting(view)`` hands the last answer's to the router, which gives them to
the gate (gateway/router_gate.GateCandidate.evicting: a new conversation spreads more readily
onto an idle replica whose cache evicts nothing); a replica not answered is None (not known). Node addresses come from the store (keyspace.nodes),
cached NODE_TTL_S. Agents are reached at their advertised address with the node id as TLS
server name (their certificates name the node, as fabricd pins them), with the client
certificate FABRIC_GATEWAY_KV_CLIENT_* names (else the backend one; `fabricd pki issue-client`
makes it), which the agents admit on /v1/kv-index/* when its CN is one of their
--kv-index-client-cn (default fabric-gateway)."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from pathlib import Path

from common.errors import NotFound
from common.kv_events import BlockHasher
from common.model_manifest import TOKENIZER_FILES, CheckFailed, verify_served_files
from common.records import deployments, models, nodes, rollouts
from gateway.engine_hash import RequestHasher, SimTokenizer
from gateway.kv_blind import BlindWatch
from gateway.tokenize_pool import PooledHasher, TokenizePool
from gateway.upstreams import UpstreamCache

NODE_TTL_S = 30.0
DEFAULT_BLOCK_SIZE = 16
CHECK_S = 30.0  # how often a fetched tokenizer's digest is compared with the model record's
RETRY_S = 30.0  # a deployment whose tokenizer could not be had is asked again after this
FETCH_TIMEOUT_S = 20.0
MAX_TOKENIZER_ANSWER = 256 << 20  # the agent's three files at their cap (64 MiB each) as JSON text, with room
MAX_ENDPOINTS = 1024  # endpoints whose last answer's states are kept (for explanations)
REFRESH_S = 15.0  # an endpoint not asked for this long is asked again (states without traffic)
REFRESH_CONCURRENCY = 16  # endpoints refreshed at once
MAX_REVISIONS = 4096  # (deployment, revision) -> model names remembered
OTHER_MODEL = "other_model"
OTHER_BLOCK_SIZE = "other_block_size"


@dataclass(frozen=True)
class TokenizerFiles:
    """A model's tokenizer files, verified (or an operator's override), for the pool."""

    key: str
    files: dict[str, str]


@dataclass
class _Tok:
    tokenizer: SimTokenizer | TokenizerFiles | None
    digest: str | None
    check_at: float
    origin: str  # override | agent | none: why (for the explanation)
    model: str | None = None  # the model it tokenizes for; None (an override): every replica's
    revision: int | None = None  # the deployment's revision when its model was read


class AgentKvSource:
    def __init__(self, upstreams: UpstreamCache, client, tokenizer_root: Path | None = None, timeout_s: float = 0.1,
                 blind: BlindWatch | None = None, fetch_timeout_s: float = FETCH_TIMEOUT_S,
                 refresh_s: float = REFRESH_S, pool: TokenizePool | None = None) -> None:
        """``upstreams``: the gateway's endpoint views (the refresh reads them from its mirror,
        never the store); its store answers the few point reads here (a deployment's model and
        digest every CHECK_S, a node's address every NODE_TTL_S, an immutable revision once)."""
        self.pool = pool or TokenizePool()
        self._upstreams = upstreams
        self._store, self._client, self._timeout = upstreams.store, client, timeout_s
        self._root = Path(tokenizer_root) if tokenizer_root else None
        self._fetch_timeout = fetch_timeout_s
        self.blind = blind or BlindWatch()
        self._tokenizers: dict[str, _Tok] = {}
        self._fetching: dict[str, asyncio.Task] = {}
        self._block_size: dict[str, int] = {}
        self._nodes: dict[str, tuple[float, str | None]] = {}
        self._states: OrderedDict[str, dict[str, str]] = OrderedDict()  # endpoint -> its last answer's states
        self._evicting: dict[str, dict[str, bool]] = {}  # endpoint -> its last answer's evicting flags
        self._asked: dict[str, float] = {}  # endpoint -> when its agents were last asked (monotonic)
        self._revisions: OrderedDict[tuple[str, int], tuple[str | None, float]] = OrderedDict()
        self._refresh_s = refresh_s
        self._refresher: asyncio.Task | None = None

    # -- tokenizers ---------------------------------------------------------------------------
    def _override(self, deployment: str) -> _Tok | None:
        if self._root is None:
            return None
        d = self._root / deployment
        if (self._root / f"{deployment}.sim").exists():
            return _Tok(SimTokenizer(), None, float("inf"), "override")
        if (d / "tokenizer.json").exists():
            try:
                files = {n: (d / n).read_text() for n in TOKENIZER_FILES if (d / n).is_file()}
            except (OSError, UnicodeDecodeError):  # an unreadable file: approximate routing, not a failure
                return _Tok(None, None, float("inf"), "override")
            return _Tok(TokenizerFiles(f"override:{deployment}", files), None, float("inf"), "override")
        return None

    def _current(self, deployment: str) -> tuple[str | None, int | None, str | None]:
        """(model, revision, the model's verified digest) the deployment names now."""
        dep = deployments.get(self._store, deployment)
        if dep is None:
            return None, None, None
        model = models.get(self._store, dep.model)
        return dep.model, dep.revision, model.status.digest if model is not None else None

    async def _fetch(self, view, current: tuple[str | None, int | None, str | None]) -> _Tok:
        model, revision, digest = current
        now = time.monotonic()
        if digest is None:
            return _Tok(None, None, now + RETRY_S, "none", model, revision)
        # Nodes of the current revision's replicas first: their caches hold this model.
        for node in dict.fromkeys(r.node for r in sorted(view.replicas, key=lambda r: r.revision != revision)):
            address = self._node_address(node)
            if address is None:
                continue
            try:
                raw = await asyncio.wait_for(self._read_capped(
                    f"{address.rstrip('/')}/v1/kv-index/tokenizer/{digest}", _sni(address, node)), self._fetch_timeout)
            except Exception:  # transport errors of any client, an answer over the cap: try the next node
                continue
            if raw is None:
                continue
            try:
                body = json.loads(raw)
                tok: SimTokenizer | TokenizerFiles
                if body.get("engine") == "sim":
                    tok = SimTokenizer()
                else:
                    files = {str(k): str(v) for k, v in dict(body.get("files") or {}).items()}
                    await asyncio.to_thread(verify_served_files, digest, str(body.get("manifest") or ""),
                                            {k: v.encode() for k, v in files.items()}, TOKENIZER_FILES)
                    tok = TokenizerFiles(digest, files)
            except (CheckFailed, ValueError, TypeError, AttributeError):  # not the model's files: the next node
                continue
            return _Tok(tok, digest, time.monotonic() + CHECK_S, "agent", model, revision)
        return _Tok(None, digest, time.monotonic() + RETRY_S, "none", model, revision)

    async def _read_capped(self, url: str, extensions: dict) -> bytes | None:
        """A 200 answer's body, read up to MAX_TOKENIZER_ANSWER (a node cannot make the gateway
        buffer an endless answer); None for another status."""
        async with self._client.stream("GET", url, extensions=extensions) as resp:
            if resp.status_code != 200:
                return None
            body = bytearray()
            async for chunk in resp.aiter_bytes():
                body += chunk
                if len(body) > MAX_TOKENIZER_ANSWER:
                    raise ValueError("the tokenizer answer is over MAX_TOKENIZER_ANSWER")
            return bytes(body)

    async def _tokenizer(self, view):
        deployment = view.endpoint.deployment
        hit = self._tokenizers.get(deployment)
        now = time.monotonic()
        if hit is not None and hit.check_at > now:
            return hit.tokenizer
        if hit is None or hit.origin != "agent":
            override = self._override(deployment)
            if override is not None:
                self._tokenizers[deployment] = override
                return override.tokenizer
        current = self._current(deployment)
        digest = current[2]
        if hit is not None and hit.tokenizer is not None and hit.digest == digest:
            hit.check_at = now + CHECK_S
            hit.model, hit.revision = current[0], current[1]  # the same files under another revision
            return hit.tokenizer
        task = self._fetching.get(deployment)
        if task is None:
            task = self._fetching[deployment] = asyncio.ensure_future(self._fetch(view, current))
            task.add_done_callback(lambda t, d=deployment: self._fetched(d, t))
        try:
            got = await asyncio.wait_for(asyncio.shield(task), self._timeout)
        except asyncio.TimeoutError:  # not the builtin TimeoutError on Python 3.10
            return hit.tokenizer if hit is not None and hit.digest == digest else None
        return got.tokenizer

    def _fetched(self, deployment: str, task: asyncio.Task) -> None:
        self._fetching.pop(deployment, None)
        if not task.cancelled() and task.exception() is None:
            self._tokenizers[deployment] = task.result()

    async def hasher(self, view) -> RequestHasher | PooledHasher | None:
        try:
            tok = await self._tokenizer(view)
        except Exception:  # a store hiccup or a record that does not parse: this call routes approximately
            return None
        if tok is None:
            return None
        block = BlockHasher(self._block_size.get(view.endpoint.deployment, DEFAULT_BLOCK_SIZE))
        if isinstance(tok, TokenizerFiles):
            return PooledHasher(self.pool, tok.key, tok.files, block)
        return RequestHasher(tok, block)

    # -- the index ----------------------------------------------------------------------------
    def _node_address(self, node_id: str) -> str | None:
        hit = self._nodes.get(node_id)
        now = time.monotonic()
        if hit is not None and hit[0] > now:
            return hit[1]
        node = nodes.get(self._store, node_id)
        address = node.address if node is not None else None
        self._nodes[node_id] = (now + NODE_TTL_S, address)
        return address

    def _revision_model(self, deployment: str, revision: int) -> str | None:
        """The model a revision's template names (revisions are immutable: kept; a missing or
        broken record counts as unknown, asked again after CHECK_S)."""
        key = (deployment, revision)
        hit = self._revisions.get(key)
        now = time.monotonic()
        if hit is not None and hit[1] > now:
            return hit[0]
        try:
            rev = rollouts.get_revision(self._store, deployment, revision)
            model = rev.template.model if rev is not None else None
        except Exception:  # a store hiccup or a broken record: unknown, so approximate
            model = None
        self._revisions[key] = (model, float("inf") if model is not None else now + CHECK_S)
        while len(self._revisions) > MAX_REVISIONS:
            self._revisions.popitem(last=False)
        return model

    def other_model(self, view) -> set[str]:
        """The replicas whose revision runs another model than the tokenizer's (module docstring)."""
        tok = self._tokenizers.get(view.endpoint.deployment)
        if tok is None or tok.model is None:
            return set()
        return {r.replica_id for r in view.replicas if r.revision != tok.revision
                and self._revision_model(view.endpoint.deployment, r.revision) != tok.model}

    def states(self, view) -> dict[str, str]:
        """replica -> its state in the last answer (kv_blind's vocabulary)."""
        last = self._states.get(view.endpoint.name, {})
        return {r.replica_id: last.get(r.replica_id, "no_answer") for r in view.replicas}

    def evicting(self, view) -> dict[str, bool | None]:
        """replica -> whether its engine evicted lately, in the last answer (None: not known)."""
        last = self._evicting.get(view.endpoint.name, {})
        return {r.replica_id: last.get(r.replica_id) for r in view.replicas}

    async def match(self, view, hashes: list[int], *, call: bool = True) -> dict[str, int | None]:
        """replica -> matched leading blocks (None: scored approximately); ``call`` False for the
        refresh, which updates states, gauge and events but counts no routed call."""
        self._start_refresher()
        deployment = view.endpoint.deployment
        used = self._block_size.get(deployment, DEFAULT_BLOCK_SIZE)  # what hasher() just made these with
        sizes: dict[str, int] = {}
        other = self.other_model(view)
        by_node: dict[str, list[str]] = {}
        for r in view.replicas:
            if r.replica_id not in other:
                by_node.setdefault(r.node, []).append(r.replica_id)
        out: dict[str, int | None] = {r.replica_id: None for r in view.replicas}
        evicting: dict[str, bool] = {}
        states: dict[str, str] = {r.replica_id: OTHER_MODEL if r.replica_id in other else "no_answer"
                                  for r in view.replicas}

        async def ask(node: str, replicas: list[str]) -> None:
            address = self._node_address(node)
            if address is None:
                return
            try:
                resp = await asyncio.wait_for(self._client.post(
                    f"{address.rstrip('/')}/v1/kv-index/match", json={"hashes": hashes, "replicas": replicas},
                    extensions=_sni(address, node)), self._timeout)
            except Exception:  # transport errors of any client: blind for this call
                return
            if resp.status_code == 403:
                states.update(dict.fromkeys(replicas, "refused"))
            if resp.status_code != 200:
                return
            for rid, row in (resp.json().get("replicas") or {}).items():
                if rid in out and isinstance(row, dict):
                    n = row.get("matched_blocks")
                    out[rid] = n if isinstance(n, int) else None
                    state = row.get("state")
                    states[rid] = state if isinstance(state, str) else ("live" if out[rid] is not None else "warming")
                    size = row.get("block_size")
                    if isinstance(size, int) and size > 0:
                        sizes[rid] = size
                    if isinstance(row.get("evicting"), bool):
                        evicting[rid] = row["evicting"]

        self._asked[view.endpoint.name] = time.monotonic()
        await asyncio.gather(*(ask(n, rs) for n, rs in by_node.items()))
        if sizes:  # the size most replicas report (the one in use on a tie) hashes the next calls
            counts = Counter(sizes.values())
            self._block_size[deployment] = max(counts, key=lambda z: (counts[z], z == used))
        for rid, size in sizes.items():
            if hashes and size != used and states[rid] == "live":  # these hashes match nothing it holds
                out[rid], states[rid] = None, OTHER_BLOCK_SIZE
        self._states[view.endpoint.name] = states
        self._evicting[view.endpoint.name] = evicting
        self._states.move_to_end(view.endpoint.name)
        while len(self._states) > MAX_ENDPOINTS:
            self._forget(next(iter(self._states)))
        self.blind.observe(view.endpoint.name, states, call=call)
        return out

    # -- states without traffic ---------------------------------------------------------------
    def _start_refresher(self) -> None:
        if self._refresher is None or self._refresher.done():
            self._refresher = asyncio.get_running_loop().create_task(self._refresh_every())

    async def _refresh_every(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_s)
            try:
                await self.refresh()
            except Exception:  # never let one bad round stop the refresh
                pass

    async def refresh(self, now: float | None = None) -> None:
        """Ask again for every endpoint kept that was not asked in the last ``refresh_s``, at most
        REFRESH_CONCURRENCY at once (a node that does not answer costs each of its endpoints
        ``timeout_s``, not the whole round in turn)."""
        now = time.monotonic() if now is None else now
        due = [name for name in list(self._states) if now - self._asked.get(name, 0.0) >= self._refresh_s]
        gate = asyncio.Semaphore(REFRESH_CONCURRENCY)

        async def one(name: str) -> None:
            async with gate:
                try:
                    view = await self._upstreams.view(name, need_upstream=False)
                except NotFound:
                    self._forget(name)
                    return
                except Exception:  # the store did not answer or a record is broken: next round
                    return
                if view.endpoint.routing_l7 != "prefix":
                    self._forget(name)
                    return
                try:
                    await self.match(view, [], call=False)
                except Exception:  # an answer that does not parse: next round
                    return

        await asyncio.gather(*(one(name) for name in due))

    def _forget(self, endpoint: str) -> None:
        self._states.pop(endpoint, None)
        self._evicting.pop(endpoint, None)
        self._asked.pop(endpoint, None)
        self.blind.forget(endpoint)


def _sni(address: str, node: str) -> dict:
    """The node id as the TLS server name of an https agent (its certificate names the node)."""
    return {"sni_hostname": node} if address.startswith("https://") else {}
