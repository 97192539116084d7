"""Give a user's object distify behaviour by swapping in a subclass of its own class.

The object stays what the user made (``isinstance`` checks, attributes, methods and
``state_dict`` all keep working), and pickling or copying it yields the original class, so
files written with ``torch.save(obj)`` load without distify installed.
"""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")
_PRIVATE = "_distify"
_CACHE: dict[tuple[type, type, type], type] = {}


_SET_CLASS = object.__dict__["__class__"].__set__


class PicklesAsOriginal:
    """Mixin: pickling and ``copy``/``deepcopy`` produce the original class, minus distify state."""

    # ``obj.__class__`` names the user's class (``type(obj)`` is still the subclass): pickle
    # checks it, so a pickled object is byte for byte what the original script would write.
    @property  # type: ignore[misc]
    def __class__(self) -> type:  # type: ignore[override]
        return original_class(self)

    @__class__.setter
    def __class__(self, value: type) -> None:
        _SET_CLASS(self, value)

    def __reduce_ex__(self, protocol: Any) -> Any:
        reduced = super().__reduce_ex__(protocol)
        if not isinstance(reduced, tuple) or len(reduced) < 2:
            return reduced
        swapped, original = type(self), original_class(self)
        args = tuple(original if arg is swapped else arg for arg in reduced[1])
        state = reduced[2] if len(reduced) > 2 else None
        if isinstance(state, dict) and _PRIVATE in state:
            state = {key: value for key, value in state.items() if key != _PRIVATE}
        return (reduced[0], args, state, *reduced[3:])


def swap_class(obj: T, mixin: type, original: type | None = None) -> T:
    """Make ``obj`` an instance of a cached subclass ``(mixin, type(obj))`` with the same name.

    Args:
        obj: the object.
        mixin: the behaviour to add.
        original: the class to name and pickle as, when ``type(obj)`` is itself a subclass
            made by someone else (FSDP's ``fully_shard`` makes ``FSDP<Class>``); default: the
            object's original class.
    """
    base = original_class(obj)
    original = original or base
    key = (mixin, base, original)
    if key not in _CACHE:
        namespace = {"__module__": original.__module__, "__qualname__": original.__qualname__,
                     "__doc__": original.__doc__, "_distify_original_class": original}
        _CACHE[key] = type(original.__name__, (mixin, base), namespace)
    obj.__class__ = _CACHE[key]
    return obj


def original_class(obj: Any) -> type:
    """The user's class of an object changed by :func:`swap_class` (else its own class)."""
    return getattr(type(obj), "_distify_original_class", type(obj))


def private_state(obj: Any) -> Any:
    """The distify state kept in ``obj.__dict__`` (``None`` if there is none)."""
    return obj.__dict__.get(_PRIVATE)


def set_private_state(obj: Any, value: Any) -> None:
    # Straight into __dict__: nn.Module.__setattr__ would register a module value as a child.
    obj.__dict__[_PRIVATE] = value
