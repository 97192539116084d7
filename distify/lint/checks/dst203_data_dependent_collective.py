"""DST203: a test on a per-process value that decides whether a collective runs, or when a
training loop ends."""

from __future__ import annotations

from distify.lint.rule import Invalid, LintRule, Valid


class DataDependentCollective(LintRule):
    """A test on a value that differs between processes decides whether a collective runs, or
    when a training loop ends: the processes decide differently and the job hangs.

    In a script that runs on the distify runtime, each process computes its own losses and
    rewards from its own batches. ``if loss.item() < 0.5: accuracy = evaluate(...)``, where
    ``evaluate`` reduces its sums over the processes, runs the reduce on the processes whose loss
    is under 0.5 only, and they wait for the others forever; ``if loss.item() < 1e-3: break``
    leaves the training loop on some processes while the others wait in DDP's next gradient
    all-reduce. So does ``if not math.isfinite(loss.item()): continue`` before the backward (the
    process that skips it leaves the others in the all-reduce), and ``sys.exit`` in a function
    the training loop calls (``sanity_check(batch)``): the test there is reported at its line.
    The same holds for a collective after a ``continue`` only some processes take, or in an
    exception handler. An ``if`` on such a value whose branch changes the optimizer's work
    (``optimizer.step()``, ``zero_grad()``, an in-place change of the weights or of
    ``param_groups``) does not hang, but the processes that take it train their replicas
    apart: it is reported too.

    This is the analysis ``distify convert`` uses to place its collectives (the values that
    differ between processes are followed through the loop: batches, model outputs, losses,
    what is computed from them; not step counters, settings, or what ``distify.reduce`` or a
    reduced ``evaluate()`` returns). The fix is the one ``convert`` makes: decide the test on a
    value every process agrees on, ``if distify.reduce(loss.item(), op="mean") < 0.5:`` (``op=
    "max"`` for a batch's largest value), or ``distify.any_process(...)`` for a test that is not
    one comparison, a ``continue`` and a ``sys.exit``. Checked in files that import the distify
    runtime; no automatic fix.
    """

    CODE = "DST203"
    MESSAGE = "a test on a per-process value decides a collective or an exit: the job can hang"

    VALID = (
        Valid("""
            import distify.runtime as distify

            for epoch in range(10):
                for x, y in train_loader:
                    loss = model(x).sum()
                    distify.backward(loss)
                if distify.reduce(loss.item(), op="mean") < 0.5:
                    print(distify.reduce(correct))
                if epoch % 5 == 0:
                    total = distify.reduce(total)
        """),
        Valid("""
            import distify.runtime as distify

            for x, y in train_loader:
                loss = model(x).sum()
                distify.backward(loss)
                if loss.item() > 10:
                    print("large loss", loss.item())
        """),
        Valid("""
            import math
            import sys
            import torch
            import distify.runtime as distify

            def sanity_check(batch):
                if distify.any_process(torch.isnan(batch).any()):
                    sys.exit(0)

            for x, y in train_loader:
                sanity_check(x)
                if distify.reduce(x.abs().max(), op="max") > 100:
                    sys.exit("input out of range")
                loss = model(x).sum()
                if distify.any_process(not math.isfinite(loss.item())):
                    continue
                distify.backward(loss)
                if loss.item() > 10:
                    continue
        """),
    )
    INVALID = (
        Invalid("""
            import distify.runtime as distify

            def evaluate():
                correct = 0
                return distify.reduce(correct)

            for epoch in range(10):
                for x, y in train_loader:
                    loss = model(x).sum()
                    distify.backward(loss)
                if loss.item() < 0.5:
                    accuracy = evaluate()
        """, line=11),
        Invalid("""
            import distify.runtime as distify

            for x, y in train_loader:
                loss = model(x).sum()
                distify.backward(loss)
                if loss.item() < 1e-3:
                    break
        """, line=6),
        Invalid("""
            import torch
            import distify.runtime as distify

            for step, (x, y) in enumerate(train_loader):
                loss = model(x).sum()
                try:
                    check(loss)
                except ValueError:
                    continue
                distify.backward(loss)
                if step % 100 == 0:
                    distify.wait_for_everyone()
        """, line=12),
        Invalid("""
            import math
            import distify.runtime as distify

            for x, y in train_loader:
                loss = model(x).sum()
                if not math.isfinite(loss.item()):
                    continue
                distify.backward(loss)
        """, line=6),
        Invalid("""
            import sys
            import torch
            import distify.runtime as distify

            def sanity_check(batch):
                if torch.isnan(batch).any():
                    print("bad batch")
                    sys.exit(0)

            for x, y in train_loader:
                sanity_check(x)
                distify.backward(model(x).sum())
        """, line=6),
        Invalid("""
            import sys
            import distify.runtime as distify

            for x, y in train_loader:
                if x.abs().max() > 100:
                    sys.exit("input out of range")
                distify.backward(model(x).sum())
        """, line=5),
    )

    def finish(self) -> None:
        rt = self.ctx.runtime_alias()
        if rt is None or b"if" not in self.ctx.source:
            return
        # LibCST and the stops analysis, for the files that run on the distify runtime only:
        # `distify check` imports neither otherwise (its start-up is most of a small run)
        from distify.lint.checks._dst203_flow import report_stops
        report_stops(self, rt)
