"""YAML with limits: `safe_load` for run configs, `--set` values and the files a config names.

    data = safe_load(text, "run.yaml")      # plain data; ConfigError naming "run.yaml"

PyYAML's safe loader trusts the document's shape (nine nested aliases in 500 bytes stand
for a billion values) and keeps the second of two equal keys without a word. Before
building anything, `safe_load` refuses a key written twice in one mapping (naming both
lines), aliases that repeat more than `MAX_ALIAS_NODES` nodes in all, a node that contains
itself, nesting deeper than `MAX_DEPTH` (aliases included) and a set (`!!set`: its order
is the hash's, so `rollout.prompts: !!set {a, b}` would number the videos by chance); a
control character is a syntax error at its line and column. An escaped UTF-16 surrogate
pair (`"\\ud83d\\ude00"`, as JSON writes U+1F600) is the one character it encodes, as in
JSON; PyYAML reads two lone surrogates. Malformed YAML raises `yaml.MarkedYAMLError`.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ardiff.errors import ConfigError
from ardiff.text import short_repr, shorten

MAX_ALIAS_NODES = 100_000  # nodes aliases may repeat in one document; a config needs a few
MAX_DEPTH = 100            # nested mappings and lists; a config needs 5
_MERGE_TAG = "tag:yaml.org,2002:merge"  # `<<: *base` may override keys of its base
_SET_TAG = "tag:yaml.org,2002:set"
_SURROGATE_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")


def safe_load(text: str, source: str) -> Any:
    """`yaml.safe_load(text)` within the limits above; `source` names the text in errors."""
    try:
        loader = _LimitedLoader(text)
    except yaml.reader.ReaderError as exc:
        raise _marked(text, exc) from None
    loader.source = source
    try:
        return loader.get_single_data()
    except RecursionError:  # not expected within MAX_DEPTH; a message, not a traceback
        raise ConfigError(f"{source}: nests too deeply; flatten it") from None
    finally:
        loader.dispose()


class _LimitedLoader(yaml.SafeLoader):
    """A SafeLoader that stops composing past MAX_DEPTH and checks the composed document
    before constructing it."""

    source = "<yaml>"
    _depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:  # before Python's recursion limit (~1000)
                line = self.peek_event().start_mark.line + 1
                raise ConfigError(f"{self.source}: nests deeper than {MAX_DEPTH} levels at line "
                                  f"{line}; flatten it")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_document(self, node: Node) -> Any:
        _check_document(node, self.source)
        return super().construct_document(node)

    def construct_scalar(self, node: Node) -> Any:
        value = super().construct_scalar(node)
        if isinstance(node, ScalarNode) and node.style == '"' and isinstance(value, str):
            return _join_surrogate_pairs(value)  # only escapes make surrogates in YAML text
        return value

    def construct_yaml_int(self, node: ScalarNode) -> int:
        try:
            return super().construct_yaml_int(node)
        except ValueError:  # more digits than Python converts (sys.int_info)
            raise ConstructorError(None, None, f"the integer {shorten(node.value, 40)} has "
                                   f"{len(node.value)} digits, too many", node.start_mark) from None


_LimitedLoader.add_constructor("tag:yaml.org,2002:int", _LimitedLoader.construct_yaml_int)


def _join_surrogate_pairs(text: str) -> str:
    return _SURROGATE_PAIR.sub(
        lambda pair: pair.group().encode("utf-16-le", "surrogatepass").decode("utf-16-le"), text)


def _check_document(root: Node, source: str) -> None:
    """Raise `ConfigError` for a duplicate key, a recursive alias, aliases that repeat more
    than MAX_ALIAS_NODES nodes or nest values deeper than MAX_DEPTH. Linear in the number
    of distinct nodes: a shared subtree is walked once."""
    expanded: dict[int, tuple[int, int]] = {}  # id(node) -> (nodes, levels), aliases expanded
    entered: set[int] = set()                  # nodes whose subtree is being walked
    stack: list[tuple[Node, str, bool]] = [(root, "", False)]
    while stack:
        node, path, leaving = stack.pop()
        if leaving:
            entered.discard(id(node))
            below = [expanded[id(child)] for _, child in _children(node, path)]
            expanded[id(node)] = (1 + sum(n for n, _ in below), 1 + max((d for _, d in below),
                                                                        default=0))
            continue
        if id(node) in expanded:
            continue
        if id(node) in entered:
            raise ConfigError(f"{source}: the value at line {node.start_mark.line + 1} contains "
                              f"itself through an alias; a config cannot be recursive")
        if node.tag == _SET_TAG:
            raise ConfigError(f"{source}: the set (!!set) at line {node.start_mark.line + 1} has "
                              f"no order; write a list such as [a, b] instead")
        entered.add(id(node))
        stack.append((node, path, True))
        if isinstance(node, MappingNode):
            _check_unique_keys(node, path, source)
        stack.extend((child, child_path, False)
                     for child_path, child in reversed(_children(node, path)))
    num_nodes, levels = expanded[id(root)]
    if num_nodes - len(expanded) > MAX_ALIAS_NODES:
        raise ConfigError(f"{source}: its aliases expand to more than {MAX_ALIAS_NODES:,} "
                          f"values; use fewer aliases (or write the values out)")
    if levels > MAX_DEPTH:
        raise ConfigError(f"{source}: its aliases nest values deeper than {MAX_DEPTH} levels; "
                          f"flatten it")


def _children(node: Node, path: str) -> list[tuple[str, Node]]:
    """(path, child) of a mapping's keys and values or a list's items; none for a scalar."""
    if isinstance(node, SequenceNode):
        return [(f"{path}[{i}]", item) for i, item in enumerate(node.value)]
    if isinstance(node, MappingNode):
        pairs = []
        for key, value in node.value:
            pairs += [(path, key), (_key_path(path, key), value)]
        return pairs
    return []


def _key_path(path: str, key: Node) -> str:
    name = shorten(key.value, 60) if isinstance(key, ScalarNode) else "?"
    return f"{path}.{name}" if path else name


def _check_unique_keys(node: MappingNode, path: str, source: str) -> None:
    first: dict[tuple[str, str], ScalarNode] = {}
    for key, _value in node.value:
        if not isinstance(key, ScalarNode) or key.tag == _MERGE_TAG:
            continue
        earlier = first.setdefault((key.tag, key.value), key)
        if earlier is not key:
            raise ConfigError(f"{source}: key {short_repr(_key_path(path, key))} appears twice, "
                              f"{_places(earlier.start_mark, key.start_mark)}; keep one of them")


def _places(first: yaml.Mark, second: yaml.Mark) -> str:
    if first.line == second.line:
        return f"on line {first.line + 1} (columns {first.column + 1} and {second.column + 1})"
    return f"at line {first.line + 1} and line {second.line + 1}"


def _marked(text: str, exc: yaml.reader.ReaderError) -> yaml.MarkedYAMLError:
    """A character the YAML reader refuses, as a syntax error at its line and column."""
    before = text[:exc.position]
    line, column = before.count("\n"), exc.position - (before.rfind("\n") + 1)
    mark = yaml.Mark("<text>", exc.position, line, column, None, None)
    char = exc.character if isinstance(exc.character, int) else ord(exc.character)
    return yaml.MarkedYAMLError(problem=f"character #x{char:04x} is not allowed in YAML "
                                        f"(a control character)", problem_mark=mark)
