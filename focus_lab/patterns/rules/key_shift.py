"""Key shift: a key lives in the top-1 group of the token before it (docs/method.md §1.7), so a
query meets the key after an earlier occurrence of its own token. ``key_shift``."""

from __future__ import annotations

from dataclasses import dataclass

from focus_lab.patterns.rules import Rule


def shift_keys(x, first=None):
    """The key role under the key shift (docs/method.md §1.7 [ours]): key j takes what token
    j - 1 has (its top-1 group, its Sinkhorn probabilities).

    x: (B, T, ...) per-token values of this forward's tokens; first: (B, 1, ...) the value of the
    token before x[:, 0] (a KV-cache step: the carried state of the step before), or None at
    position 0, where the first token keeps its own. Returns (B, T, ...)."""
    import torch
    head = x[:, :1] if first is None else first.to(x.dtype)  # (B, 1, ...)
    return torch.cat([head, x[:, :-1]], 1)  # (B, T, ...)


@dataclass(frozen=True)
class KeyShift(Rule):
    name = "key_shift"
    neutral = {"key_shift": 0}
    modes = ("hard", "soft")
    example = "key_shift"
    owns_fields = True
    order = 20  # after the capacity: the capacity moves a token's own key, the shift then hands it on

    def changes(self):
        return {"key_shift": 1}

    @classmethod
    def from_config(cls, config, top_k):
        return cls() if config.key_shift else None

    def route(self, step):
        """Each key takes its predecessor's group and probabilities; the last token's own group
        is carried to the next KV-cache step (B, 1) long."""
        lpk = step.key_log_p if step.key_log_p is not None else step.log_p  # (B, T, K) or None
        step.carry[self.name] = step.key_group[:, -1:]  # (B, 1)
        step.key_group = shift_keys(step.key_group, step.carried.get(self.name))  # (B, T)
        step.key_log_p = None if lpk is None else shift_keys(lpk)

    def soft_keys(self, log_p_keys):
        return shift_keys(log_p_keys)
