"""One object that validates all parallel degrees and owns the process groups (torchtitan's
``ParallelDims``), so no other module computes rank arithmetic.

Global rank = ((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank: TP fastest (inside a node
on a GPU cluster), PP slowest, as Megatron-LM orders them. A group's members ascend with global
rank, so ``cp_ranks[i]`` holds CP rank i and the dp_cp group rank of a rank is
dp_rank * cp + cp_rank.

The MoE layers regroup the same tp*cp*dp ranks of a pipeline stage (Megatron-LM's MoE parallel
folding, expert tensor parallel 1): a rank's place in its stage, in rank order, splits into an
expert-parallel rank (fastest, so an EP group is ``ep`` consecutive ranks) and an
expert-data-parallel rank (the ranks holding the same experts).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist


@dataclass
class ParallelDims:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    vp: int = 1
    world_size: int = 1
    ep: int = 1
    groups: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for k in ("tp", "pp", "dp", "cp", "vp", "ep"):
            if getattr(self, k) < 1:
                raise ValueError(f"{k}={getattr(self, k)} must be >= 1")
        if self.tp * self.pp * self.dp * self.cp != self.world_size:
            raise ValueError(f"tp*pp*dp*cp = {self.tp}*{self.pp}*{self.dp}*{self.cp} "
                             f"!= world size {self.world_size}")
        if self.stage_size % self.ep:
            raise ValueError(f"ep={self.ep} does not divide the {self.stage_size} ranks of a "
                             "pipeline stage (tp*cp*dp)")

    @property
    def stage_size(self) -> int:
        return self.tp * self.cp * self.dp

    def coords(self, rank: int) -> dict[str, int]:
        tp_rank, rest = rank % self.tp, rank // self.tp
        cp_rank, rest = rest % self.cp, rest // self.cp
        dp_rank, pp_rank = rest % self.dp, rest // self.dp
        return {"tp": tp_rank, "cp": cp_rank, "dp": dp_rank, "pp": pp_rank}

    def rank_of(self, tp: int = 0, cp: int = 0, dp: int = 0, pp: int = 0) -> int:
        return ((pp * self.dp + dp) * self.cp + cp) * self.tp + tp

    def _members(self, rank: int, varying: tuple[str, ...]) -> list[int]:
        """Ranks that share ``rank``'s coordinates except the ``varying`` dims."""
        me = self.coords(rank)
        return [r for r in range(self.world_size)
                if all(self.coords(r)[k] == me[k] for k in me if k not in varying)]

    def build_groups(self) -> None:
        """Create every group on every rank (``new_group`` is collective over the world): tp,
        cp (the ring of context parallel), dp, dp_cp (gradient reduction and the distributed
        optimizer, as Megatron-LM's data-parallel-with-context group) and stage (tp x cp x dp,
        every rank holding the same layers: the FP8 amax reduction). ``NAME_ranks`` holds each
        group's global ranks in group-rank order."""
        rank = dist.get_rank()
        for name, varying in (("tp", ("tp",)), ("cp", ("cp",)), ("dp", ("dp",)),
                              ("dp_cp", ("dp", "cp")), ("stage", ("tp", "dp", "cp"))):
            seen: set[tuple[int, ...]] = set()
            for r in range(self.world_size):
                members = tuple(self._members(r, varying))
                if members in seen:
                    continue
                seen.add(members)
                group = dist.new_group(list(members))
                if rank in members:
                    self.groups[name] = group
                    self.groups[name + "_ranks"] = members

    def expert_coords(self, rank: int) -> dict[str, int]:
        place = rank % self.stage_size
        return {"ep": place % self.ep, "edp": place // self.ep}

    def build_expert_groups(self) -> None:
        """The ``ep`` group (ranks of a stage exchanging tokens; group rank = EP rank) and the
        ``edp`` group (ranks of a stage holding the same experts; group rank = EDP rank).
        Collective over the world, like ``build_groups``."""
        rank = dist.get_rank()
        for name, shared in (("ep", "edp"), ("edp", "ep")):
            by_key: dict[tuple[int, int], list[int]] = {}
            for r in range(self.world_size):
                key = (r // self.stage_size, self.expert_coords(r)[shared])
                by_key.setdefault(key, []).append(r)
            for members in by_key.values():
                group = dist.new_group(members)
                if rank in members:
                    self.groups[name] = group
                    self.groups[name + "_ranks"] = tuple(members)

    def group(self, name: str):
        return self.groups[name]
