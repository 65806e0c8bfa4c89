"""The dataplane's BPF C sources (dataplane/bpf/), shipped as package data.

The agent compiles them (agent/dataplane/loader.py); in a checkout they are read in place, in an
installed wheel from the unpacked package, with no link between the two.
"""

from importlib import resources
from pathlib import Path

BPF_DIR = Path(str(resources.files(__name__).joinpath("bpf")))
