"""Reinforcement-learning environments, seeded per process (issue 12: data not from a
DataLoader).

An RL script's training data is what its environment produces. Seeded from the script's seed
(``env.reset(seed=args.seed)``, Gymnasium's API; ``env.action_space.seed(args.seed)``), every
process's environment starts from the same state; with the same weights (DDP) and the same torch
seed the processes then pick the same actions and play the same episodes: N processes train on
N copies of one episode. The seed becomes the script's seed plus the process's rank:

- ``env.reset(seed=args.seed)`` → ``env.reset(seed=args.seed + rt.rank())``;
- ``env.action_space.seed(s)`` / ``env.observation_space.seed(s)`` → ``(s + rt.rank())``.

In a single process the rank is 0: the original seed. A reset without a seed (or ``seed=None``)
is left alone: the environment seeds itself from the operating system, differently in each
process. A seed that already adds the rank is left alone (a second conversion).
"""

from __future__ import annotations

import libcst as cst

from distify.analysis.names import dotted_name
from distify.convert.base import TransformerBase
from distify.convert.syntax import _code

_SPACES = ("action_space", "observation_space")
#: expressions that need parentheses before `+ rank`
_LOOSE = (cst.IfExp, cst.BooleanOperation, cst.Comparison, cst.UnaryOperation, cst.Lambda,
          cst.NamedExpr)


class EnvironmentMixin(TransformerBase):
    def _rewrite_env_seed(self, original: cst.Call, updated: cst.Call) -> cst.Call | None:
        """``env.reset(seed=s)``, ``env.action_space.seed(s)``: seeded per process."""
        func = original.func
        if type(func) is not cst.Attribute:
            return None
        if func.attr.value == "reset":
            index = next((i for i, arg in enumerate(updated.args)
                          if arg.keyword is not None and arg.keyword.value == "seed"), None)
        elif func.attr.value == "seed" and type(func.value) is cst.Attribute \
                and func.value.attr.value in _SPACES and len(updated.args) == 1 \
                and updated.args[0].keyword is None and not updated.args[0].star:
            index = 0
        else:
            return None
        if index is None:
            return None
        seed = updated.args[index].value
        if (type(seed) is cst.Name and seed.value == "None") or self._adds_rank(seed):
            return None
        per_process = cst.BinaryOperation(
            left=seed.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            if isinstance(seed, _LOOSE) and not seed.lpar else seed,
            operator=cst.Add(), right=self._rt_call("rank"))
        args = list(updated.args)
        args[index] = args[index].with_changes(value=per_process)
        new = updated.with_changes(args=args)
        self._edit(new, "random-env", f"`{_code(original.func)}(...)` seeds the environment "
                   f"with the script's seed plus `{self.rt}.rank()`: each process plays its own "
                   "episodes, not a copy of the others' (world size 1: the original seed)")
        return new

    def _adds_rank(self, seed: cst.BaseExpression) -> bool:
        return type(seed) is cst.BinaryOperation and type(seed.right) is cst.Call \
            and dotted_name(seed.right.func) == f"{self.rt}.rank"
