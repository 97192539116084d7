"""The questions of ``distify config``, asked in a terminal or answered by flags.

Each question has a flag of the same name (``--num_processes`` answers "How many processes…").
A question answered by a flag is not asked; without a terminal every other question takes its
default, and a question with no default (the main machine's address) must come as a flag.
Answers are checked as they are given, so a terminal user is asked again rather than stopped.

With several processes it asks whether to shard the model with FSDP, and then FSDP's main
settings (the layer class to shard on its own, resharding after forward, CPU offload, activation
checkpointing, the state dict type); the others keep their defaults, and can be set with their
flags (``--fsdp_min_num_params``, ...).

What it deliberately does not ask: Accelerate's DeepSpeed/TPU/dynamo questions (distify
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
from distify.launch.fsdp import STATE_DICT_TYPES

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


def _fsdp(answers: Answers) -> bool:
    return bool(answers.get("use_fsdp"))


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
    Question("use_fsdp", "Shard the model's weights, gradients and optimizer state over the "
                         "processes with FSDP (for a model that does not fit one GPU)?",
             lambda a: bool, lambda a: False, lambda a: a["num_processes"] > 1),
    Question("fsdp_transformer_layer_cls_to_wrap", "FSDP: the model's layer class to shard on "
                                                   "its own (e.g. Block; blank: the whole model "
                                                   "at once)?",
             lambda a: click.STRING, lambda a: "", _fsdp),
    Question("fsdp_reshard_after_forward", "FSDP: free each layer's gathered weights after its "
                                           "forward (less memory, more communication)?",
             lambda a: bool, lambda a: True, _fsdp),
    Question("fsdp_offload_params", "FSDP: keep the sharded weights on the CPU (offload)?",
             lambda a: bool, lambda a: False, _fsdp),
    Question("fsdp_activation_checkpointing", "FSDP: recompute each layer's activations in the "
                                              "backward (activation checkpointing)?",
             lambda a: bool, lambda a: False,
             lambda a: _fsdp(a) and bool(a["fsdp_transformer_layer_cls_to_wrap"])),
    Question("fsdp_state_dict_type", "FSDP: what distify.save_state writes (full weights on the "
                                     "main process, or one shard per process)?",
             lambda a: click.Choice(STATE_DICT_TYPES), lambda a: "FULL_STATE_DICT", _fsdp),
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
    return make_config(**_with_fsdp(answers, given))


def _with_fsdp(answers: Answers, given: Answers) -> dict[str, object]:
    """The answers as config settings: the FSDP ones (and any other ``--fsdp_*`` flag) in an
    ``fsdp_config`` of ``distributed_type: FSDP``."""
    settings = {key: value for key, value in answers.items()
                if key != "use_fsdp" and not key.startswith("fsdp_")}
    if not answers.get("use_fsdp", given.get("use_fsdp")):
        return settings
    sharding = {key: value for key, value in {**given, **answers}.items()
                if key.startswith("fsdp_") and value not in (None, "")}
    classes = sharding.get("fsdp_transformer_layer_cls_to_wrap")
    sharding.setdefault("fsdp_auto_wrap_policy",
                        "TRANSFORMER_BASED_WRAP" if classes else "NO_WRAP")
    sharding.setdefault("fsdp_version", 2)
    settings.update(distributed_type="FSDP", fsdp_config=sharding)
    return settings


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
