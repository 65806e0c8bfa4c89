"""One writer process for the race test: opens the pinned maps and puts services.

    argv: pin_dir first_vip_octet count
"""

from __future__ import annotations

import sys

from agent.dataplane import Dataplane


def main() -> None:
    pin_dir, first, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    dp = Dataplane(pin_dir=pin_dir, flow_entries=65536)
    print("ready", flush=True)
    sys.stdin.readline()  # both processes start writing together
    for i in range(count):
        dp.put_service(f"10.9.{first + i}.1", 80, "tcp", {f"10.1.{first + i}.10:8080": 1, "10.1.0.99:8080": 2})
    print("done", flush=True)


if __name__ == "__main__":
    main()
