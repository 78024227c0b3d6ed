"""The CLI's input and output: YAML documents read from files, directories or stdin within bounds a hostile
file cannot exceed, problems reported one line each (the resource, then the field), objects written as YAML
or JSON, and the exit status every subcommand shares (`m3fleet.exitcodes`). Used by every subcommand
(`m3fleet.cli` and its modules, the simulator's `m3fleet_simulator.command`), importing none of them.

Documents that are not ours (a Namespace, a Kustomization, a ConfigMap: what `kustomize build` puts beside our
resources) are skipped, each named on stderr. Never a traceback (set M3FLEET_DEBUG=1 to see one).
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from m3fleet.api.cache import CACHE_KIND
from m3fleet.api.models import GROUP, KIND
from m3fleet.errors import ClusterUnreachable, SpecError, SpecErrors
from m3fleet.exitcodes import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_INVALID, EXIT_UNREACHABLE


class InputError(Exception):
    """Input that is not even YAML, or a file that cannot be read. `where` is the file (and document)."""

    def __init__(self, where: str, problem: str | None = None, fix: str = "", field: str = "(file)") -> None:
        self.where, self.field, self.problem, self.fix = where, field, problem, fix
        super().__init__(where if problem is None else f"{where}: {field}: {problem}; fix: {fix}")


@dataclass(frozen=True)
class Document:
    source: str  # "file.yaml#2"
    body: Any


# Bounds on what one input may cost: a MiniMaxM3Deployment is a few KiB, a few levels deep.
MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_NODES = 100_000  # YAML values per document, counting every alias expansion (an alias bomb stops here)
MAX_DEPTH = 64  # nesting levels (the CRD's schema is 7 deep; kubectl's own limit is 10,000)


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, minus what kubectl would read differently or what could blow up: a duplicate key
    is an error (kubectl's strict decoding rejects it), timestamps stay strings (JSON has none)."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regex) for tag, regex in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _mapping(loader: _Loader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, "a key is a list or a mapping, not a name", key_node.start_mark
            ) from None
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"the key {key!r} is given twice (kubectl rejects duplicate fields)", key_node.start_mark
            )
        seen[key] = key_node
    return loader.construct_mapping(node, deep=True)


_Loader.add_constructor("tag:yaml.org,2002:map", _mapping)


def _size(node: yaml.Node) -> None:
    """Check the expanded size and the depth of a composed document (aliases share nodes, so this is
    linear in the text even for an alias bomb); raise ValueError when either is too large or an alias
    refers to a value that contains it."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[yaml.Node, int, bool]] = [(node, 1, False)]
    while stack:
        current, depth, done = stack.pop()
        key = id(current)
        children = _children(current)
        if done:
            open_.discard(key)
            sizes[key] = 1 + sum(sizes[id(c)] for c in children)
            if sizes[key] > MAX_NODES:
                raise ValueError(f"expands to more than {MAX_NODES:,} values (an alias bomb?)")
            continue
        if depth > MAX_DEPTH:
            raise ValueError(f"is nested more than {MAX_DEPTH} levels deep")
        if key in open_:
            raise ValueError("has an alias that refers to a value containing it (a cycle)")
        if key in sizes:
            continue
        open_.add(key)
        stack.append((current, depth, True))
        stack.extend((c, depth + 1, False) for c in children)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _yaml_problem(exc: yaml.YAMLError, text: str) -> tuple[str, str]:
    """(where, what) of a YAML error, on one line."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if isinstance(exc, yaml.reader.ReaderError):
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        character = chr(exc.character) if isinstance(exc.character, int) else exc.character
        return f"line {line} column {column}", f"the character {character!r} is not allowed in YAML"
    where = f"line {mark.line + 1} column {mark.column + 1}" if mark else "(document)"
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return where, " ".join(str(problem).split())


def _load(name: str, text: str) -> list[tuple[str, Any]]:
    """(source, body) of every non-empty document; a document that is not YAML ends the file."""
    found: list[tuple[str, Any]] = []
    index = 0
    loader: _Loader | None = None
    try:
        loader = _Loader(text)
        while loader.check_node():
            where = f"{name}#{index}"
            node = loader.get_node()
            if node is not None:
                try:
                    _size(node)
                except ValueError as exc:
                    raise InputError(
                        where, str(exc), "write the document out without such aliases or nesting", "(document)"
                    ) from None
                body = loader.construct_document(node)
                if body is not None:
                    found.append((where, body))
            index += 1
    except yaml.YAMLError as exc:
        field, problem = _yaml_problem(exc, text)
        raise InputError(f"{name}#{index}", f"invalid YAML: {problem}", "correct the syntax", field) from None
    except RecursionError:
        raise InputError(
            f"{name}#{index}", f"is nested too deeply (more than {MAX_DEPTH} levels)", "flatten it", "(document)"
        ) from None
    finally:
        if loader is not None:
            loader.dispose()
    return found


def _read(name: str, data: bytes) -> str:
    if len(data) > MAX_FILE_BYTES:
        raise InputError(name, f"is {len(data):,} bytes, more than {MAX_FILE_BYTES:,}", "split it into smaller files")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            name, f"is not UTF-8 text (byte {exc.start} is {data[exc.start]:#04x})", "save it as UTF-8"
        ) from None


def _bytes(path: Path) -> bytes | InputError:
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            return InputError(str(path), f"is {size:,} bytes, more than {MAX_FILE_BYTES:,}", "split it")
        return path.read_bytes()
    except OSError as exc:
        return InputError(str(path), f"cannot be read ({exc.strerror or exc})", "check the path and permissions")


def _yaml_files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())
    return [path]


def read_documents(target: str) -> list[Document]:
    """Every YAML document in FILE, a directory of files, or stdin ("-"); empty documents skipped, a file
    without any document is an error."""
    docs, errors = read_inputs(target)
    if errors:
        raise errors[0]
    return docs


def one_deployment(target: str, command: str) -> Document:
    """The one MiniMaxM3Deployment document in `target`, for commands that take one (`simulate`, `bench`);
    MiniMaxM3ModelCaches and documents that are not ours beside it are skipped, as `plan` skips them."""
    docs = [doc for doc in ours(read_documents(target)) if not is_cache(doc.body)]
    if len(docs) != 1:
        raise InputError(
            target,
            f"holds {len(docs)} {KIND}s; {command} takes exactly one {KIND}",
            "pass a file with one",
        )
    return docs[0]


def is_cache(body: Any) -> bool:
    """A MiniMaxM3ModelCache document: validated by `plan`, skipped by the commands that take one deployment."""
    return isinstance(body, dict) and body.get("kind") == CACHE_KIND


def is_ours(body: Any) -> bool:
    """A document m3fleet reads: one of our kinds, or anything of our API group (so a misspelt kind of ours is an
    error, not skipped), or something that is no Kubernetes object at all (reported as bad input). A document with
    another apiVersion and kind (a Namespace, a Kustomization, a ConfigMap) is someone else's."""
    if not isinstance(body, dict):
        return True
    api_version, kind = body.get("apiVersion"), body.get("kind")
    if not (isinstance(api_version, str) and api_version and isinstance(kind, str) and kind):
        return True
    if kind == "List":  # a well-formed List was opened (`read_inputs`): this one's items are no list
        return True
    return api_version.rpartition("/")[0] == GROUP or kind in (KIND, CACHE_KIND)


