"""The semantic checks of a `sampled_softmax` (retrieval) head, and its IR.

Used by `compiler.spec.build` once the blocks' widths and kinds are known.
A retrieval head scores a query against item vectors:

    two-tower   query: a vector block [B, D]; item: the item tower (a block
                reading one id feature and nothing else, or that feature and
                the head's `item_attributes`) or that feature
    next item   query: a transformer or hstu block [B, <=L, D] over a sequence
                feature; item: that feature (`sparse.history`): position t
                predicts the item at t + 1

The positives are the ids of the item feature, so the head reads no label
column. The item side must depend on the item id alone, or on the id and
attributes that the item catalogue keeps for it (`item_attributes`): that
is what lets uniform negatives, full-catalogue metrics and `item_vectors`
compute any item's vector from its id.
"""

from __future__ import annotations

import re
from typing import Any

from compiler.ir import Head, Retrieval
from compiler.spec.checker import INVALID, Checker, known
from compiler.spec.load import Node
from compiler.spec.semantic import Features
from compiler.spec.values import SEQUENCE_OUTPUTS, ParsedBlock, Ref, describe, input_ir, is_sequence, value_width

RETRIEVAL_KEYS = ("item", "item_attributes", "negatives", "logq", "temperature", "normalize", "mask_seen")
DEFAULT_METRICS = ("recall@10", "ndcg@10")
ALLOWED_METRICS = "recall@<k>, ndcg@<k>, hit_rate@<k>, mrr, each also as user_<metric> (averaged per user)"
HINT = "; list it in the head's `item_attributes` if it is an attribute of the item"
_METRIC = re.compile(r"(user_)?((recall|ndcg|hit_rate)@([1-9][0-9]*)|mrr)")


def check_keys(checker: Checker, entry: Node, loss: Any) -> None:
    """A head of another loss must not carry the retrieval keys; a retrieval head must not name a label."""
    if loss == "sampled_softmax":
        label = checker.child(entry, "label")
        if label is not None:
            message = "a sampled_softmax head reads no label column: its positives are the ids of its item feature"
            checker.error(label, message, at_key=True)
        return
    if not isinstance(loss, str):
        return
    for key in RETRIEVAL_KEYS:
        node = checker.child(entry, key)
        if node is not None:
            checker.error(
                node, f"`{key}` applies only to a sampled_softmax head (this head's loss is {loss})", at_key=True
            )


def item_ref(checker: Checker, entry: Node, refs: list[Ref] | None) -> Ref | None:
    """The one reference `item` resolved to (`refs`: what it resolved to, None if absent or rejected)."""
    item = checker.child(entry, "item")
    if item is None:
        name = checker.child(entry, "name") or entry
        message = "a sampled_softmax head needs `item`: the item tower block or the item's sparse feature"
        checker.error(name, message)
        return None
    if refs is None or not refs or not all(ref.kind for ref in refs):
        return None
    if len(refs) != 1:
        checker.error(item, f"`item` names one item vector, but '{item.value}' names {len(refs)} features")
        return None
    if refs[0].kind == "dense":
        checker.error(item, f"`item` must be a block or a sparse feature (an item id), not '{item.value}'")
        return None
    return refs[0]


def check_one(checker: Checker, entries: list[Node]) -> None:
    """A spec has at most one sampled_softmax head: its query and item vectors are the model's."""
    first: Node | None = None
    for entry in entries:
        if checker.value(entry, "loss") != "sampled_softmax":
            continue
        if first is None:
            first = entry
            continue
        at = checker.child(entry, "loss") or entry
        message = f"a spec has at most one sampled_softmax head (the first is at {first.loc.line}:{first.loc.col})"
        checker.error(at, message)


