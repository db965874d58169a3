"""Group capacity: a key whose first-choice group holds more than ``share`` of the first choices
so far moves to its second group, or with ``evict`` leaves every group (docs/method.md §2.9).
``capacity(0.5,layers=[13,15-16],evict)``; without ``layers`` every routed layer."""

from __future__ import annotations

from dataclasses import dataclass

from focus_lab.patterns.rules import Rule, read_layers, write_layers

OVERFLOWS = ("second", "evict")


@dataclass(frozen=True)
class Capacity(Rule):
    """share: in (1/num_groups, 1]; layers: sorted layer indices or None (every routed layer);
    overflow: "second" or "evict"."""

    share: float = 0.5
    layers: tuple[int, ...] | None = None
    overflow: str = "second"
    name = "capacity"
    neutral = {"group_capacity": 0.0, "capacity_layers": None, "capacity_overflow": "second",
               "capacity_top_k": None}
    assignments = ("router",)  # it splits the router's groups; random and shuffled ones are balanced
    example = "capacity(0.5,layers=[13,15-16],evict)"

    @classmethod
    def from_args(cls, args, kwargs):
        share, overflow = 0.5, "second"
        for a in args:
            if a in OVERFLOWS:
                overflow = a
            else:
                try:
                    share = float(a)
                except ValueError:
                    raise cls.error(f"cannot read {a!r}: give a share such as 0.5, and 'evict' or 'second'") from None
        unknown = sorted(set(kwargs) - {"layers", "overflow", "share"})
        if unknown:
            raise cls.error(f"takes share, layers=[...] and evict|second (got {', '.join(unknown)})")
        if "share" in kwargs:
            share = float(kwargs["share"])
        overflow = kwargs.get("overflow", overflow)
        if overflow not in OVERFLOWS:
            raise cls.error(f"overflow {overflow!r}: choose {' or '.join(OVERFLOWS)}")
        layers = read_layers(cls, kwargs["layers"]) if "layers" in kwargs else None
        return cls(share, layers, overflow)

    def arguments(self):
        out = [f"{self.share:g}"]
        if self.layers is not None:
            out.append(f"layers={write_layers(self.layers)}")
        return out + (["evict"] if self.overflow == "evict" else [])

    def changes(self):
        return {"group_capacity": float(self.share), "capacity_layers": None if self.layers is None else list(self.layers),
                "capacity_overflow": self.overflow, "capacity_top_k": None}

    @classmethod
    def from_config(cls, config, top_k):
        if top_k is None or not config.replace(top_k=top_k).capacity_for_top_k():
            return None
        layers = None if config.capacity_layers is None else tuple(sorted(set(config.capacity_layers)))
        return cls(float(config.group_capacity), layers, config.capacity_overflow)

    def check(self, num_groups, num_layers):
        if not 1 / num_groups < self.share <= 1:
            raise self.error(f"share {self.share:g} is outside (1/num_groups, 1] = ({1 / num_groups:.3g}, 1]")
        self.check_layers(self.layers or (), num_layers)
