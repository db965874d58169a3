"""Per-layer k: some layers join more or fewer groups than the pattern's top-k at the same mean
sparsity (docs/method.md §2.7). ``layer_top_k(1=[0,5-6],3=[1-4])``: k = 1 in layers 0, 5, 6 and
k = 3 in layers 1-4; the other layers at the pattern's k. k = 0 keeps only the window and sinks."""

from __future__ import annotations

from dataclasses import dataclass

from focus_lab.patterns.rules import Rule, read_layers, write_layers


@dataclass(frozen=True)
class LayerTopK(Rule):
    """budget: ((k, (layer_idx, ...)), ...), k ascending, each layer once."""

    budget: tuple[tuple[int, tuple[int, ...]], ...] = ()
    name = "layer_top_k"
    neutral = {"layer_top_k": {}}
    example = "layer_top_k(1=[0,5-6],3=[1-4])"
    owns_fields = True

    @classmethod
    def from_mapping(cls, mapping: dict[int, int], top_k: int | None = None) -> "LayerTopK | None":
        """{layer_idx: k} -> the rule, entries equal to ``top_k`` dropped; None when none is left."""
        by_k: dict[int, list[int]] = {}
        for layer, k in mapping.items():
            if k != top_k:
                by_k.setdefault(int(k), []).append(int(layer))
        return cls(tuple((k, tuple(sorted(v))) for k, v in sorted(by_k.items()))) if by_k else None

    def mapping(self) -> dict[int, int]:
        """{layer_idx: k}, built once per rule value (``top_k_at`` reads it in every routed layer)."""
        got = self.__dict__.get("_mapping")
        if got is None:
            got = {layer: k for k, layers in self.budget for layer in layers}
            object.__setattr__(self, "_mapping", got)
        return got

    @classmethod
    def from_args(cls, args, kwargs):
        if args or not kwargs:
            raise cls.error("needs K=[LAYERS] arguments")
        out: dict[int, int] = {}
        for k, layers in kwargs.items():
            if not k.isdigit():
                raise cls.error(f"cannot read k {k!r}: write K=[LAYERS] with K an integer >= 0")
            for layer in read_layers(cls, layers):
                if layer in out:
                    raise cls.error(f"gives layer {layer} two values of k")
                out[layer] = int(k)
        return cls.from_mapping(out)

    def arguments(self):
        return [f"{k}={write_layers(layers)}" for k, layers in self.budget]

    def changes(self):
        return {"layer_top_k": dict(self.mapping())}

    @classmethod
    def from_config(cls, config, top_k):
        if top_k is None:
            return None
        return cls.from_mapping(config.replace(top_k=top_k).layer_top_k_in_force(), top_k)

    def check(self, num_groups, num_layers):
        for k, layers in self.budget:
            if k > num_groups:
                raise self.error(f"sets k = {k} above num_groups = {num_groups} (k in 0..{num_groups})")
        self.check_layers(sorted(self.mapping()), num_layers)

    def top_k_at(self, layer_idx, top_k):
        return self.mapping().get(layer_idx, top_k)
