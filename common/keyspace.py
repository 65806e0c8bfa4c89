"""Where each resource lives in the store. One place, so no two modules spell a key differently."""

from urllib.parse import quote

ROOT = "/fabric"


def models(name: str = "") -> str:
    return f"{ROOT}/models/{name}"


def model_jobs(model: str = "", node: str = "") -> str:
    """One job per (model, node): /fabric/model-jobs/{model}/{node}."""
    if not model:
        return f"{ROOT}/model-jobs/"
    return f"{ROOT}/model-jobs/{model}/{node}"


def profiles(name: str = "") -> str:
    return f"{ROOT}/profiles/{name}"


def deployments(name: str = "") -> str:
    return f"{ROOT}/deployments/{name}"


def endpoints(name: str = "") -> str:
    return f"{ROOT}/endpoints/{name}"


def nodes(node_id: str = "") -> str:
    return f"{ROOT}/nodes/{node_id}"


def node_certs(node_id: str = "") -> str:
    return f"{ROOT}/node-certs/{node_id}"


def playground_slots(endpoint: str = "", owner: str = "") -> str:
    """A user's live playground-key slots on an endpoint (``owner``: a hash of the user's name)."""
    return f"{ROOT}/playground-slots/{endpoint}/{owner}{'/' if owner else ''}"


def sites(name: str = "") -> str:
    return f"{ROOT}/sites/{name}"


def replicas(deployment: str = "", replica_id: str = "") -> str:
    """Replicas of one deployment: /fabric/replicas/{deployment}/{replica_id}."""
    if not deployment:
        return f"{ROOT}/replicas/"
    return f"{ROOT}/replicas/{deployment}/{replica_id}"


def observations(replica_id: str = "") -> str:
    return f"{ROOT}/observations/{replica_id}"


def gpu_reservations(node_id: str = "", pci: str = "") -> str:
    """Exclusive, taken with create-if-absent: /fabric/gpu-reservations/{node}/{pci}."""
    if not node_id:
        return f"{ROOT}/gpu-reservations/"
    return f"{ROOT}/gpu-reservations/{node_id}/{pci}"


def vips(address: str = "") -> str:
    """Exclusive, taken with create-if-absent: /fabric/vips/{ipv4}."""
    return f"{ROOT}/vips/{address}"


def quotas(tenant: str = "") -> str:
    """A tenant's quota (max_gpus): /fabric/quotas/{tenant}."""
    return f"{ROOT}/quotas/{tenant}"


def scaling(deployment: str = "") -> str:
    """The autoscaler's memory for one deployment (how long each condition has held)."""
    return f"{ROOT}/scaling/{deployment}"


def demand(endpoint: str = "") -> str:
    """When the gateway last saw a call for an endpoint with no ready replica (cold start)."""
    return f"{ROOT}/demand/{endpoint}"


def api_keys(key_id: str = "") -> str:
    return f"{ROOT}/keys/{key_id}"


def api_key_prefixes(prefix: str = "") -> str:
    """Index prefix -> key id for the gateway's lookup."""
    return f"{ROOT}/key-prefixes/{prefix}"


def api_key_names(endpoint: str = "", name: str = "") -> str:
    """Index (endpoint, key name) -> key id, taken with create-if-absent so a name is unique per
    endpoint: /fabric/key-names/{endpoint}/{name, percent-encoded}."""
    if not endpoint:
        return f"{ROOT}/key-names/"
    return f"{ROOT}/key-names/{endpoint}/{quote(name, safe='')}"


def events(seq: str = "") -> str:
    return f"{ROOT}/events/{seq}"


def audit(seq: str = "") -> str:
    return f"{ROOT}/audit/{seq}"


def counters(name: str = "") -> str:
    return f"{ROOT}/counters/{name}"


def locks(name: str = "") -> str:
    return f"{ROOT}/locks/{name}"


def backups(name: str = "") -> str:
    """Backup bookkeeping, e.g. the last archive written (common.records.backup_status)."""
    return f"{ROOT}/backups/{name}"


def auth(name: str = "") -> str:
    """fabricd's shared auth material, e.g. the admin-token signing secret."""
    return f"{ROOT}/auth/{name}"


