"""Offline stand-in for tiktoken: a byte-level "GPT-2" encoding (ids 0..255, EOT 50256).

Enough for scripts that call get_encoding("gpt2").encode/encode_ordinary/decode and read
eot_token/n_vocab; the ids differ from the real BPE, which no judgement here depends on.
"""
from __future__ import annotations


class Encoding:
    name = "gpt2"
    n_vocab = 50257
    eot_token = 50256

    def encode(self, text, allowed_special=(), disallowed_special=()):
        return list(text.encode("utf-8"))

    encode_ordinary = encode

    def decode(self, tokens):
        return bytes(t for t in tokens if t < 256).decode("utf-8", errors="replace")


def get_encoding(name):
    return Encoding()
