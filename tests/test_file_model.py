"""One model of a file: the converter and the lints read the analysis' answers
(``distify/analysis/``) instead of deriving them again (issue 23, item 2)."""

from __future__ import annotations

import ast

from distify.analysis import facts as facts_module
from distify.analysis import wrapping
from distify.analysis.names import ImportMap
from distify.rules import default_rules


def test_model_classes_is_one_public_answer_for_facts_and_wrapping() -> None:
    tree = ast.parse("import torch.nn as nn\n"
                     "class Big(Small):\n    pass\n"
                     "class Small(nn.Module):\n    pass\n"
                     "class Config:\n    pass\n")
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    found = facts_module.model_classes(classes, ImportMap.from_ast(tree), default_rules())
    assert found == {"Big", "Small"}  # a subclass of a local model, defined before its base
    assert wrapping.model_classes is facts_module.model_classes
