"""Full-batch training loops: reported as what they are, not as a missing DataLoader (issue 12
item 5).

A training loop not fed by a DataLoader gets a note that every process trains on the same
batches. For a loop that trains on the whole data set at every step (a graph model's forward
over all nodes; see :mod:`distify.analysis.full_batch`) that is correct as it is: every process
computes the same gradient, DDP averages equal gradients, and the result is one process's. Such
a loop gets a report line saying so instead of the note, and the report stays ready to launch.
Nothing is rewritten for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from distify.analysis.full_batch import is_full_batch
from distify.convert.base import TransformerBase
from distify.convert.driver import handles


@dataclass(slots=True)
class FullBatchState:
    """What :class:`FullBatchMixin` keeps while it walks one module (``self._full_batch``)."""

    #: the loops being visited, as written, innermost last
    loops: list[cst.For | cst.While] = field(default_factory=list)
    #: ids of the outermost loops of the nests already found full-batch (said once a nest)
    nests: set[int] = field(default_factory=set)


class FullBatchMixin(TransformerBase):
    _full_batch: FullBatchState

    @handles("visit_Module")
    def _full_batch_on_module(self, node: cst.Module) -> None:
        self._full_batch = FullBatchState()

    @handles("visit_For")
    def _full_batch_on_for(self, node: cst.For) -> None:
        self._full_batch.loops.append(node)

    @handles("leave_For")
    def _full_batch_after_for(self, original: cst.For, updated: cst.For):
        self._full_batch.loops.pop()
        return updated

    @handles("visit_While")
    def _full_batch_on_while(self, node: cst.While) -> None:
        self._full_batch.loops.append(node)

    @handles("leave_While")
    def _full_batch_after_while(self, original: cst.While, updated: cst.While):
        self._full_batch.loops.pop()
        return updated

    def _reported_full_batch(self, node: cst.CSTNode) -> bool:
        """At a backward pass in loops not fed by a DataLoader: if they train full-batch, say
        so (once per loop nest) and return True."""
        outermost = self._full_batch.loops[-len(self.ctx.loops)]  # this function's outermost loop
        if id(outermost) in self._full_batch.nests:
            return True
        if not is_full_batch(outermost, self._models_that_train(), self._qual) \
                or self._skipped("full-batch", node):  # then said as for any loop
            return False
        self._full_batch.nests.add(id(outermost))
        self._edit(node, "full-batch", "full-batch training: this loop is not fed by a "
                   "DataLoader and its model reads the same inputs at every step, so every "
                   "process trains on the whole data set. Their gradients are equal, so the "
                   "result equals one process's (the data is not split, and more processes add "
                   "no speed; the job's warning that the processes' batches are identical is "
                   "expected: DISTIFY_SAME_DATA=ok silences it)")
        return True

    def _models_that_train(self) -> set[str]:
        training = self.facts.training
        models = {model for optimizers in training.optimizer_models.values()
                  for trained in optimizers.values() for model in trained}
        models.update(site.name for site in training.build_sites)
        return models | self._scope.prepared_models
