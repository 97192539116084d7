"""Token streams trained on by BPTT (batchify) are split over the processes.

word_language_model-style scripts train without a DataLoader: ``batchify(corpus.train, bsz)``
lays the token stream out in ``bsz`` columns and the training loop slices windows along time.
Every rank would train on the same windows. Where :mod:`distify.analysis.bptt_flow` proves that
a batchify result only feeds training, its data argument goes through the runtime first:

- ``train_data = batchify(corpus.train, args.batch_size)`` →
  ``train_data = batchify(rt.shard_stream(corpus.train, args.batch_size), args.batch_size)``:
  each process trains on its own contiguous 1/N of the stream, in the script's ``bsz`` columns
  (so ``model.init_hidden(bsz)`` still fits); together they are the ``N × bsz`` columns one
  process would cut, so the global batch is N × ``bsz`` (the batch-size line of the report
  names ``bsz``); every process takes the same number of steps, and a single process gets the
  whole stream, exactly as before. The batch size is passed on only when reading it twice is
  harmless (a name, an attribute, a number); otherwise the shares are still contiguous and
  equal, only not cut at whole rows;
- the training loop it feeds no longer gets the note that it is not fed by a DataLoader.

What it deliberately does not do:

- split a stream that is not trained on (validation, test): every process evaluates all of it
  with the same weights, so the evaluation is the single-process value on every process, with
  no collective to add (exact, not faster); the report says so;
- split a stream trained on that is also used otherwise (``evaluate(train_data)``, a method
  called on it): that use may need the whole stream, so the batchify call is reported with
  what it cannot follow, and left as written;
- follow streams stored on attributes, batchify functions from other modules, or batches cut
  from the stream any other way than by slicing (those loops keep the DataLoader note).
"""

from __future__ import annotations

import libcst as cst

from distify.analysis.bptt_flow import find_streams
from distify.analysis.names import dotted_name
from distify.convert.base import TransformerBase
from distify.convert.driver import handles
from distify.convert.syntax import _code, _join


class StreamShardMixin(TransformerBase):
    @handles("visit_Module")
    def _bptt_on_module(self, node: cst.Module) -> None:
        self.ctx.stream_flow = find_streams(node) if self.facts.may_batchify else None

    def _fed_by_stream(self) -> bool:
        """Is the backward being rewritten in a loop that slices a sharded stream?"""
        flow = self.ctx.stream_flow
        return flow is not None and id(self.ctx.leaving) in flow.fed_backwards

    def _shard_stream_call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        """Called for every call left: a batchify call of a training stream gets its data
        argument sharded (or its note, when the stream is also used otherwise)."""
        flow = self.ctx.stream_flow
        if flow is None:
            return updated
        key = id(original)
        if key in flow.sharded:  # converted already
            self.batch_sizes.append(flow.sharded[key])
        elif key in flow.mixed:
            name, use = flow.mixed[key]
            self._edit(updated, "data", f"`{name}` feeds a training loop but is also used "
                       f"otherwise (`{use}`), which may need the whole stream: it is not split "
                       "over the processes, so every process trains on the same batches. If "
                       f"that use works on each process's share, wrap the stream in "
                       f"`{self.rt}.shard_stream(...)` before batchify", human=True)
        elif key in flow.shard and not self._skipped("shard-stream", updated):
            return self._shard(updated, *flow.shard[key], flow.whole)
        return updated

    def _shard(self, call: cst.Call, index: int, size_index: int,
               whole: list[str]) -> cst.Call:
        args = list(call.args)
        data, size = args[index].value, args[size_index].value
        # the batch size, for shares of whole rows: when reading it twice is harmless
        columns = [size.deep_clone()] if _plain(size) else []
        sharded = self._rt_call("shard_stream", data, *columns)
        args[index] = args[index].with_changes(value=sharded)
        new = call.with_changes(args=args)
        if "\n" not in _code(call) and self._too_long(len(_code(new)) - len(_code(call))):
            new = self._hanging(new)
        what = _code(size)
        self.batch_sizes.append(what)
        message = (f"`{_code(data)}` split over the processes before batchify "
                   f"(`{self.rt}.shard_stream`): each process trains on its own contiguous "
                   f"1/N of the stream in `{what}` columns (global batch N × `{what}`), all "
                   "taking the same number of steps; world size 1: the whole stream")
        if whole:
            names = _join(whole)
            one = len(whole) == 1
            message += (f". {names} {'is' if one else 'are'} not trained on and "
                        f"{'stays' if one else 'stay'} whole on every process: "
                        f"{'its' if one else 'their'} evaluation is the single-process value "
                        "(exact, not faster)")
        self._edit(sharded, "shard-stream", message)
        return new


def _plain(node: cst.BaseExpression) -> bool:
    """A name, ``args.batch_size``, ``cfg["bsz"]``, a number: read twice, the same value."""
    if type(node) is cst.Integer:
        return True
    if type(node) is cst.Subscript:
        return _plain(node.value) and len(node.slice) == 1 \
            and type(node.slice[0].slice) is cst.Index \
            and type(node.slice[0].slice.value) in (cst.SimpleString, cst.Integer)
    return dotted_name(node) is not None
