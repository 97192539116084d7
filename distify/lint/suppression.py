"""``# noqa`` comments: bare (every code) or with codes (``# noqa: DST101, DST102``).

A comment suppresses a finding when it is on the finding's own line, or on the first or the last
line of the simple statement the finding is in, so both of these work for a call spread over
several lines::

    torch.save(  # noqa: DST101
        state, path)

    torch.save(
        state, path)  # noqa: DST101

In a compound statement's header (``with open(p, "w") as f:``) the comment goes on the line of
the reported call. Only real comments count (``tokenize``), not ``# noqa`` inside a string.
Parse errors (``DST000``) cannot be suppressed.
"""

from __future__ import annotations

import io
import re
import tokenize

from distify.lint.model import PARSE_ERROR

_NOQA = re.compile(r"#\s*noqa\b(?P<colon>\s*:\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*))?",
                   re.IGNORECASE)


class Suppressions:
    """The ``# noqa`` comments of one file, read only on the lines that have findings."""

    def __init__(self, text: str, finding_lines: list[tuple[int, ...]]) -> None:
        self._by_line: dict[int, frozenset[str] | None] = {}
        lines = text.splitlines()
        wanted = {line for group in finding_lines for line in group
                  if 0 < line <= len(lines) and "noqa" in lines[line - 1].lower()}
        if wanted:
            self._read(text, wanted)

    def _read(self, text: str, wanted: set[int]) -> None:
        try:
            for token in tokenize.generate_tokens(io.StringIO(text).readline):
                if token.type == tokenize.COMMENT and token.start[0] in wanted:
                    match = _NOQA.search(token.string)
                    if match:
                        codes = match.group("codes")
                        self._by_line[token.start[0]] = (
                            frozenset(re.split(r"[\s,]+", codes.upper())) if codes else None)
        except (tokenize.TokenError, SyntaxError):
            pass  # the file parsed, so this is only a tokenizer corner case: no suppression

    def suppressed(self, code: str, lines: tuple[int, ...]) -> bool:
        if code == PARSE_ERROR:
            return False
        for line in lines:
            if line in self._by_line:
                codes = self._by_line[line]
                if codes is None or code in codes:
                    return True
        return False