def retrieval_head(
    checker: Checker,
    entry: Node,
    name: str,
    query: Ref,
    item: Ref,
    blocks: dict[str, ParsedBlock],
    features: Features,
) -> Head | None:
    """The IR of a sampled_softmax head, every misuse reported at its spec line."""
    weight = checker.value(entry, "weight", 1.0)
    metrics = _metrics(checker, entry)
    negatives = _negatives(checker, entry)
    logq = checker.value(entry, "logq", False)
    temperature = checker.value(entry, "temperature", 1.0)
    normalize = checker.value(entry, "normalize", False)
    query_block = blocks[query.name]
    next_item = query_block.kind in SEQUENCE_OUTPUTS
    mask_seen = checker.value(entry, "mask_seen", next_item)
    if mask_seen is True and not next_item:
        message = "`mask_seen` applies to a next-item head (a sequence query): a two-tower query has no history to mask"
        checker.error(checker.child(entry, "mask_seen") or entry, message, at_key=True)
        return None
    attributes = _attributes(checker, entry, next_item, item, features)
    if attributes is INVALID:
        return None
    feature = _item_feature(checker, item, blocks, features, attributes)
    if feature is None:
        return None
    ok = _check_item_feature(checker, item, feature, next_item, query, blocks, features)
    query_width, item_width = query_block.width, value_width(item, blocks, features)
    if query_width is None or item_width is None:
        return None
    if query_width != item_width:
        message = (
            f"the query '{query.text()}' is {query_width} wide but the item '{item.text()}' is {item_width} wide; "
            "a sampled_softmax head scores their dot product, so they must be equal"
        )
        checker.error(query.node, message)
        return None
    table = next((f.table for f in features.sparse if f.name == feature), None)
    uniform = negatives[1] if negatives is not INVALID else 0
    rows = next((t.num_embeddings for t in features.tables if t.name == table), None)
    if rows is not None and uniform > rows:
        at = checker.child(checker.child(entry, "negatives"), "uniform") or entry
        per = "query" if negatives[2] else "step"
        checker.error(at, f"{uniform} uniform negatives per {per}, but the item table '{table}' has {rows} rows")
        return None
    if not ok or table is None or not known(weight, metrics, negatives, logq, temperature, normalize, mask_seen):
        return None
    retrieval = Retrieval(
        item=input_ir(item, blocks, features),
        item_feature=feature,
        item_table=table,
        in_batch=negatives[0],
        uniform=uniform,
        logq=logq,
        temperature=float(temperature),
        normalize=normalize,
        ks=tuple(sorted({int(m.partition("@")[2]) for m in metrics if "@" in m})),
        next_item=next_item,
        per_query=negatives[2],
        mask_seen=mask_seen,
        attributes=tuple(attributes),
        on_conflict=checker.value(checker.child(entry, "item_attributes"), "on_conflict", "last"),
    )
    ref = input_ir(query, blocks, features)
    return Head(name, ref, "sampled_softmax", feature, float(weight), 1, tuple(metrics), entry.loc, retrieval)


def _metrics(checker: Checker, entry: Node) -> Any:
    metrics = checker.value(entry, "metrics")
    if not known(metrics):
        return INVALID
    if metrics is None:
        return list(DEFAULT_METRICS)
    misfits = [item for item in checker.entries(entry, "metrics") if not _METRIC.fullmatch(str(item.value))]
    for item in misfits:
        checker.error(
            item, f"metric '{item.value}' does not apply to a sampled_softmax head (allowed: {ALLOWED_METRICS})"
        )
    return INVALID if misfits else metrics


def _negatives(checker: Checker, entry: Node) -> Any:
    """(in_batch, uniform samples per step or query, per_query); INVALID if none are asked for or the schema
    rejected them."""
    node = checker.child(entry, "negatives")
    if node is None:
        return (True, 0, False)
    in_batch, uniform = checker.value(node, "in_batch", False), checker.value(node, "uniform", 0)
    per_query = checker.value(node, "per_query", False)
    if not known(in_batch, uniform, per_query) or not node.is_mapping:
        return INVALID
    if not in_batch and not uniform:
        checker.error(node, "a sampled_softmax head needs negatives: `in_batch: true`, `uniform: <samples>`, or both")
        return INVALID
    if per_query and not uniform:
        at = checker.child(node, "per_query")
        assert at is not None
        checker.error(at, "per_query draws each query's own uniform negatives: add `uniform: <samples per query>`")
        return INVALID
    return (in_batch, uniform, per_query)


def _attributes(checker: Checker, entry: Node, next_item: bool, item: Ref, features: Features) -> Any:
    """The names `item_attributes.features` lists, each one id per sample; INVALID after an error."""
    node = checker.child(entry, "item_attributes")
    if node is None:
        return []
    names = checker.value(node, "features")
    if names is None or not known(names, checker.value(node, "on_conflict", "last")):
        return INVALID
    if next_item:
        message = "`item_attributes` applies to a two-tower head: a next-item head's items are its sequence's ids"
        checker.error(node, message, at_key=True)
        return INVALID
    if item.kind == "sparse":
        message = (
            f"`item_attributes` needs an item tower that reads them: '{item.text()}' is the item's table row alone"
        )
        checker.error(node, message, at_key=True)
        return INVALID
    ok, seen = True, set()
    for at in checker.entries(node, "features"):
        name = at.value
        spec = next((f for f in features.sparse if f.name == name), None)
        problem = None
        if name in seen:
            problem = f"'{name}' is listed twice"
        elif spec is None and name not in features.sparse_dims:
            problem = f"unknown sparse feature '{name}'{checker.suggest(name, list(features.sparse_dims))}"
        elif spec is None:
            ok = False  # reported where it is declared
            continue
        elif spec.is_sequence:
            problem = f"'{name}' is a sequence; an item attribute is one id per item"
        elif not (spec.fixed_ids and spec.ids_per_sample == 1):
            problem = f"'{name}' has up to {spec.ids_per_sample} ids per sample; an item attribute is one id per item"
        elif spec.weighted:
            problem = f"'{name}' has weighted ids; an item attribute is one id per item"
        seen.add(name)
        if problem is not None:
            checker.error(at, problem)
            ok = False
    return names if ok else INVALID


