"""GPU sharing: catalog of GPU kinds and MIG geometry, MIG layout search, slots with hard memory accounting, packers.

Depends on the standard library only (never on autoscaler/, kubernetes or aiohttp):
the decision core imports this, never the other way round.
"""

from sharing.catalog import Catalog, GpuModel, MigProfile, load_catalog
from sharing.cluster import ClusterSpecError, nodes_from_spec
from sharing.packer import FirstFitPacker, Packer, place_batch
from sharing.slots import AllocationError, DeviceState, Inventory, NodeSpec, Slot, SlotKind, SlotRequest

__all__ = [
    "AllocationError",
    "Catalog",
    "ClusterSpecError",
    "DeviceState",
    "FirstFitPacker",
    "GpuModel",
    "Inventory",
    "MigProfile",
    "NodeSpec",
    "Packer",
    "Slot",
    "SlotKind",
    "SlotRequest",
    "load_catalog",
    "nodes_from_spec",
    "place_batch",
]
