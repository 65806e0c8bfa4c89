"""Imported at start by every Python process of the lab's real engine (the launcher puts this
folder first on PYTHONPATH): ask Linux for the AMX tile state, as agent/vm/vllm_launcher.py explains.

Linux grants AMX only to a process that asks (arch_prctl ARCH_REQ_XCOMP_PERM), and the grant does
not survive exec, so vLLM's spawned EngineCore and worker must each ask. A CPU or kernel without
AMX refuses (EINVAL) and nothing changes.
"""

import ctypes
import platform
import sys

SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 158, 0x1023, 18  # x86-64 Linux

if sys.platform == "linux" and platform.machine() == "x86_64":
    try:
        ctypes.CDLL(None, use_errno=True).syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
    except (OSError, AttributeError):
        pass