def ours(docs: Sequence[Document]) -> list[Document]:
    """The documents that are ours (`is_ours`); each other one is named on stderr as skipped, so that
    `kustomize build DIR | m3fleet plan -f -` reads an overlay whole."""
    kept: list[Document] = []
    for doc in docs:
        if is_ours(doc.body):
            kept.append(doc)
            continue
        meta = doc.body.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        what = _shown(doc.body["kind"]) + (f"/{_shown(name)}" if name else "")
        print(
            f"note: {doc.source}: skipped {what} ({_shown(doc.body['apiVersion'])}): not an {GROUP} resource",
            file=sys.stderr,
        )
    return kept


def in_namespace(doc: Document, namespace: str | None) -> Document:
    """The document as `kubectl -n NAMESPACE` would send it: NAMESPACE where metadata names none; a different one
    is an error, as kubectl's ("the namespace from the provided object does not match"). Unchanged without -n."""
    meta = doc.body.get("metadata") if isinstance(doc.body, dict) else None
    if not namespace or not isinstance(meta, dict):
        return doc  # nothing asked (-n "" as kubectl: none), or no metadata to fill in (the parser reports that)
    given = meta.get("namespace")
    if given in (None, ""):
        return Document(doc.source, {**doc.body, "metadata": {**meta, "namespace": namespace}})
    if given != namespace:
        raise SpecError(
            "metadata.namespace",
            f"is {_shown(given)} but -n/--namespace is {namespace}",
            f"drop -n, or pass -n {_shown(given)} (kubectl refuses such a mismatch too)",
        )
    return doc


def _shown(value: Any) -> str:
    """A value from the input, as a message may show it: a printable name as is, anything else quoted and cut short."""
    if isinstance(value, str) and _PRINTABLE.fullmatch(value):
        return value
    return repr(value)[:64]


_PRINTABLE = re.compile(r"[A-Za-z0-9][A-Za-z0-9./_-]{0,252}")  # names, kinds and apiVersions


class ResourceError(Exception):
    """A resource's problems, each line already naming the file, the document and the resource (`report`)."""


