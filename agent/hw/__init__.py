"""Host hardware the agent reads or changes: GPU inventory (NVML, nvidia-smi) and VFIO binding (sysfs).

Each real implementation sits beside a fake that behaves like the hardware (nvml_fake,
sysfs_fake) so tests and the lab run the same code paths without a GPU.
"""