def revisions(deployment: str = "", revision: int | None = None) -> str:
    """Immutable templates: /fabric/revisions/{deployment}/{revision:08d} (sorted by number)."""
    if not deployment:
        return f"{ROOT}/revisions/"
    return f"{ROOT}/revisions/{deployment}/" + ("" if revision is None else f"{revision:08d}")


def rollouts(deployment: str = "", rollout_id: int | None = None) -> str:
    """Rollout records: /fabric/rollouts/{deployment}/{id:08d}, taken with create-if-absent."""
    if not deployment:
        return f"{ROOT}/rollouts/"
    return f"{ROOT}/rollouts/{deployment}/" + ("" if rollout_id is None else f"{rollout_id:08d}")


def batches(batch_id: str = "") -> str:
    """Batch job records: /fabric/batches/{id} (the id is fabricd's, never the caller's)."""
    return f"{ROOT}/batches/{batch_id}"


def mig_slices(node_id: str = "", slice_id: str = "") -> str:
    """MIG slice records: /fabric/mig/{node}/{slice id} (slice id PARENT--PROFILE--N)."""
    if not node_id:
        return f"{ROOT}/mig/"
    return f"{ROOT}/mig/{node_id}/{slice_id}"


def model_aliases(name: str = "") -> str:
    """A stable model name clients use, mapped to an endpoint (gateway root routing)."""
    return f"{ROOT}/model-aliases/{name}"


def users(name: str = "") -> str:
    """Local control-plane users (controlplane.tenancy.users): role, tenant, an Argon2 hash."""
    return f"{ROOT}/users/{name}"


def policies(tenant: str = "") -> str:
    """Per-tenant deploy policies (controlplane.tenancy.policies)."""
    return f"{ROOT}/policies/{tenant}"


def key_policies(endpoint: str = "") -> str:
    """Per-endpoint API key policies (controlplane.tenancy.key_policies)."""
    return f"{ROOT}/key-policies/{endpoint}"


def identity_mappings(name: str = "") -> str:
    """Inference OIDC callers' groups/roles -> endpoints (common.identity_mappings; the gateway reads them)."""
    return f"{ROOT}/identity-mappings/{name}"


def tenant_limits(tenant: str = "") -> str:
    """A tenant's inference limits at the gateway, e.g. max_context_tokens (common.tenant_limits)."""
    return f"{ROOT}/tenant-limits/{tenant}"


def replica_lifetimes(replica_id: str = "") -> str:
    """When each replica held its GPUs and was ready (common.records.lifetimes), kept after
    the replica is gone so finops can integrate GPU-seconds over a window."""
    return f"{ROOT}/replica-lifetimes/{replica_id}"


def model_sites(model: str = "", site: str = "") -> str:
    """Where a model's bytes are, per site (controlplane.models.replicate): /fabric/model-sites/{model}/{site}."""
    if not model:
        return f"{ROOT}/model-sites/"
    return f"{ROOT}/model-sites/{model}/{site}"


def usage(span: str = "", start: int | None = None, source: str = "") -> str:
    """Usage ledger documents (common.usage_ledger): /fabric/usage/{hour|day}/{start}/{source}, one
    per gateway process and clock hour (or one per compacted day)."""
    if not span:
        return f"{ROOT}/usage/"
    if start is None:
        return f"{ROOT}/usage/{span}/"
    return f"{ROOT}/usage/{span}/{start:012d}/{source}"


def prices() -> str:
    """The one price sheet (common.prices): per model and per GPU-hour."""
    return f"{ROOT}/prices"


def budgets(name: str = "") -> str:
    """Token and cost budgets per tenant or key (common.budgets)."""
    return f"{ROOT}/budgets/{name}"


def webhooks(name: str = "") -> str:
    """Notification receivers (common.notifications)."""
    return f"{ROOT}/webhooks/{name}"


def notifications(event_id: str = "") -> str:
    """Notifications to deliver, one per event id (created if absent: the de-duplication)."""
    return f"{ROOT}/notifications/{event_id}"


def routing_plans(endpoint: str = "") -> str:
    """Each endpoint's published routing plan, with its generation (common.records.plans)."""
    return f"{ROOT}/routing-plans/{endpoint}"
