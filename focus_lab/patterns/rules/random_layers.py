"""Random-group layers: routed layers whose groups are balanced random groups instead of the
router's (docs/method.md §2.6). ``random_layers([1-9])``."""

from __future__ import annotations

from dataclasses import dataclass

from focus_lab.patterns.rules import Rule, read_layers, write_layers


@dataclass(frozen=True)
class RandomLayers(Rule):
    """layers: (layer_idx, ...) sorted."""

    layers: tuple[int, ...] = ()
    name = "random_layers"
    neutral = {"random_layers": []}
    modes = ("hard", "soft")
    assignments = ("router", "shuffled")  # under random groups every layer is random already
    example = "random_layers([1-9])"
    owns_fields = True

    @classmethod
    def from_args(cls, args, kwargs):
        given = args + [v for k, v in kwargs.items() if k == "layers"]
        if len(given) != 1 or set(kwargs) - {"layers"}:
            raise cls.error("needs one list of layers")
        return cls(read_layers(cls, given[0]))

    def arguments(self):
        return [write_layers(self.layers)]

    def changes(self):
        return {"random_layers": list(self.layers)}

    @classmethod
    def from_config(cls, config, top_k):
        return cls(tuple(sorted(set(config.random_layers)))) if config.random_layers else None

    def check(self, num_groups, num_layers):
        self.check_layers(self.layers, num_layers)

    def assignment_at(self, layer_idx, assignment):
        return "random" if layer_idx in self.layers else assignment
