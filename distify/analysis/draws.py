"""Random draws every process must make alike (the ``random_splits`` rule category).

Shared by ``distify convert``, which rewrites or reports them, and ``distify check`` (DST304),
which reports them; each side looks at its own syntax tree and asks the same questions here.
"""

from __future__ import annotations

from distify.rules import Entry


def seeds_itself(entry: Entry, keywords: set[str], positional: int) -> bool:
    """Does a call of ``entry`` pass its own seed (``generator=``, ``random_state=``, or the
    seed's position among the positional arguments)?"""
    seed_arg, seed_pos = entry.get("seed_arg"), entry.get("seed_pos")
    return seed_arg in keywords or (isinstance(seed_pos, int) and positional > seed_pos)


def must_agree(name: str, first_arg_is_length: bool) -> bool:
    """Must every process draw alike? A ``randperm`` of a length permutes the data set; any
    other ``randperm`` (a batch's ``size(0)``, as mixup does) need not agree."""
    return name != "randperm" or first_arg_is_length


def how_to_seed(entry: Entry) -> str:
    """The advice for an unseeded call of ``entry``."""
    seed_arg = entry.get("seed_arg")
    if seed_arg == "generator":
        return ("pass generator=torch.Generator().manual_seed(<n>) (or "
                "distify.shared_generator())")
    if seed_arg:
        return f"pass {seed_arg}=<a fixed number>"
    return "seed every process with the same number first"
