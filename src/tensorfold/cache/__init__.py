"""Per-layer-kind caches: paged K/V for attention layers, state slots for Gated DeltaNet layers."""

from .kv_pool import KVPool, KVShape
from .state_pool import StatePool, StateSnapshot

__all__ = ["KVPool", "KVShape", "StatePool", "StateSnapshot", "ModelCaches"]


class ModelCaches:
    """The two pools of one model, addressed by the layer's index within its kind."""

    def __init__(self, kv: KVPool, states: StatePool) -> None:
        self.kv, self.states = kv, states

    def kv_layer(self, i: int):
        return self.kv.k[i], self.kv.v[i]

    def state_layer(self, i: int):
        return self.states.layer(i)
