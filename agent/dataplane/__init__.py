"""The XDP Maglev dataplane: BPF programs in dataplane/bpf/, driven from here.

    Dataplane        load/attach/update services (dataplane.py)
    ServiceView      what list_services/get_service return (views.py)
    Verdict          verdict codes mirrored from verdicts.h (verdicts.py)
"""

from agent.dataplane.dataplane import Dataplane
from agent.dataplane.verdicts import Verdict
from agent.dataplane.views import BackendView, ServiceView

__all__ = ["BackendView", "Dataplane", "ServiceView", "Verdict"]
