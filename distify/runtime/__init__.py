"""Placeholder: the runtime lands with its issue."""
