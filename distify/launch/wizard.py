"""The questions of ``distify config``, asked in a terminal or answered by flags.

Each question has a flag of the same name (``--num_processes`` answers "How many processes…").
A question answered by a flag is not asked; without a terminal every other question takes its
default, and a question with no default (the main machine's address) must come as a flag.
Answers are checked as they are given, so a terminal user is asked again rather than stopped.

What it deliberately does not ask: Accelerate's DeepSpeed/FSDP/TPU/dynamo questions (distify
launch does not support them), ``same_network`` (torchrun needs nothing from it), and
``max_restarts`` (Accelerate refuses it in a config file: pass it to ``distify launch``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache

import click

from distify.errors import UserError
from distify.launch.config import (
    MIXED_PRECISIONS,
    RDZV_BACKENDS,
    LaunchConfig,
    local_gpu_count,
    make_config,
)

Answers = Mapping[str, object]


@dataclass(frozen=True)
class Question:
    """One question: its key (the config key and the flag), text, type and default."""

    key: str
    text: str
    kind: Callable[[Answers], click.ParamType | type]
    default: Callable[[Answers], object] = lambda answers: None
    when: Callable[[Answers], bool] = lambda answers: True


class _Checked(click.ParamType):
    """A click type with one more condition, so a bad answer is asked again."""

    def __init__(self, base: click.ParamType, ok: Callable[[object], bool], why: str) -> None:
        self.base, self.ok, self.why = base, ok, why
        self.name = base.name

    def convert(self, value, param, ctx):
        value = self.base.convert(value, param, ctx)
        if not self.ok(value):
            self.fail(self.why.format(value=value), param, ctx)
        return value


@lru_cache(maxsize=1)
def _gpus() -> int:
    return local_gpu_count()


def _several(answers: Answers) -> bool:
    return answers["num_machines"] > 1


def _per_node(answers: Answers) -> int:
    return answers["num_processes"] // answers["num_machines"]


def _gpu_ids_type(answers: Answers) -> click.ParamType:
    def ok(value: str) -> bool:
        ids = value.replace(" ", "").split(",")
        return value == "all" or (all(i.isdigit() for i in ids) and len(ids) >= _per_node(answers))
    return _Checked(click.STRING, ok, f"{{value!r}}: give 'all' or at least {_per_node(answers)} "
                                      "comma-separated GPU ids, like 0,1")


QUESTIONS = (
    Question("num_machines", "How many machines will run the job?", lambda a: click.IntRange(1),
             lambda a: 1),
    Question("machine_rank", "Rank of this machine (0 is the one that hosts the main process)?",
             lambda a: click.IntRange(0, a["num_machines"] - 1), lambda a: 0, _several),
    Question("main_process_ip", "IP address or hostname of the machine with rank 0?",
             lambda a: click.STRING, when=_several),
    Question("main_process_port", "Port on that machine for the rendezvous?",
             lambda a: click.IntRange(1, 65535), lambda a: 29500, _several),
    Question("rdzv_backend", "Rendezvous backend (static: fixed machine ranks; c10d: machines "
                             "join in any order)?",
             lambda a: click.Choice(RDZV_BACKENDS), lambda a: "static", _several),
    Question("use_cpu", "Run on CPUs only, even where GPUs are present?", lambda a: bool,
             lambda a: False),
    Question("num_processes", "How many processes in total, over all machines?",
             lambda a: _Checked(click.IntRange(1), lambda n: n % a["num_machines"] == 0,
                                f"{{value}} is not a multiple of {a['num_machines']} machines"),
             lambda a: a["num_machines"] * (1 if a["use_cpu"] else max(_gpus(), 1))),
    Question("gpu_ids", "Which GPUs should each machine use (ids like 0,1, or all)?",
             _gpu_ids_type, lambda a: "all", lambda a: not a["use_cpu"]),
    Question("mixed_precision", "Mixed precision?", lambda a: click.Choice(MIXED_PRECISIONS),
             lambda a: "no"),
    Question("debug", "Check distributed operations for mismatches while running (slower)?",
             lambda a: bool, lambda a: False),
)


def run_wizard(given: Answers, *, interactive: bool) -> LaunchConfig:
    """Ask every question that applies and is not answered in ``given``; build the config.

    Args:
        given: answers from flags (``None`` means "not given").
        interactive: ask in the terminal; otherwise take defaults.

    Raises:
        UserError: a flag's value is invalid, or a question with no default has no flag.
    """
    answers: dict[str, object] = {}
    for question in QUESTIONS:
        if question.when(answers):
            answers[question.key] = _answer(question, answers, given.get(question.key),
                                            interactive)
    return make_config(**answers)


def _answer(question: Question, answers: Answers, given: object, interactive: bool) -> object:
    kind = question.kind(answers)
    default = question.default(answers)
    if given is not None:
        if kind is bool:
            return given
        try:
            return kind.convert(given, None, None)
        except click.BadParameter as err:
            raise UserError(f"--{question.key}: {err.message}") from None
    if interactive:
        if kind is bool:
            return click.confirm(question.text, default=default)
        return click.prompt(question.text, default=default, type=kind)
    if default is None:
        raise UserError(f"--{question.key} is needed (there is no terminal to ask: "
                        f"{question.text})")
    return default
