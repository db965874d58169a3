"""Group capacity: a key whose first-choice group holds more than ``share`` of the first choices
so far moves to its second group, or with ``evict`` leaves every group (docs/method.md §2.9).
``capacity(0.5,layers=[13,15-16],evict)``; without ``layers`` every routed layer."""

from __future__ import annotations

from dataclasses import dataclass

from focus_lab.patterns.rules import Rule, read_layers, write_layers

OVERFLOWS = ("second", "evict")


def capacity_key_group(logits, key_group, capacity: float, start: int, warmup: int, prev_counts=None,
                       overflow: str = "second"):
    """The group capacity rule (docs/method.md §2.9 [ours]).

    Position ``p = start + t``'s first choice is ``key_group[:, t]`` (the top-1 of ``logits``);
    ``n_g(p)`` counts the first choices equal to g among positions 0..p. When ``p >= warmup``
    and ``n_{key_group}(p) > capacity * (p + 1)``, the key moves to its second-best group of
    ``logits`` (``overflow="second"``) or to no group (``"evict"``: group id K, which no query
    picks, so only the window, the sinks and token-match pairs keep it). Counting first choices,
    not final groups, keeps the rule causal and parallel over positions: a KV-cache step
    continues from ``prev_counts``.

    Args:
        logits: (B, T, K) the key role's ``S / tau + group_bias`` (``core.hard_logits``);
            key_group: (B, T) long, its top-1; capacity: share in (1/K, 1]; start: absolute
            position of the first token; warmup: positions below it never move (tokens; the
            local window); prev_counts: (B, K) first-choice counts of positions 0..start-1 (None:
            zeros, only when ``start == 0``); overflow: "second" or "evict".
    Returns:
        key_group: (B, T) long in 0..K-1 (0..K with "evict"); counts: (B, K) long, the
        first-choice counts of 0..start+T-1.
    Raises:
        RuntimeError: ``start > 0`` without ``prev_counts`` (a decode step whose earlier first
            choices are unknown).
    """
    import torch
    B, T, K = logits.shape
    if prev_counts is None:
        if start > 0:
            raise RuntimeError(f"group capacity: a forward from position {start} without the first-choice "
                               "counts of the positions before it: start with a forward from position 0 "
                               "through the same FocusCache")
        prev_counts = torch.zeros(B, K, dtype=torch.long, device=logits.device)
    one_hot = key_group[..., None] == torch.arange(K, device=logits.device)  # (B, T, K); F.one_hot checks its range: a host sync
    counts = prev_counts.to(logits.device)[:, None] + one_hot.long().cumsum(1)  # (B, T, K)
    pos = torch.arange(start, start + T, device=logits.device)  # (T,) absolute positions
    held = counts.gather(2, key_group[..., None])[..., 0]  # (B, T) first choices of this key's group so far
    over = (held > capacity * (pos + 1)) & (pos >= warmup)  # (B, T)
    if overflow == "evict":  # no host sync on whether any key moves: a decode step stays on the device
        key_group = torch.where(over, torch.full_like(key_group, K), key_group)  # K: no group
    elif K > 1:
        second = logits.topk(2, dim=-1).indices[..., 1]  # (B, T)
        key_group = torch.where(over, second, key_group)
    return key_group, counts[:, -1]


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
    owns_fields = True
    order = 10

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

    def route(self, step):
        """Move the keys over the capacity (hard mode, router groups, layers with k >= 1 in
        ``layers``); the first-choice counts (B, K) long are carried to the next KV-cache step."""
        if (step.config.mode != "hard" or step.assignment != "router" or step.top_k == 0
                or (self.layers is not None and step.layer_idx not in self.layers)):
            return
        step.key_group, step.carry[self.name] = capacity_key_group(
            step.key_logits(), step.key_group, self.share, step.start, step.config.window,
            step.carried.get(self.name), self.overflow)
