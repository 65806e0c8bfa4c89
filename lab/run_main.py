"""`make run`: bring the lab up, run the demo, stay in the foreground until Ctrl-C, tear down.

On a lab that is already up (another `make run`, or `fabric-lab up`) it attaches instead: it
shows the demo's objects as they stand and waits, and Ctrl-C leaves the lab running for whoever
started it; bringing it up again would wipe its store. While it waits it watches the lab's
processes, so a lab taken down elsewhere (`fabric-lab down`) ends it with a word rather than
leaving "Lab running" on the screen with nothing behind it.

Replicas run the real vLLM engine (CPU build, .venv-engine from scripts/setup-engine.sh) when it is
installed, else the engine simulator with the reason printed; FABRIC_LAB_ENGINE=sim|vllm chooses.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from lab import processes
from lab.cluster import LabConfig, LabIsUp, down, lab_state_dir, up
from lab.demo import DemoError, run_demo, show_state


def _wait(cfg: LabConfig, stop: dict) -> bool:
    """Until Ctrl-C/TERM (True) or until the lab's processes are gone (False)."""
    checked = time.monotonic()
    while not stop["now"] and not os.environ.get("FABRIC_LAB_EXIT_AFTER_DEMO"):
        time.sleep(0.5)
        if time.monotonic() - checked >= 2.0:
            checked = time.monotonic()
            if not processes.running(cfg.state_dir):
                print(f"\nthe lab's processes have stopped (was `fabric-lab down` run?); logs: {cfg.state_dir / 'logs'}",
                      file=sys.stderr)
                return False
    return True


def attach(cfg: LabConfig, stop: dict, signs: list[str]) -> int:
    print(f"The lab is already up ({'; '.join(signs)}): attaching to it, not starting another "
          "(that would wipe its deployments, endpoints, keys and tenants).")
    try:
        show_state(cfg)
        print("Attached. Press Ctrl-C to detach; the lab stays up (`fabric-lab down` stops it).")
        return 0 if _wait(cfg, stop) else 1
    except KeyboardInterrupt:
        return 0
    except DemoError as exc:
        print(f"\nerror: {exc}\nlogs: {cfg.state_dir / 'logs'}", file=sys.stderr)
        return 1
    finally:
        print("\ndetached; the lab is left as it was")


def lab_engine(echo=print) -> str:
    """FABRIC_LAB_ENGINE when set (sim or vllm), else vllm when it is installed."""
    from agent.settings import LabEngineSettings
    from agent.vm.lab_engine import engine_installed

    settings = LabEngineSettings.from_env(os.environ)
    if os.environ.get("FABRIC_LAB_ENGINE", "").strip():
        return settings.engine
    missing = engine_installed(settings.python)
    if missing:
        echo(f"lab: replicas run the engine simulator: the real engine is not installed ({missing})")
        return "sim"
    return "vllm"


def main() -> int:
    if os.geteuid() != 0:
        print("make run builds network namespaces and loads BPF: run it as root", file=sys.stderr)
        return 2
    cfg = LabConfig(state_dir=lab_state_dir(), engine=lab_engine())
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    try:
        up(cfg)
    except LabIsUp as exc:
        return attach(cfg, stop, exc.signs)
    except KeyboardInterrupt:
        code = 130
    except RuntimeError as exc:
        print(f"\nerror: {exc}\nlogs: {cfg.state_dir / 'logs'}", file=sys.stderr)
        code = 1
    else:
        code = 0
    try:
        if code == 0:
            run_demo(cfg)
            print("Lab running. Press Ctrl-C to tear it down.")
            code = 0 if _wait(cfg, stop) else 1
    except KeyboardInterrupt:
        pass
    except (DemoError, RuntimeError) as exc:
        print(f"\nerror: {exc}\nlogs: {cfg.state_dir / 'logs'}", file=sys.stderr)
        code = 1
    finally:
        print("\ntearing the lab down ...")
        for item in down(cfg):
            print(f"  removed {item}")
    return code


if __name__ == "__main__":
    sys.exit(main())
