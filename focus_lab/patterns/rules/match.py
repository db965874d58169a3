"""Token-match pairs: a distant pair (i, j) is also kept when ``ids[j - s] == ids[i]`` for a shift
s (docs/method.md §2.8); shift 1 is the induction pair, 0 the earlier occurrence itself.
``match`` (shifts 0 and 1, every match), ``match(shifts=[1],latest=16)`` (the nearest 16)."""

from __future__ import annotations

from dataclasses import dataclass

from focus_lab.patterns.rules import Rule, read_int, read_layers, write_layers

DEFAULT_SHIFTS = (0, 1)


def match_pairs(query_ids, key_ids, shifts, q_pos, k_pos, window: int, sinks: int = 0, latest: int = 0):
    """Token-match pairs (docs/method.md §2.8 [ours]) as a list: the distant pairs (i, j) with
    ``ids[j - s] == ids[i]`` for some s in ``shifts``. Shift 1 keeps the key right after an
    earlier occurrence of the query's token (the pair an induction head reads to copy), shift 0
    the earlier occurrence itself. With ``latest`` > 0 a query keeps only its ``latest``
    matching keys nearest to it.

    Args:
        query_ids: (B, Tq) long, the queries' token ids; key_ids: (B, Tk) long, the keys';
        shifts: token shifts >= 0; q_pos: (Tq,), k_pos: (Tk,) absolute positions, k_pos
            consecutive (a key's predecessor s tokens back is ``key_ids[:, j - s]``; none before
            the first key); window, sinks: in tokens (a pair is distant when ``q - k >= window``
            and ``k >= sinks``, ``core.distant_mask``); latest: 0 (every match) or the cap per query.
    Returns:
        (P, 3) long rows (b, i, j), i a query index, j a key index, sorted by (b, i, j).
    """
    import torch
    B, Tk = key_ids.shape
    m = torch.zeros(B, q_pos.numel(), Tk, dtype=torch.bool, device=key_ids.device)  # (B, Tq, Tk)
    for s in shifts:
        before = key_ids.new_full((B, Tk), -1)  # (B, Tk): before[j] = ids[j - s], -1 when unknown
        before[:, s:] = key_ids[:, :Tk - s]
        m |= query_ids[:, :, None] == before[:, None, :]
    pairs = m.nonzero()  # (P, 3) sorted by (b, i, j)
    qp, kp = q_pos[pairs[:, 1]], k_pos[pairs[:, 2]]
    pairs = pairs[(qp - kp >= window) & (kp >= sinks)]  # distant only
    if latest > 0 and pairs.shape[0]:
        row = pairs[:, 0] * q_pos.numel() + pairs[:, 1]  # (P,) ascending
        counts = torch.bincount(row, minlength=B * q_pos.numel())
        end = counts.cumsum(0)  # one past each row's last pair
        from_end = end[row] - 1 - torch.arange(pairs.shape[0], device=pairs.device)  # 0: nearest key
        pairs = pairs[from_end < latest]
    return pairs


def match_mask(query_ids, key_ids, shifts, q_pos, k_pos, window: int, sinks: int = 0, latest: int = 0):
    """``match_pairs`` as a (B, Tq, Tk) bool mask (same arguments)."""
    from focus_lab.method.core import pairs_mask
    pairs = match_pairs(query_ids, key_ids, shifts, q_pos, k_pos, window, sinks, latest)
    return pairs_mask(pairs, (key_ids.shape[0], q_pos.numel(), key_ids.shape[1]))


@dataclass(frozen=True)
class Match(Rule):
    """shifts: sorted token shifts; latest: keep only the nearest ``latest`` matches (0: all)."""

    shifts: tuple[int, ...] = DEFAULT_SHIFTS
    latest: int = 0
    name = "match"
    neutral = {"match_shifts": None, "match_latest": 0}
    modes = ("hard", "soft")
    example = "match(shifts=[0-1],latest=16)"
    owns_fields = True

    @classmethod
    def from_args(cls, args, kwargs):
        unknown = sorted(set(kwargs) - {"shifts", "latest"})
        if args or unknown:
            raise cls.error(f"takes only shifts=[...] and latest=N (got {', '.join(args + unknown)})")
        shifts = read_layers(cls, kwargs["shifts"]) if "shifts" in kwargs else DEFAULT_SHIFTS
        return cls(shifts, read_int(cls, kwargs.get("latest", "0"), "latest"))

    def arguments(self):
        out = [] if self.shifts == DEFAULT_SHIFTS else [f"shifts={write_layers(self.shifts)}"]
        return out + ([f"latest={self.latest}"] if self.latest else [])

    def changes(self):
        return {"match_shifts": list(self.shifts), "match_latest": self.latest}

    @classmethod
    def from_config(cls, config, top_k):
        if not config.match_shifts:
            return None
        return cls(tuple(sorted(set(config.match_shifts))), config.match_latest)

    def pairs(self, step):
        """Add the token-match pairs of the forward's token ids (built once per forward, shared by
        its layers). Raises RuntimeError: no ``input_ids`` reached the forward (called with
        ``inputs_embeds``, or through a submodule of the model that ``attach`` was given), or a
        decode step whose earlier tokens' ids are unknown."""
        import torch
        fwd, Tq, Tk = step.forward, step.query.shape[2], step.key.shape[2]
        got = fwd.shared.get(self.name)
        if got is None or got[0] != (Tq, Tk):
            ids = fwd.token_ids
            if ids is None or ids.shape[-1] != Tq:
                raise RuntimeError(
                    "token-match pairs (rule 'match', FocusConfig.match_shifts) need the token ids of each "
                    "forward: call the model that attach() was given (or its base_model) with input_ids= "
                    "(not inputs_embeds), or drop the rule (match_shifts=None)")
            seen = ids
            if Tq < Tk:
                past = fwd.cache.token_ids if fwd.cache is not None else None
                if past is None or past.shape[0] != ids.shape[0] or past.shape[1] < Tk - Tq:
                    raise RuntimeError(
                        f"match_shifts in a KV-cache step with {Tk - Tq} cached tokens, but the FocusCache "
                        f"holds {None if past is None else tuple(past.shape)} token ids: start generation "
                        "with a forward from position 0 through the same FocusCache")
                seen = torch.cat([past, ids], 1)  # (B, T_seen), T_seen >= Tk under a sliding-window cache
            if fwd.cache is not None:
                fwd.cache.token_ids = seen
            T = seen.shape[1]
            pos = torch.arange(T, device=ids.device)  # absolute positions of every token seen
            pairs = match_pairs(ids, seen, self.shifts, pos[T - Tq:], pos, step.config.window,
                                step.config.sink_tokens, self.latest)  # (P, 3) over every token seen
            if T > Tk:  # a sliding-window cache: keep the keys the layer holds, index them from its first
                pairs = pairs[pairs[:, 2] >= T - Tk]
                pairs[:, 2] -= T - Tk
            got = fwd.shared[self.name] = ((Tq, Tk), pairs)
        step.add(got[1])