def _item_feature(
    checker: Checker, item: Ref, blocks: dict[str, ParsedBlock], features: Features, attributes: list[str]
) -> str | None:
    """The one sparse feature the item side reads beside `attributes`; another feature it reads, or an
    attribute it does not read, is reported by name."""
    if item.kind == "sparse":
        return item.name
    read: dict[str, Ref] = {}
    seen: set[str] = set()
    stack = [item.name]
    while stack:
        block = blocks[stack.pop()]
        if block.name in seen:
            continue
        seen.add(block.name)
        if not (block.complete and block.side_complete):
            return None
        for ref in block.all_refs():
            if ref.kind == "block":
                stack.append(ref.name)
            else:
                read.setdefault(ref.text(), ref)
    listed = {f"sparse.{name}" for name in attributes}
    unread = [name for name in attributes if f"sparse.{name}" not in read]
    if unread:
        message = f"the item tower '{item.text()}' does not read the item attribute '{unread[0]}'"
        checker.error(item.node, message)
        return None
    sparse = [text for text, ref in read.items() if ref.kind == "sparse" and text not in listed]
    if not sparse:
        checker.error(item.node, f"the item tower '{item.text()}' reads no sparse feature: it needs the item id")
        return None
    others = [text for text in read if text != sparse[0] and text not in listed]
    if others:
        message = (
            f"the item tower '{item.text()}' must read one id feature only ('{sparse[0]}'), but it also reads "
            f"'{others[0]}': an item's vector must follow from its id alone (for negatives, metrics and the export)"
            + (HINT if _one_id(others[0], features) else "")
        )
        checker.error(item.node, message)
        return None
    return read[sparse[0]].name


def _one_id(text: str, features: Features) -> bool:
    """Whether reference `text` is a sparse feature of one plain id per sample (what an attribute is)."""
    spec = next((f for f in features.sparse if f"sparse.{f.name}" == text), None)
    if spec is None or spec.is_sequence or spec.weighted:
        return False
    return spec.fixed_ids and spec.ids_per_sample == 1


def _check_item_feature(
    checker: Checker,
    item: Ref,
    feature: str,
    next_item: bool,
    query: Ref,
    blocks: dict[str, ParsedBlock],
    features: Features,
) -> bool:
    """The item feature fits the query: one plain id per sample, or the query's own sequence."""
    spec = next((f for f in features.sparse if f.name == feature), None)
    if spec is None:
        return False
    if next_item:
        origin = blocks[query.name].origin
        if origin is None:
            message = (
                f"the query '{query.text()}' is a sequence whose positions include prepended vectors; "
                "next-item training needs the positions of one sequence feature"
            )
            checker.error(query.node, message)
            return False
        if item.kind != "sparse" or item.name != origin:
            message = (
                f"the query '{query.text()}' is a sequence {describe(query, blocks, features)} over 'sparse.{origin}': "
                f"each position predicts the next item of that sequence, so `item` must be 'sparse.{origin}' "
                f"(got '{item.text()}')"
            )
            checker.error(item.node, message)
            return False
        return True
    if is_sequence(item, blocks, features) or spec.is_sequence:
        message = (
            f"the query '{query.text()}' is a vector but the item '{item.text()}' reads the sequence "
            f"'sparse.{feature}': a two-tower head needs one item id per sample"
        )
        checker.error(item.node, message)
        return False
    problem = None
    if not (spec.fixed_ids and spec.ids_per_sample == 1):
        problem = (
            f"up to {spec.ids_per_sample} ids per sample"
            if not spec.fixed_ids
            else f"{spec.ids_per_sample} ids per sample"
        )
    elif spec.weighted:
        problem = "weighted ids"
    elif spec.hashed:
        problem = "hashed ids (an item is its table row)"
    if problem is not None:
        message = f"the item feature 'sparse.{feature}' has {problem}; a sampled_softmax head needs exactly one item id per sample"
        checker.error(item.node, message)
        return False
    return True
