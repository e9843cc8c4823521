"""YAML in and out, fast enough for a 12,000-Job file (docs/benchmarks.md, "Offline review").

PyYAML's libyaml bindings parse and emit in C, but still call Python for every node: the resolver
(is this plain scalar a number, a bool, null?) and the constructor or representer. For manifests,
which are JSON-shaped (mappings, lists, strings, a few numbers), most of that work is the same
answer again and again. So, on top of the C classes where PyYAML has them:

- the resolver remembers its answer per scalar value (keys such as ``metadata`` come back on every
  object);
- plain mappings, lists and strings are built (loading) or described (dumping) by one tight
  function, and everything else (numbers, bools, timestamps, merge keys, explicit tags, aliases
  that refer to an object still being built) goes through PyYAML's own code, unchanged.

The output is byte-identical to ``yaml.safe_dump`` (``tests/test_yamlio.py`` checks it on every
reviewed example and fixture) and the objects equal ``yaml.safe_load``'s.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import IO, Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import BaseResolver

_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_Dumper: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
STR = BaseResolver.DEFAULT_SCALAR_TAG
MAP = BaseResolver.DEFAULT_MAPPING_TAG
SEQ = BaseResolver.DEFAULT_SEQUENCE_TAG
MERGE = "tag:yaml.org,2002:merge"
_CACHE_LIMIT = 1 << 16  # distinct plain scalars remembered per loader or dumper


class _CachedResolver:
    """The implicit tag of a plain scalar depends on its text alone: remember it."""

    _tags: dict[str, str]

    def resolve(self, kind: type[Node], value: Any, implicit: tuple[bool, bool]) -> str:
        if kind is not ScalarNode:
            return MAP if kind is MappingNode else SEQ
        if not implicit[0]:
            return STR
        tag = self._tags.get(value)
        if tag is None:
            tag = yaml.resolver.Resolver.resolve(self, kind, value, implicit)  # type: ignore[arg-type,no-untyped-call]
            if len(self._tags) >= _CACHE_LIMIT:
                self._tags.clear()
            self._tags[value] = tag
        return tag

    def descend_resolver(self, current_node: Any, current_index: Any) -> None:
        """Path resolvers are never registered on the safe classes: nothing to track."""

    def ascend_resolver(self) -> None:
        """See descend_resolver."""


class FastLoader(_CachedResolver, _Loader):  # type: ignore[misc,valid-type]
    def __init__(self, stream: str | IO[str]) -> None:
        super().__init__(stream)
        self._tags = {}

    def construct_document(self, node: Node) -> Any:
        building: set[int] = set()
        try:
            data = self._build(node, building, {})
        except _Recursive:  # an alias to an object still being built: PyYAML's way handles it
            return super().construct_document(node)
        self.constructed_objects.clear()
        self.recursive_objects.clear()
        return data

    def _build(self, node: Node, building: set[int], made: dict[int, Any]) -> Any:
        tag = node.tag
        if tag == STR and type(node) is ScalarNode:  # most nodes: no memo needed, a str is a str
            return node.value
        key = id(node)
        if key in made:  # an alias: the same object, as PyYAML shares it (no "billion laughs")
            return made[key]
        if key in building:
            raise _Recursive
        if tag == MAP and type(node) is MappingNode:
            building.add(key)
            mapping: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                if key_node.tag == MERGE:  # "<<": PyYAML's own merging
                    building.discard(key)
                    made[key] = merged = self.construct_object(node, deep=True)
                    return merged
                item = self._build(key_node, building, made)
                if isinstance(item, dict | list):
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        "found unhashable key",
                        key_node.start_mark,
                    )
                mapping[item] = self._build(value_node, building, made)
            building.discard(key)
            made[key] = mapping
            return mapping
        if tag == SEQ and type(node) is SequenceNode:
            building.add(key)
            items = [self._build(child, building, made) for child in node.value]
            building.discard(key)
            made[key] = items
            return items
        made[key] = value = self.construct_object(node, deep=True)  # numbers, bools, explicit tags
        return value


class _Recursive(Exception):
    """An alias refers to the mapping or list that contains it."""


class FastDumper(_CachedResolver, _Dumper):  # type: ignore[misc,valid-type]
    """Every object written in full (no ``&id001`` anchors where a value repeats: kubectl reads
    them, people do not), keys in the object's own order, block style."""

    def __init__(self, stream: IO[str]) -> None:
        super().__init__(stream, sort_keys=False, allow_unicode=True, default_flow_style=False)
        self._tags = {}

    def ignore_aliases(self, data: Any) -> bool:
        return True

    def represent_data(self, data: Any) -> Node:
        kind = type(data)
        if kind is str:
            return ScalarNode(STR, data)
        if kind is dict:
            items = [(self.represent_data(k), self.represent_data(v)) for k, v in data.items()]
            return MappingNode(MAP, items, flow_style=False)
        if kind is list:
            return SequenceNode(SEQ, [self.represent_data(item) for item in data], flow_style=False)
        node: Node = super().represent_data(data)
        return node


def load_all(text: str) -> Iterator[Any]:
    """Every document of a YAML stream, as ``yaml.safe_load_all`` reads them."""
    loader = FastLoader(text)
    try:
        while loader.check_data():
            yield loader.get_data()
    finally:
        loader.dispose()


def load(text: str) -> Any:
    """One document, as ``yaml.safe_load`` reads it."""
    loader = FastLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


class DocumentWriter:
    """YAML documents written one at a time to ``stream``, separated by ``---``, through one dumper
    (so its resolver's memory serves the whole stream)."""

    def __init__(self, stream: IO[str]) -> None:
        self._dumper = FastDumper(stream)
        self._dumper.open()

    def write(self, obj: Any) -> None:
        self._dumper.represent(obj)

    def close(self) -> None:
        self._dumper.close()
        self._dumper.dispose()


def dump(obj: Any) -> str:
    """One document as text, as ``yaml.safe_dump(obj, sort_keys=False, allow_unicode=True)``."""
    out = io.StringIO()
    writer = DocumentWriter(out)
    writer.write(obj)
    writer.close()
    return out.getvalue()
