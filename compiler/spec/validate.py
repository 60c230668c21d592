"""Validate a loaded spec and turn it into the frozen `ModelIR`.

Second stage of the front end (load -> validate). Three passes, all of which
always run so that every mistake is reported at once:

1. numbers: every integer fits in int64 and every float is finite;
2. the JSON Schema (`schema.json`), each error mapped to the position of the
   offending node (a missing key: the mapping that lacks it; an unknown key:
   the key itself) with a message written for people;
3. the semantic checks and IR construction in `compiler.spec.build`, which
   skip any node the schema already rejected (no cascades of follow-on errors).

`validate` raises `CompileError` with all diagnostics, or returns the IR.
"""

from __future__ import annotations

import difflib
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from keyword import iskeyword
from typing import Any, Iterable, Iterator

import jsonschema
from jsonschema.exceptions import ValidationError, best_match

from compiler.diagnostics import CompileError, Diagnostic
from compiler.ir import INT64_MAX, ModelIR
from compiler.spec import build
from compiler.spec.load import Document, Node, Path, format_path

INT64_MIN = -(1 << 63)

_TYPE_NAMES = {
    "object": "a mapping",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "null": "null",
}

# what each pattern of the schema means, said to a person
PATTERN_HINTS = {
    "^[A-Za-z][A-Za-z0-9_]*$": "is not a valid name: use a letter, then letters, digits or _",
    "^[0-9]+(\\.[0-9]+)? ?(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)$": "is not a size like 16GiB, 512MiB, 2GB or a byte count",
    "^(ne|log_loss|auc|accuracy|mse|rmse|(user_)?mrr|(user_)?(recall|ndcg|hit_rate)@[1-9][0-9]{0,5})$": (
        "is not a metric: ne, log_loss, auc, accuracy, mse, rmse, mrr, or recall@k, ndcg@k, hit_rate@k with k from 1 "
        "to 999999 (user_ before a retrieval metric: averaged per user)"
    ),
}


@lru_cache(maxsize=1)
def load_schema() -> dict[str, Any]:
    """The spec language's JSON Schema (`compiler/spec/schema.json`)."""
    text = resources.files("compiler.spec").joinpath("schema.json").read_text(encoding="utf-8")
    return json.loads(text)


@lru_cache(maxsize=1)
def _validator() -> jsonschema.protocols.Validator:
    base = jsonschema.Draft202012Validator
    # JSON Schema counts 3.0 as an integer; a spec that writes `dim: 64.0` is wrong.
    checker = base.TYPE_CHECKER.redefine(
        "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool)
    )
    return jsonschema.validators.extend(base, type_checker=checker)(load_schema())


@dataclass(frozen=True, slots=True)
class Problem:
    """One schema finding: the path of the node it is about, and its diagnostic.

    A problem without a diagnostic only marks a path unreadable: the key an
    unknown key was probably meant to be. `missing` names the key a
    "missing required key" diagnostic is about.
    """

    path: Path
    diagnostic: Diagnostic | None
    missing: str | None = None


def validate(doc: Document, world_size: int | None = None) -> ModelIR:
    """Check `doc` against the schema and the semantic rules; return its IR or raise `CompileError`.

    `world_size` (the command line's) replaces the spec's in the rules that depend on it (a
    constraint's ranks, hosts of ranks_per_host); the IR keeps the spec's, which
    `compiler.pipeline.apply_options` replaces, checking then that the batch divides over it."""
    if doc.root is None:
        message = "the spec is empty; expected a mapping with version, name, features, model and heads"
        raise CompileError([Diagnostic(doc.start(), "", message)])
    problems = schema_problems(doc.root)
    tainted = _prefixes(problem.path for problem in problems)
    problems += [problem for problem in _number_problems(doc.root) if problem.path not in tainted]
    tainted = _prefixes(problem.path for problem in problems)
    diagnostics = [problem.diagnostic for problem in problems if problem.diagnostic is not None]
    ir, semantic = build.build_ir(doc, frozenset(tainted), world_size)
    diagnostics += semantic
    if diagnostics or ir is None:
        raise CompileError(diagnostics)
    return ir


def _prefixes(paths: Iterable[Path]) -> set[Path]:
    """Every path and all its ancestors: the nodes that contain an error."""
    return {path[:length] for path in paths for length in range(len(path) + 1)}


def _number_problems(root: Node) -> list[Problem]:
    return [Problem(node.path, _at(node, message)) for node, message in _bad_numbers(root)]


def _bad_numbers(root: Node) -> Iterator[tuple[Node, str]]:
    stack = [root]
    while stack:
        node = stack.pop()
        value = node.value
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, float) and not math.isfinite(value):
            yield node, f"must be a finite number (got {value})"
        elif isinstance(value, int) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX:
            yield node, f"{value} does not fit in a 64-bit integer"


def _at(node: Node, message: str, path: Path | None = None) -> Diagnostic:
    return Diagnostic(node.loc, format_path(node.path if path is None else path), message)


def schema_problems(root: Node) -> list[Problem]:
    """Every schema error under `root`; a missing key is dropped when an unknown key was probably it."""
    problems = [problem for error in _validator().iter_errors(root.plain()) for problem in _diagnose(error, root)]
    intended = {problem.path for problem in problems if problem.diagnostic is None}
    return [p for p in problems if p.missing is None or p.path + (p.missing,) not in intended]


