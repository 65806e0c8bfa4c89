"""Which weights a tenant-bound caller may register: its own model root, and allow-listed repos.

A model's source is fetched by the node, with the node's access: any file under
FABRIC_MODEL_DIR and, for ``hf://`` sources, whatever the node's one HF token can read. Without
a rule, tenant A could register tenant B's fine-tune (a path under the shared root) or a private
repository of another team. So, for a caller bound to tenant T (cluster-wide callers and admins
are trusted across tenants and keep the whole root):

  - a local source (``/path`` or ``file:///path``) must resolve under ``{FABRIC_MODEL_DIR}/tenants/T/``,
    the tenant's own model root (the agent checks again, on its host, that it is under
    FABRIC_MODEL_DIR);
  - an ``hf://`` source must lie under one of the ``hf://`` entries of T's policy
    ``allowed_source_prefixes`` by whole path segments (controlplane.tenancy.policies.source_under;
    set by an admin, e.g. ``hf://team-a``, which does not admit ``hf://team-a-evil/``): a tenant
    without such an entry may not register ``hf://`` sources;
  - an ``hf://`` revision ``@refs/pr/N`` (a pull request, which anyone with a Hub account may open
    on a public repository) is refused unless an admin set the policy's ``allow_pr_revisions``.

Refusals are 403 "source_not_allowed" naming the rule, never another tenant's paths. Adapters'
sources follow the same rule. ``refusal`` is the pure decision.
"""

from __future__ import annotations

from common.errors import Forbidden
from common.model_api import local_source_path, tenant_root
from common.store.base import Store
from controlplane.tenancy import policies
from controlplane.tenancy.principal import Principal


def refusal(source: str, tenant: str, model_dir: str, allowed_prefixes: list[str] | None,
            allow_pr_revisions: bool = False) -> str | None:
    """Pure (but for realpath): why a caller bound to ``tenant`` may not register ``source``."""
    if source.startswith("hf://"):
        _, _, revision = source.partition("@")
        if revision.startswith("refs/pr/") and not allow_pr_revisions:
            return (f"source {source!r} names a pull-request revision; tenant {tenant!r} may not use @refs/pr/ "
                    "revisions unless an admin sets allow_pr_revisions in its policy")
        hf = [p for p in allowed_prefixes or [] if p.startswith("hf://")]
        if not any(policies.source_under(source, p) for p in hf):
            if not hf:
                return (f"tenant {tenant!r} may not register hf:// sources: its policy allows no hf:// "
                        "repositories (an admin adds them to allowed_source_prefixes, e.g. hf://your-org/)")
            return f"source {source!r} is not under the hf:// repositories tenant {tenant!r} may use: {', '.join(hf)}"
        return None
    try:
        local_source_path(source, model_dir, tenant)
    except ValueError:  # its message may name where a link leads: another tenant's path
        return (f"a local source of tenant {tenant!r} must lie under its own model root "
                f"{tenant_root(model_dir, tenant)}/, reached without symlinks")
    return None


def check(store: Store, who: Principal, sources: list[str], model_dir: str) -> None:
    """403 "source_not_allowed" when a tenant-bound caller names a source not its tenant's."""
    if not who.bound:
        return
    policy = policies.load(store, who.tenant)
    allowed = policy.allowed_source_prefixes if policy is not None else None
    allow_pr = policy.allow_pr_revisions if policy is not None else False
    for source in sources:
        why = refusal(source, who.tenant, model_dir, allowed, allow_pr)
        if why:
            raise Forbidden(why, code="source_not_allowed")
