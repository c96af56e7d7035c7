"""LazyTensors: a read-only mapping whose values are computed when accessed.

A loaded checkpoint holds its weights this way: each access reads (and decodes) the tensor from
its file again and nothing is cached, so the only resident copies of the weights are the ones a
caller keeps, e.g. the engine's packed weights. That bounds peak memory to the packed model
plus one tensor being converted, however the file stores it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import Generic, TypeVar

T = TypeVar("T")


class LazyTensors(Mapping[str, T], Generic[T]):
    def __init__(self, loaders: Mapping[str, Callable[[], T]]):
        self._loaders = dict(loaders)

    def __getitem__(self, name: str) -> T:
        return self._loaders[name]()

    def __contains__(self, name: object) -> bool:  # without loading (Mapping's default would)
        return name in self._loaders

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaders)

    def __len__(self) -> int:
        return len(self._loaders)

    def __repr__(self) -> str:
        return f"LazyTensors({len(self)} tensors)"


def transform_each(tensors: Mapping[str, T], fn: Callable[[str, T], T]) -> LazyTensors[T]:
    """The same names, each value fn(name, tensors[name]) computed at access."""
    return LazyTensors({name: partial(_transformed, fn, tensors, name) for name in tensors})


def _transformed(fn: Callable[[str, T], T], tensors: Mapping[str, T], name: str) -> T:
    return fn(name, tensors[name])
