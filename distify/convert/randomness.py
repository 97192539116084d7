"""Random draws every process must make alike: splits and orderings of the data set.

An unseeded ``random_split(dataset, [n_train, n_val])`` gives each process its own split, so
the training shards overlap and validation samples leak into training. Such draws are rewritten
to use the runtime's shared generator (the main process's, exactly the original draw there):

- ``random_split(ds, lengths)`` → ``random_split(ds, lengths, generator=rt.shared_generator())``;
- ``torch.randperm(len(...))`` outside loops likewise (a ``randperm`` of a batch, as mixup
  does, need not agree and is left alone).

Draws that take no generator (``np.random.permutation``, ``random.shuffle``,
``train_test_split`` without ``random_state=``) are reported, in set-up code of files that seed
nothing. What counts as such a draw is the ``random_splits`` rule category.
"""

from __future__ import annotations

import libcst as cst

from distify.analysis.draws import how_to_seed, must_agree, seeds_itself
from distify.convert.base import TransformerBase
from distify.convert.syntax import _EQUAL, _code

_SPACE = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))


class RandomnessMixin(TransformerBase):
    def _rewrite_random_draw(self, original: cst.Call, updated: cst.Call,
                             qual: str) -> cst.BaseExpression | None:
        entry = self.rules.match("random_splits", qual)
        if entry is None or self._main_only_depth or any(a.star for a in original.args):
            return None
        keywords = {a.keyword.value for a in original.args if a.keyword}
        positional = sum(1 for a in original.args if a.keyword is None)
        if seeds_itself(entry, keywords, positional):
            return None
        name = qual.rsplit(".", 1)[-1]
        if entry.get("seed_arg") == "generator":
            if not self._shares_generator(original, name, keywords):
                return None
            new = self._with_shared_generator(updated)
            self._edit(new, "shared-random", f"{name} draws from the main process's generator: "
                       "every process makes the same split (exactly the original one there)")
            return new
        if not (self.facts.seeds or self._loops or self._classes):
            self._edit(updated, "random-split", f"{name}(...) is unseeded: each process draws "
                       "its own, so they may split or order the data differently; "
                       f"{how_to_seed(entry)}", human=True)
        return None

    def _shares_generator(self, call: cst.Call, name: str, keywords: set[str]) -> bool:
        if name != "randperm":
            return True
        # A permutation of the data set's indices, built once: not a per-batch shuffle, and on
        # the CPU (a CUDA randperm needs a CUDA generator).
        return (not self._loops and not self._classes and "device" not in keywords
                and must_agree(name, bool(call.args) and "len(" in _code(call.args[0].value)))

    def _with_shared_generator(self, call: cst.Call) -> cst.Call:
        argument = cst.Arg(value=self._rt_call("shared_generator"),
                           keyword=cst.Name("generator"), equal=_EQUAL)
        args = list(call.args)
        last = args[-1]
        if isinstance(last.comma, cst.Comma):  # a trailing comma: the new argument takes it
            before = args[-2].comma if len(args) > 1 else _SPACE
            args[-1] = last.with_changes(comma=before if isinstance(before, cst.Comma)
                                         else _SPACE)
            argument = argument.with_changes(comma=last.comma)
        else:
            args[-1] = last.with_changes(comma=_SPACE)
        args.append(argument)
        new = call.with_changes(args=args)
        growth = len(_code(new)) - len(_code(call))
        if "\n" not in _code(call) and self._too_long(growth):
            return self._hanging(new)
        return new