def _stdin() -> bytes:
    if sys.stdin is None:  # closed (`<&-`), not merely empty
        raise InputError("<stdin>", "is closed", "pipe the manifests in, or give -f FILE")
    stream = getattr(sys.stdin, "buffer", None)  # bytes, so that non-UTF-8 input gets a clear message
    return stream.read(MAX_FILE_BYTES + 1) if stream else sys.stdin.read(MAX_FILE_BYTES + 1).encode()


def _texts(target: str) -> list[tuple[str, bytes | InputError]]:
    """(name, content or why it cannot be read) of each YAML file `target` names."""
    if target == "-":
        return [("<stdin>", _stdin())]
    if not target:  # an unset variable in a script: never "the current directory"
        raise InputError("-f ''", "is empty", "give a file, a directory or -")
    path = Path(target)
    if not path.exists():
        raise InputError(target, "no such file or directory", "give an existing file, directory or -")
    files = _yaml_files(path)
    if not files:
        raise InputError(target, "has no .yaml or .yml files", "give a file or a directory of YAML files")
    return [(str(p), _bytes(p)) for p in files]


def read_inputs(targets: str | Sequence[str]) -> tuple[list[Document], list[InputError]]:
    """The documents of every readable file (-f may be given more than once, as with kubectl), and one error per
    file that cannot be read."""
    texts = [text for target in ([targets] if isinstance(targets, str) else targets) for text in _texts(target)]
    docs: list[Document] = []
    errors: list[InputError] = []
    for name, data in texts:
        try:
            if isinstance(data, InputError):
                raise data
            loaded = _load(name, _read(name, data))
            if not loaded:
                raise InputError(name, "has no YAML document", f"put a {KIND} manifest in it")
        except InputError as exc:
            errors.append(exc)
            continue
        for source, body in loaded:
            if isinstance(body, dict) and body.get("kind") == "List" and isinstance(body.get("items"), list):
                docs.extend(Document(f"{source}.{i}", item) for i, item in enumerate(body["items"]))
            else:
                docs.append(Document(source, body))
    return docs, errors


_PRINTABLE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")


def label(doc: Document) -> str:
    """The resource a message is about: its source, and its name when it has a printable one."""
    body = doc.body if isinstance(doc.body, dict) else {}
    meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
    name = meta.get("name") if meta else None
    kind = body.get("kind") if isinstance(body.get("kind"), str) else None
    if isinstance(name, str) and _PRINTABLE_NAME.fullmatch(name):
        return f"{doc.source} ({kind if kind and _PRINTABLE_NAME.fullmatch(kind) else KIND}/{name})"
    return doc.source


def report(doc: Document, exc: SpecError | SpecErrors) -> str:
    """One line per problem, each starting with the resource and the field."""
    errors = exc.errors if isinstance(exc, SpecErrors) else [exc]
    return "\n".join(f"error: {label(doc)}: {e}" for e in errors)


def parse_one(doc: Document, parse: Callable[[Any], Any]) -> Any:
    """`parse(doc.body)`; its errors raised as a ResourceError that names where they are, as `report` does."""
    try:
        return parse(doc.body)
    except (SpecError, SpecErrors) as exc:
        raise ResourceError(report(doc, exc)) from None


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (scripts, config files in ConfigMaps) as readable literal blocks; a value shared by two
    objects written out twice, never as an anchor and alias (`&id001`), which many YAML tools refuse."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(objects: list[Any], output: str) -> str:
    """`objects` as YAML documents, or as one JSON list."""
    if output == "json":
        return json.dumps(objects, indent=2) + "\n"
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, width=120) if objects else ""


def dump_objects(objects: list[dict[str, Any]], output: str) -> str:
    """Kubernetes objects as `kubectl apply -f -` reads them: YAML documents, or JSON as a `v1 List` (what
    `kubectl get -o json` prints; a bare JSON array is no Kubernetes object)."""
    if output == "json":
        listed = {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": objects}
        return json.dumps(listed, indent=2) + "\n"
    return dump(objects, output)


def guarded(command: Callable[[], int]) -> int:
    """Run a subcommand: bad input is one clear message and exit 2, no cluster exit 4, anything else exit 1 (the
    codes: `m3fleet.exitcodes`), never a traceback."""
    try:
        return command()
    except ResourceError as exc:
        print(exc, file=sys.stderr)
        return EXIT_INVALID
    except (InputError, SpecError, SpecErrors) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except ClusterUnreachable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:
        if os.environ.get("M3FLEET_DEBUG"):
            raise
        print(f"internal error: {type(exc).__name__}: {exc} (set M3FLEET_DEBUG=1 for a traceback)", file=sys.stderr)
        return EXIT_INTERNAL
