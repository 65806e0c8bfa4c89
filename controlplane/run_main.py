"""`make run`: bring the lab up, run the demo, stay in the foreground until Ctrl-C, tear down."""

from __future__ import annotations

import os
import signal
import sys
import time

from controlplane.lab.cluster import LabConfig, down, lab_state_dir, up
from controlplane.lab.demo import DemoError, run_demo


def main() -> int:
    if os.geteuid() != 0:
        print("make run builds network namespaces and loads BPF: run it as root", file=sys.stderr)
        return 2
    cfg = LabConfig(state_dir=lab_state_dir())
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    code = 0
    try:
        up(cfg)
        run_demo(cfg)
        print("Lab running. Press Ctrl-C to tear it down.")
        while not stop["now"] and not os.environ.get("FABRIC_LAB_EXIT_AFTER_DEMO"):
            time.sleep(0.5)
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
