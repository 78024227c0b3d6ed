"""A new replica's time-to-ready built from the phases the operator measures (time_to_ready.py), for the simulator.

`schedule` (a node is free in the pool: seconds) + `image` (the engine image pulled from a registry, or 0
when pre-pulled on the node) + `start` (container created: seconds) + `load` (the weights each node holds
read from where they are, plus the engine's initialisation: CUDA graphs, compilation caches, warm-up).

The weights one node reads are what its GPUs hold (`plan.weightsGiBPerGPU x gpusPerNode`), read at the
source's bandwidth per node. Sources (nominal bandwidth per node; each replica draws 0.8-1.2x of it):

* `cache` — a node-local copy on NVMe (the model cache resource) and the image pre-pulled: 8 GB/s (a GPU
  node's NVMe RAID reads well over 10 GB/s raw; safetensors loading into GPU memory reaches a part of that);
* `pvc` — a network volume (NFS / CephFS / a parallel file system over 25-100 GbE): 2 GB/s, and the image
  pulled from a registry (8 GB at 0.1 GB/s, unpacking included);
* `hub` — the Hugging Face Hub, downloaded by the engine at start: 0.5 GB/s, and the image pulled.

These bandwidths are assumptions, not measurements: the operator's `status.timeToReady` measures the real
phases of a running fleet (and `--cold-start` replaces the whole with one number).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from m3fleet.api.models import Plan

GIB = 1024**3 / 1e9  # GB per GiB
JITTER = (0.8, 1.2)  # each replica's bandwidth and engine init vary this much around the nominal


@dataclass(frozen=True)
class Source:
    name: str
    description: str
    weights_gb_per_second: float
    image_pre_pulled: bool


SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source("cache", "node-local NVMe copy (model cache), image pre-pulled", 8.0, True),
        Source("pvc", "network PVC, image pulled from a registry", 2.0, False),
        Source("hub", "Hugging Face Hub download at start, image pulled from a registry", 0.5, False),
    )
}
IMAGE_GB = 8.0
REGISTRY_GB_PER_SECOND = 0.1
SCHEDULE_SECONDS = (2.0, 10.0)  # a free node in the pool (no node provisioning)
START_SECONDS = (1.0, 5.0)
ENGINE_INIT_SECONDS = (40.0, 90.0)  # after the weights: CUDA graphs, compile caches, warm-up
EXTRA_NODE_SECONDS = 15.0  # a multi-node group: rendezvous of its ranks (NCCL init) per extra node


@dataclass(frozen=True)
class ColdStartModel:
    source: Source
    weights_gb_per_node: float
    nodes: int

    @classmethod
    def of(cls, source: str, plan: Plan) -> ColdStartModel:
        """Raises KeyError for an unknown source."""
        gb = plan.weights_gib_per_gpu * plan.gpus_per_node * GIB
        return cls(SOURCES[source], gb, plan.nodes_per_replica)

    def phases(self, rng: random.Random) -> dict[str, float]:
        """One replica's phases (seconds), drawn."""
        low, high = JITTER
        image = 0.0 if self.source.image_pre_pulled else IMAGE_GB / (REGISTRY_GB_PER_SECOND * rng.uniform(low, high))
        read = self.weights_gb_per_node / (self.source.weights_gb_per_second * rng.uniform(low, high))
        init = rng.uniform(*ENGINE_INIT_SECONDS) + EXTRA_NODE_SECONDS * (self.nodes - 1)
        return {
            "schedule": rng.uniform(*SCHEDULE_SECONDS),
            "image": image,
            "start": rng.uniform(*START_SECONDS),
            "load": read + init,
        }

    def draw(self, rng: random.Random) -> float:
        return sum(self.phases(rng).values())

    def bounds(self) -> tuple[float, float]:
        """The shortest and the longest time-to-ready the model can draw."""

        def total(end: int, speed: float) -> float:
            image = 0.0 if self.source.image_pre_pulled else IMAGE_GB / (REGISTRY_GB_PER_SECOND * speed)
            read = self.weights_gb_per_node / (self.source.weights_gb_per_second * speed)
            fixed = SCHEDULE_SECONDS[end] + START_SECONDS[end] + ENGINE_INIT_SECONDS[end]
            return fixed + image + read + EXTRA_NODE_SECONDS * (self.nodes - 1)

        return total(0, JITTER[1]), total(1, JITTER[0])

    def describe(self) -> dict[str, Any]:
        low, high = self.bounds()
        return {
            "source": self.source.name,
            "description": self.source.description,
            "weightsGBPerNode": round(self.weights_gb_per_node, 1),
            "weightsGBPerSecondPerNode": self.source.weights_gb_per_second,
            "image": "pre-pulled"
            if self.source.image_pre_pulled
            else f"{IMAGE_GB:g} GB at {REGISTRY_GB_PER_SECOND:g} GB/s",
            "scheduleSeconds": list(SCHEDULE_SECONDS),
            "engineInitSeconds": list(ENGINE_INIT_SECONDS),
            "jitter": list(JITTER),
            "low": round(low),
            "high": round(high),
        }
