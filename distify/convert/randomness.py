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

Draws that define the task, in a file that seeds nothing: ``W_target = torch.randn(4, 1) * 5``
at import time (pytorch/examples' regression), a synthetic data set ``TensorDataset(
torch.randn(40, 3), ...)``. Each process would draw its own: they learn different tasks (or
shard different data sets), and a stop test on the reduced loss may never hold. In set-up code
of a file that trains (outside loops and classes, not in a batch function),
``torch.randn/rand/randint/normal(...)``
→ ``...(..., generator=rt.shared_generator())``: the main process's draw on every process,
exactly the original draw in a single process. One with ``device=`` (a CUDA draw needs a CUDA
generator) and the NumPy and ``random`` draws are reported instead. Not done in a file that
seeds (every process then draws alike already); a draw in a function that only some processes
call would need every process to call it, as ``shared_generator`` says.

Draws every process must make *differently*: the batches a script samples itself, and the noise
of a training loop. Every rank runs the script's seed, so they would come out alike and N
processes train on the same batches. Which draws these are is found over the whole module
(:mod:`distify.analysis.draws_flow`); each then draws from a generator of its own process
(exactly the original draw in a single process):

- in a batch function (nanoGPT's ``get_batch``, called where the model trains or is evaluated):
  ``torch.randint(n, (b,))`` → ``torch.randint(n, (b,), generator=rt.data_generator())``,
  ``np.random.randint(...)`` → ``rt.numpy_random().randint(...)``, ``random.sample(...)`` →
  ``rt.python_random().sample(...)``; the loop's note about a missing DataLoader goes away;
- ``torch.randn/rand/randint/normal(...)`` in a training loop (a GAN's latent noise) likewise,
  with the draw's ``device=`` passed on (``rt.data_generator(device)``: a CUDA draw needs a CUDA
  generator); not the draws outside training loops (initialisation, ``fixed_noise``);
- ``losses.mean()`` after an evaluation loop over such batches (nanoGPT's ``estimate_loss``)
  → ``rt.reduce(losses.mean(), op="mean")``, so every process agrees on it (``best_val_loss``).
"""

from __future__ import annotations

import libcst as cst

from distify.analysis.draws import (
    TORCH_LOOP_DRAWS,
    counts_the_data,
    draw_family,
    how_to_seed,
    must_agree,
    seeds_itself,
)
from distify.analysis.draws_flow import DrawFlow, find_draw_flow
from distify.convert.base import TransformerBase
from distify.convert.driver import handles
from distify.convert.syntax import _EQUAL, _code

_SPACE = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))


_UNSEEDED = ("`{}` is drawn in set-up code of a script that seeds nothing: each process "
             "draws its own value, so if it defines the task (a target, a synthetic data set) "
             "the processes learn different ones")
_PER_PROCESS = ("batches drawn per process: each process draws its own random batches (world "
                "size 1: the original draws)")


class RandomnessMixin(TransformerBase):
    @handles("visit_Module")
    def _randomness_on_module(self, node: cst.Module) -> None:
        self.ctx.draw_flow = (find_draw_flow(node, self.facts.imports)
                           if self.facts.may_draw_batches else None)

    def _fed_by_draws(self) -> bool:
        """Is the backward being rewritten in a loop whose batches a batch function draws?"""
        flow = self.ctx.draw_flow
        return flow is not None and id(self.ctx.leaving) in flow.fed_backwards

    def _randomness_may_call(self, qual: str) -> bool:
        """Can :meth:`_rewrite_random_draw` act on a call of ``qual``, unless the draw flow
        marked that very call (see :meth:`_randomness_marked`)?"""
        return qual in TORCH_LOOP_DRAWS or draw_family(qual) is not None \
            or self.rules.match("random_splits", qual) is not None

    def _randomness_marked(self, call: cst.Call) -> bool:
        """Did the draw flow pick this call out (a per-process draw, an estimate to average)?"""
        flow = self.ctx.draw_flow
        key = id(call)
        return flow is not None and (key in flow.eval_means or key in flow.batch_draws
                                     or key in flow.loop_draws)

    def _rewrite_random_draw(self, original: cst.Call, updated: cst.Call,
                             qual: str) -> cst.BaseExpression | None:
        flow = self.ctx.draw_flow
        if flow is not None and not any(a.star for a in original.args):
            per_process = self._draw_per_process(flow, original, updated, qual)
            if per_process is not None:
                return per_process
        task = self._share_task_draw(original, updated, qual)
        if task is not None:
            return task
        entry = self.rules.match("random_splits", qual)
        if entry is None or self.ctx.main_only_depth or any(a.star for a in original.args):
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
        if not (self.facts.seeds or self.ctx.loops or self.ctx.classes):
            self._edit(updated, "random-split", f"{name}(...) is unseeded: each process draws "
                       "its own, so they may split or order the data differently; "
                       f"{how_to_seed(entry)}", human=True)
        return None

    def _draw_per_process(self, flow: DrawFlow, original: cst.Call, updated: cst.Call,
                          qual: str) -> cst.BaseExpression | None:
        key = id(original)
        if key in flow.eval_means:
            if self.ctx.main_only_depth:
                return None  # a collective on one process would wait forever
            what = _code(original)
            new = cst.Call(func=self._rt_attr("reduce"), args=[
                cst.Arg(updated, comma=_SPACE),
                cst.Arg(cst.SimpleString('"mean"'), keyword=cst.Name("op"), equal=_EQUAL)])
            self._edit(new, "reduce", f"`{what}` averaged over all processes "
                       f"(`{self.rt}.reduce(..., op=\"mean\")`): each estimates it from its own "
                       "random batches, and all agree on it (a best loss, a checkpoint)")
            return new
        family = flow.batch_draws.get(key)
        in_loop = key in flow.loop_draws
        if family is None and not in_loop:
            return None
        name = qual.rsplit(".", 1)[-1]
        if family in ("numpy", "python"):
            func = original.func
            if type(func) is cst.Attribute and type(func.value) is cst.Call:
                return None  # `rt.numpy_random().randint(...)`: converted already
            helper = "numpy_random" if family == "numpy" else "python_random"
            new = updated.with_changes(func=cst.Attribute(value=self._rt_call(helper),
                                                          attr=cst.Name(name)))
            self._edit(new, "random-batches", f"{_PER_PROCESS}: `{_code(original.func)}` draws "
                       f"from `{self.rt}.{helper}()`")
            return new
        device = next((a.value for a in updated.args if a.keyword
                       and a.keyword.value == "device"), None)
        generator = self._rt_call("data_generator",
                                  *([device.deep_clone()] if device is not None else []))
        new = self._with_generator(updated, generator)
        if family is not None:
            self._edit(new, "random-batches", f"{_PER_PROCESS}: `{name}` draws from "
                       f"`{self.rt}.data_generator()`")
        else:
            self._edit(new, "random-noise", f"`{name}` in the training loop draws from "
                       f"`{self.rt}.data_generator()`: each process draws its own (with the "
                       "script's seed they would be alike on every process; world size 1: the "
                       "original draws)")
        return new

    def _share_task_draw(self, original: cst.Call, updated: cst.Call,
                         qual: str) -> cst.BaseExpression | None:
        """A draw in the set-up code of a file that seeds nothing (``W_target =
        torch.randn(4, 1) * 5``) defines what is learnt: every process must draw the same."""
        if self.facts.seeds or not self.facts.training.backward_scopes or self.ctx.loops \
                or self.ctx.classes or self.ctx.main_only_depth \
                or any(a.star for a in original.args):
            return None  # a file that trains nothing has no task to agree on
        keywords = {a.keyword.value for a in original.args if a.keyword}
        name = _code(original.func)
        if qual in TORCH_LOOP_DRAWS:
            if "generator" in keywords:
                return None
            if "device" in keywords:  # a CUDA draw needs a CUDA generator: not the shared one
                self._edit(updated, "random-task", f"{_UNSEEDED.format(name)}; seed every "
                           "process with the same number first, or draw it on the CPU",
                           human=True)
                return None
            new = self._with_shared_generator(updated)
            self._edit(new, "shared-random", f"`{name}` draws from the main process's "
                       f"generator (`{self.rt}.shared_generator()`): the script seeds nothing, "
                       "so each process would draw its own value and learn a different task "
                       "(world size 1: the original draw)")
            return new
        if draw_family(qual) in ("numpy", "python") \
                and self.rules.match("random_splits", qual) is None:
            self._edit(updated, "random-task", f"{_UNSEEDED.format(name)}; seed every process "
                       "with the same number first (or draw it on the main process and "
                       f"`{self.rt}.broadcast_object` it)", human=True)
        return None

    def _shares_generator(self, call: cst.Call, name: str, keywords: set[str]) -> bool:
        if name != "randperm":
            return True
        # A permutation of the data set's indices, built once: not a per-batch shuffle, and on
        # the CPU (a CUDA randperm needs a CUDA generator).
        return (not self.ctx.loops and not self.ctx.classes and "device" not in keywords
                and must_agree(name, bool(call.args)
                               and counts_the_data(_code(call.args[0].value))))

    def _with_shared_generator(self, call: cst.Call) -> cst.Call:
        return self._with_generator(call, self._rt_call("shared_generator"))

    def _with_generator(self, call: cst.Call, generator: cst.BaseExpression) -> cst.Call:
        argument = cst.Arg(value=generator, keyword=cst.Name("generator"), equal=_EQUAL)
        args = list(call.args)
        if not args:
            return call.with_changes(args=[argument])
        last = args[-1]
        if type(last.comma) is cst.Comma:  # a trailing comma: the new argument takes it
            before = args[-2].comma if len(args) > 1 else _SPACE
            args[-1] = last.with_changes(comma=before if type(before) is cst.Comma
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
