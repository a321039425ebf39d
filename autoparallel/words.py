"""Counts in words: "1 job", "2 jobs", never "1 job(s)"."""

from __future__ import annotations


def plural(count: int, noun: str) -> str:
    """``count`` and ``noun``, its last word plural unless the count is one: plural(1, "Slurm job")
    is "1 Slurm job", plural(3, "node") "3 nodes" (nouns that take a plain -s only)."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"