def _diagnose(error: ValidationError, root: Node) -> Iterator[Problem]:
    path: Path = tuple(error.absolute_path)
    node = root.at(path)
    keyword = error.validator
    if "propertyNames" in error.absolute_schema_path:
        key_node = node.value.get(error.instance) if isinstance(node.value, dict) else None
        key_path = path + (error.instance,)
        loc = key_node.key_loc if key_node is not None and key_node.key_loc else node.loc
        yield Problem(key_path, Diagnostic(loc, format_path(key_path), _message(error, f"'{error.instance}'")))
    elif keyword == "additionalProperties":
        yield from _unknown_keys(error, node)
    elif keyword == "required":
        for key in error.validator_value:
            if key not in error.instance:
                yield Problem(path, _at(node, f"missing required key '{key}'"), missing=key)
    elif keyword == "uniqueItems":
        yield from _duplicate_items(node)
    elif keyword == "anyOf":
        yield Problem(path, _at(node, _any_of_message(error, _describe(error.instance))))
    elif keyword == "oneOf":
        yield Problem(path, _at(node, _one_of_message(error)))
    else:
        yield Problem(path, _at(node, _message(error, _describe(error.instance))))


def _unknown_keys(error: ValidationError, node: Node) -> Iterator[Problem]:
    allowed = sorted(error.schema.get("properties", {}))
    for key, child in node.value.items():
        if key in allowed:
            continue
        close = _closest(key, allowed)
        hint = f"did you mean '{close}'?" if close else "allowed: " + ", ".join(allowed)
        loc = child.key_loc or child.loc
        yield Problem(child.path, Diagnostic(loc, format_path(child.path), f"unknown key '{key}' ({hint})"))
        if close is not None and close not in node.value:
            yield Problem(node.path + (close,), None)


def _closest(word: str, choices: list[str]) -> str | None:
    """The choice `word` was probably meant to be (ignoring case first), if any."""
    same = [choice for choice in choices if choice.lower() == word.lower()]
    close = same or difflib.get_close_matches(word, choices, n=1)
    return close[0] if close else None


def _duplicate_items(node: Node) -> Iterator[Problem]:
    seen: set[str] = set()
    for child in node.value:
        value = child.plain()
        key = json.dumps(value, sort_keys=True)  # `1` and `true` differ, as in JSON Schema
        if key in seen:
            yield Problem(child.path, _at(child, f"{_describe(value)} is listed more than once"))
        seen.add(key)


def _message(error: ValidationError, got: str) -> str:
    """A readable message for one schema error about a value described as `got`."""
    keyword, expected, instance = error.validator, error.validator_value, error.instance
    if keyword == "type":
        kinds = [expected] if isinstance(expected, str) else expected
        return "expected " + " or ".join(_TYPE_NAMES[k] for k in kinds) + f", got {got}"
    if keyword == "enum":
        return _enum_message(expected, instance, got)
    if keyword == "const":
        return f"must be {_describe(expected)} (got {got})"
    if keyword in _BOUNDS:
        return f"must be {_BOUNDS[keyword]} {expected} (got {got})"
    if keyword in ("minItems", "minLength", "minProperties"):
        return "must not be empty" if expected == 1 else f"needs at least {expected} items (got {len(instance)})"
    if keyword == "maxLength":
        return f"{got} is longer than {expected} characters"
    if keyword == "pattern":
        return f"{got} " + PATTERN_HINTS.get(expected, f"does not match {expected}")
    if keyword == "not":
        if isinstance(instance, str) and iskeyword(instance):
            return f"{got} is a Python keyword and cannot be a name"
        return f"{got} is reserved for the generated code and cannot be a name"
    return error.message


def _any_of_message(error: ValidationError, got: str) -> str:
    """An `anyOf` of a type and a constant (`num_embeddings: auto`, `fill: mean`): the bound the value broke
    in the branch of its type, else what the branches accept."""
    for branch in error.context or ():
        if branch.validator not in ("type", "const"):
            return _message(branch, got)
    accepted = []
    for option in error.validator_value:
        if "const" in option:
            accepted.append(_describe(option["const"]))
        else:
            accepted.append(_TYPE_NAMES[option["type"]])
    return "expected " + " or ".join(accepted) + f", got {got}"


def _one_of_message(error: ValidationError) -> str:
    """A `oneOf` of a value or a list of them (`by: user` or `by: [movie, gender]`): the error of the branch
    the value's type fits (else of any), with the list item it is about."""
    branches: dict[int, list[ValidationError]] = {}
    for branch in error.context or ():
        branches.setdefault(int(branch.schema_path[0]), []).append(branch)
    mistyped = {i for i, errors in branches.items() if any(e.validator == "type" and not e.path for e in errors)}
    fitting = [e for i, errors in branches.items() if i not in mistyped for e in errors]
    best = best_match(fitting or error.context or ())
    if best is None:
        return error.message
    if best.validator == "uniqueItems":
        listed = best.instance
        message = f"{_describe(next(v for i, v in enumerate(listed) if v in listed[:i]))} is listed more than once"
    else:
        message = _message(best, _describe(best.instance))
    items = "".join(f"[{step}]" for step in best.relative_path)
    return f"item {items}: {message}" if items else message


_BOUNDS = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}


def _enum_message(choices: list[Any], instance: Any, got: str) -> str:
    names = [str(choice) for choice in choices]
    message = "must be one of " + ", ".join(names) + f" (got {got}"
    close = _closest(instance, names) if isinstance(instance, str) else None
    return message + (f"; did you mean '{close}'?)" if close else ")")


def _describe(value: Any) -> str:
    """A short, readable rendering of a YAML value for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        text = value if len(value) <= 40 else value[:37] + "..."
        return "'" + text.encode("unicode_escape").decode("ascii").replace("'", "\\'") + "'"
    return "a list" if isinstance(value, list) else "a mapping"
