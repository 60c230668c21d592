"""Tests of runtime/sparse/jagged.py and of its checks in runtime/sparse/validation.py.

Every operation is compared with a plain-Python model of the batch (`Ref`):
a list of keys and, per key and sample, the (id, weight) pairs of its bag.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
import torch.fx
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch.utils import _pytree as pytree

from runtime.sparse.jagged import JaggedTensor, KeyedJaggedTensor, KeyedTensor

SETTINGS = settings(max_examples=50, deadline=None)
KEY_POOL = ["a", "b", "cat_3", "item_id", "hist", "z"]
Bag = list[tuple[int, float]]


def _cumsum(counts: list[int]) -> list[int]:
    return list(itertools.accumulate(counts, initial=0))


def t(data: list, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.tensor(data, dtype=dtype)


@dataclass
class Ref:
    """keys, batch size, and bags[k][b]: the (id, weight) pairs of key k in sample b."""

    keys: list[str]
    stride: int
    bags: list[list[Bag]]
    weighted: bool

    def lengths(self) -> list[int]:
        return [len(bag) for per_key in self.bags for bag in per_key]

    def values(self) -> list[int]:
        return [i for per_key in self.bags for bag in per_key for i, _ in bag]

    def weights(self) -> list[float]:
        return [w for per_key in self.bags for bag in per_key for _, w in bag]

    def length_per_key(self) -> list[int]:
        return [sum(len(bag) for bag in per_key) for per_key in self.bags]

    def select(self, indices: list[int]) -> Ref:
        bags = [self.bags[i] for i in indices]
        return Ref([self.keys[i] for i in indices], self.stride, bags, self.weighted)

    def build(self, via: str = "lengths", dtype: torch.dtype = torch.int64) -> KeyedJaggedTensor:
        """A KJT from lengths (synced or "lazy") or from offsets, lengths/offsets of `dtype`."""
        values = t(self.values())
        weights = t(self.weights(), torch.float32) if self.weighted else None
        if via == "offsets":
            offsets = t(_cumsum(self.lengths()), dtype)
            return KeyedJaggedTensor.from_offsets_sync(self.keys, values, offsets, weights, stride=self.stride)
        lengths = t(self.lengths(), dtype)
        if via == "lazy":
            return KeyedJaggedTensor(self.keys, values, weights, lengths, stride=self.stride)
        return KeyedJaggedTensor.from_lengths_sync(self.keys, values, lengths, weights, stride=self.stride)


BAGS = st.lists(st.tuples(st.integers(0, 99), st.integers(0, 40).map(lambda x: x / 4)), max_size=3)


@st.composite
def refs(
    draw: st.DrawFn,
    stride: int | None = None,
    weighted: bool | None = None,
    keys: list[str] | None = None,
) -> Ref:
    """Random batches: 0-4 keys, batch size 0-4, bags of 0-3 ids, often a key with no ids."""
    if keys is None:
        keys = draw(st.permutations(KEY_POOL))[: draw(st.integers(0, 4))]
    stride = draw(st.integers(0, 4)) if stride is None else stride
    weighted = draw(st.booleans()) if weighted is None else weighted
    per_key = []
    for _ in keys:
        empty_key = draw(st.integers(0, 4)) == 0
        per_key.append([[] if empty_key else draw(BAGS) for _ in range(stride)])
    return Ref(list(keys), stride, per_key, weighted)


def bag_lists(jt: JaggedTensor) -> list[list[tuple[int, float | None]]]:
    values = [v.tolist() for v in jt.to_dense()]
    if jt.weights_or_none() is None:
        return [[(v, None) for v in vs] for vs in values]
    weights = torch.split(jt.weights(), jt.lengths().tolist())
    return [list(zip(vs, ws.tolist())) for vs, ws in zip(values, weights)]


def assert_matches(kjt: KeyedJaggedTensor, ref: Ref) -> None:
    """Every accessor of `kjt` agrees with the plain-Python model."""
    assert kjt.keys() == ref.keys
    assert kjt.stride() == ref.stride
    assert kjt.values().tolist() == ref.values()
    assert kjt.lengths().tolist() == ref.lengths()
    assert kjt.offsets().tolist() == _cumsum(ref.lengths())
    assert kjt.length_per_key() == ref.length_per_key()
    assert kjt.offset_per_key() == _cumsum(ref.length_per_key())
    if ref.weighted:
        assert kjt.weights().tolist() == ref.weights()
    else:
        assert kjt.weights_or_none() is None
    as_dict = kjt.to_dict()
    if len(set(ref.keys)) == len(ref.keys):  # permute may repeat keys, which validate() rejects
        kjt.validate()
        assert list(as_dict) == ref.keys
    for key, per_key in zip(ref.keys, ref.bags):
        expected = [[(i, w if ref.weighted else None) for i, w in bag] for bag in per_key]
        assert bag_lists(kjt[key]) == expected
        assert bag_lists(as_dict[key]) == expected


# --- KeyedJaggedTensor against the reference ---------------------------------------------------

BATCH_OF_ONE = Ref(["a"], 1, [[[(5, 0.5)]]], True)
EMPTY_KEY = Ref(["a", "b"], 3, [[[], [], []], [[(1, 1.0)], [], [(2, 2.0), (3, 3.0)]]], True)
NO_KEYS = Ref([], 0, [], False)


@SETTINGS
@given(
    refs(),
    st.sampled_from(["lengths", "offsets", "lazy"]),
    st.sampled_from([torch.int32, torch.int64]),
)
@example(BATCH_OF_ONE, "lengths", torch.int32)
@example(EMPTY_KEY, "offsets", torch.int64)
@example(NO_KEYS, "lengths", torch.int64)
def test_accessors_match_reference(ref: Ref, via: str, dtype: torch.dtype) -> None:
    kjt = ref.build(via, dtype)
    assert_matches(kjt, ref)
    assert kjt.lengths().dtype == kjt.offsets().dtype == dtype


@SETTINGS
@given(refs(), st.lists(st.integers(0, 4), max_size=3))
@example(EMPTY_KEY, [1])
def test_split_matches_reference(ref: Ref, cuts: list[int]) -> None:
    bounds = [0, *sorted(min(cut, len(ref.keys)) for cut in cuts), len(ref.keys)]
    parts = ref.build().split([end - start for start, end in itertools.pairwise(bounds)])
    assert len(parts) == len(bounds) - 1
    for part, (start, end) in zip(parts, itertools.pairwise(bounds)):
        assert_matches(part, ref.select(list(range(start, end))))
    assert_matches(KeyedJaggedTensor.concat(parts), ref)


@SETTINGS
@given(refs(), st.data(), st.booleans())
def test_permute_matches_reference(ref: Ref, data: st.DataObject, as_tensor: bool) -> None:
    index = st.integers(0, max(len(ref.keys) - 1, 0))
    # Repeats and drops keys, as input_dist does.
    indices = data.draw(st.lists(index, max_size=len(ref.keys) and len(ref.keys) + 2))
    on_device = t(indices) if as_tensor else None
    assert_matches(ref.build().permute(indices, on_device), ref.select(indices))


@pytest.mark.parametrize("indices", [[2, 0, 2], [1], [2, 1, 0], []])
def test_weights_get_their_gradient_through_a_permute_that_repeats_or_drops_keys(indices: list[int]) -> None:
    """fbgemm's backward inverts the permutation, which repeats and drops lack (it read out of bounds)."""
    weights = torch.tensor([0.5, 1.0, 2.0, 4.0, 8.0, 16.0], requires_grad=True)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        ["a", "b", "c"], t([1, 2, 3, 4, 5, 6]), t([1, 0, 2, 1, 1, 1]), weights=weights
    )
    permuted = kjt.permute(indices)
    scale = torch.arange(1.0, permuted.values().numel() + 1)
    (permuted.weights() * scale).sum().backward()
    blocks = {0: [0], 1: [1, 2, 3], 2: [4, 5]}  # each key's positions in the values
    expected = torch.zeros(6)
    positions = [p for i in indices for p in blocks[i]]
    expected.index_add_(0, torch.tensor(positions, dtype=torch.long), scale)
    assert torch.equal(weights.grad, expected)
    assert torch.equal(permuted.weights().detach(), weights.detach()[positions])


@SETTINGS
@given(st.data(), st.integers(0, 3), st.booleans(), st.integers(1, 3))
def test_concat_matches_reference(data: st.DataObject, stride: int, weighted: bool, count: int) -> None:
    names = data.draw(st.permutations(KEY_POOL))
    parts = [
        data.draw(refs(stride, weighted, keys=names[2 * i : 2 * i + data.draw(st.integers(0, 2))]))
        for i in range(count)
    ]
    keys = [k for p in parts for k in p.keys]
    merged = Ref(keys, stride, [bags for p in parts for bags in p.bags], weighted)
    assert_matches(KeyedJaggedTensor.concat([p.build("lazy") for p in parts]), merged)
    assert_matches(KeyedJaggedTensor.concat([p.build() for p in parts]), merged)


def test_hot_path_syncs_once(monkeypatch: pytest.MonkeyPatch) -> None:
    bags = [[[(1, 1.0)], []], [[], []], [[(2, 0.5), (3, 0.25)], [(4, 1.0)]]]
    kjt = Ref(["a", "b", "c"], 2, bags, True).build("lazy")
    syncs: list[str] = []

    def counting(name: str) -> Callable:
        original = getattr(torch.Tensor, name)
        return lambda self, *args: syncs.append(name) or original(self, *args)

    for name in ("tolist", "item", "__int__", "__bool__"):
        monkeypatch.setattr(torch.Tensor, name, counting(name))
    kjt.length_per_key()
    assert syncs == ["tolist"]
    moved = kjt.to("cpu")
    first, rest = moved.split([1, 2])
    permuted = rest.permute([1, 0, 1])
    KeyedJaggedTensor.concat([first, permuted]).to_dict()
    permuted["c"].values()
    moved.offsets(), moved.offset_per_key(), permuted.split([3]), kjt["b"].lengths()
    assert syncs == ["tolist"]


# --- zero keys, empty batches, devices ---------------------------------------------------------


def test_zero_keys_keep_the_stride_override() -> None:
    kjt = KeyedJaggedTensor([], t([]), lengths=t([], torch.int32), stride=5)
    assert_matches(kjt, Ref([], 5, [], False))
    assert [part.stride() for part in kjt.split([0, 0])] == [5, 5]
    assert kjt.permute([]).stride() == 5
    other = Ref(["a"], 5, [[[(1, 1.0)], [], [], [], [(2, 1.0)]]], False)
    assert_matches(KeyedJaggedTensor.concat([kjt, other.build(), kjt]), other)
    leaves, spec = pytree.tree_flatten(kjt)
    assert pytree.tree_unflatten(leaves, spec).stride() == 5


def test_empty_like_has_no_keys_but_the_stride_and_dtypes() -> None:
    empty = KeyedJaggedTensor.empty_like(EMPTY_KEY.build(dtype=torch.int32))
    assert_matches(empty, Ref([], 3, [], True))
    dtypes = (empty.values().dtype, empty.weights().dtype, empty.lengths().dtype)
    assert dtypes == (torch.int64, torch.float32, torch.int32)


def test_to_keeps_data_and_caches() -> None:
    moved = EMPTY_KEY.build().to(torch.device("cpu"), non_blocking=True)
    assert moved._length_per_key == [0, 3] and moved._offset_per_key == [0, 0, 3]
    assert_matches(moved, EMPTY_KEY)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs an accelerator")
def test_pin_memory() -> None:
    pinned = EMPTY_KEY.build().pin_memory()
    assert pinned.values().is_pinned() and pinned.lengths().is_pinned()
    assert_matches(pinned, EMPTY_KEY)


# --- JaggedTensor ------------------------------------------------------------------------------


@SETTINGS
@given(
    st.lists(BAGS, min_size=1, max_size=5),
    st.one_of(st.none(), st.integers(0, 4)),
    st.sampled_from([0.0, -1.0]),
)
@example([[(3, 1.0)]], None, 0.0)
@example([[], []], None, 7.0)
def test_jagged_tensor_matches_reference(samples: list[Bag], desired_length: int | None, padding: float) -> None:
    ids = [t([i for i, _ in bag], torch.float32) for bag in samples]
    weights = [t([w for _, w in bag], torch.float32) for bag in samples]
    jt = JaggedTensor.from_dense(ids, weights).validate().to("cpu")
    assert bag_lists(jt) == [[(float(i), w) for i, w in bag] for bag in samples]
    assert jt.lengths().tolist() == [len(bag) for bag in samples]
    assert jt.offsets().tolist() == _cumsum([len(bag) for bag in samples])
    width = max(map(len, samples)) if desired_length is None else desired_length
    padded = [([float(i) for i, _ in bag] + [padding] * width)[:width] for bag in samples]
    assert jt.to_padded_dense(desired_length, padding).tolist() == padded
    from_offsets = JaggedTensor(jt.values(), jt.weights(), offsets=jt.offsets(), validate=True)
    assert bag_lists(from_offsets) == bag_lists(jt)


def test_jagged_tensor_with_a_trailing_dimension_pads_rows() -> None:
    jt = JaggedTensor(torch.arange(6.0).view(3, 2), lengths=t([2, 0, 1]), validate=True)
    expected = [[[0, 1], [2, 3]], [[0, 0], [0, 0]], [[4, 5], [0, 0]]]
    assert jt.to_padded_dense().tolist() == expected


# --- KeyedTensor -------------------------------------------------------------------------------


@SETTINGS
@given(st.data(), st.integers(1, 3))
def test_keyed_tensor_regroup_matches_reference(data: st.DataObject, batch: int) -> None:
    names = data.draw(st.permutations(KEY_POOL))
    blocks = {
        key: torch.randn(batch, data.draw(st.integers(0, 3)), dtype=torch.float64).requires_grad_() for key in names
    }
    cuts = sorted(data.draw(st.lists(st.integers(0, len(names)), min_size=1, max_size=2)))
    spans = [(a, b) for a, b in itertools.pairwise([0, *cuts, len(names)]) if a < b]
    kts = [KeyedTensor.from_tensor_list(names[a:b], [blocks[k] for k in names[a:b]]) for a, b in spans]
    for kt in kts:
        kt.validate().to("cpu")
        assert kt.key_dim() == 1
        assert kt.length_per_key() == [blocks[k].size(1) for k in kt.keys()]
        assert all(torch.equal(kt[k], blocks[k]) for k in kt.keys())
        assert all(torch.equal(v, blocks[k]) for k, v in kt.to_dict().items())
    groups = data.draw(st.lists(st.lists(st.sampled_from(names), min_size=1, max_size=4), min_size=1, max_size=3))
    out = KeyedTensor.regroup(kts, groups)
    for tensor, group in zip(out, groups, strict=True):
        assert torch.equal(tensor, torch.cat([blocks[k] for k in group], dim=1))
    sum(tensor.sum() for tensor in out).backward()
    for key, block in blocks.items():
        uses = sum(group.count(key) for group in groups)
        grad = block.grad if block.grad is not None else torch.zeros_like(block)
        assert torch.equal(grad, torch.full_like(block, float(uses)))


# --- validation: exact messages ----------------------------------------------------------------

F32 = torch.float32
VALIDATION_ERRORS: list[tuple[Callable[[], object], str]] = [
    (
        lambda: KeyedJaggedTensor.from_lengths_sync(
            ["cat_3"], t([1, 2, 3, 4]), t([1, 1, 1, 1, 2, -2, 0]), validate=True
        ),
        "KeyedJaggedTensor: key 'cat_3' has a negative length -2 at sample 5",
    ),
    (
        lambda: KeyedJaggedTensor(["a", "b"], torch.arange(10), lengths=t([3] * 4), validate=True),
        "KeyedJaggedTensor: sum(lengths)=12 but values has 10 entries",
    ),
    (
        lambda: KeyedJaggedTensor(["a", "b", "c"], t([1]), lengths=t([1] + [0] * 6), validate=True),
        "KeyedJaggedTensor: lengths has 7 entries but 3 keys x stride 2 need 6",
    ),
    (
        lambda: KeyedJaggedTensor(["a"], t([1]), lengths=t([1, 0]), stride=3, validate=True),
        "KeyedJaggedTensor: lengths has 2 entries but 1 keys x stride 3 need 3",
    ),
    (
        lambda: KeyedJaggedTensor([], t([]), lengths=t([1]), validate=True),
        "KeyedJaggedTensor: lengths has 1 entries but 0 keys x stride 0 need 0",
    ),
    (
        lambda: KeyedJaggedTensor(["a", "b", "a"], t([]), lengths=t([0, 0, 0]), validate=True),
        "KeyedJaggedTensor: key 'a' appears 2 times in keys",
    ),
    (
        lambda: KeyedJaggedTensor(["a", 3], t([]), lengths=t([0, 0]), validate=True),
        "KeyedJaggedTensor: key 1 must be a string, got 3",
    ),
    (
        lambda: KeyedJaggedTensor(["a"], t([1, 2]), t([0.5], F32), t([2]), validate=True),
        "KeyedJaggedTensor: weights has 1 entries but values has 2",
    ),
    (
        lambda: KeyedJaggedTensor.from_offsets_sync(["a", "b"], t([1, 2, 3]), t([0, 2, 1, 3, 3]), validate=True),
        "KeyedJaggedTensor: key 'a' has offsets decreasing from 2 to 1 at sample 1",
    ),
    (
        lambda: KeyedJaggedTensor.from_offsets_sync(["a"], t([1, 2]), t([1, 2]), validate=True),
        "KeyedJaggedTensor: offsets must start at 0, got 1",
    ),
    (
        lambda: KeyedJaggedTensor(["a"], t([1, 2]), offsets=t([0, 1, 2]), stride=3, validate=True),
        "KeyedJaggedTensor: offsets has 3 entries but 1 keys x stride 3 need 4",
    ),
    (
        lambda: KeyedJaggedTensor(["a", "b"], t([1, 2]), lengths=t([1, 1]), offsets=t([0, 1, 1]), validate=True),
        "KeyedJaggedTensor: key 'b' has length 1 but offsets give 0 at sample 0",
    ),
    (
        lambda: KeyedJaggedTensor(["a"], t([1, 2]), lengths=t([2.0], F32), validate=True),
        "KeyedJaggedTensor: lengths must be int32 or int64, got torch.float32",
    ),
    (
        lambda: KeyedJaggedTensor(["a"], t([[1, 2]]), lengths=t([2]), validate=True),
        "KeyedJaggedTensor: values must be 1-D, got shape (1, 2)",
    ),
    (
        lambda: KeyedJaggedTensor(["a"], t([1.0, 2.0], F32), lengths=t([2]), validate=True),
        "KeyedJaggedTensor: values must be int32 or int64 ids, got torch.float32",
    ),
    (
        lambda: KeyedJaggedTensor(["a", "b"], t([1, 2]), lengths=t([1, 1]), length_per_key=[2, 0], validate=True),
        "KeyedJaggedTensor: length_per_key says key 'a' has 2 values but its lengths sum to 1",
    ),
    (
        lambda: KeyedJaggedTensor(["a", "b"], t([1, 2]), lengths=t([1, 1]), offset_per_key=[0, 2, 2], validate=True),
        "KeyedJaggedTensor: offset_per_key=[0, 2, 2] but lengths give [0, 1, 2]",
    ),
    (
        lambda: KeyedJaggedTensor(["a"], t([1])),
        "KeyedJaggedTensor: needs lengths or offsets",
    ),
    (
        lambda: JaggedTensor(t([1, 2, 3]), lengths=t([1, -1, 3]), validate=True),
        "JaggedTensor: sample 1 has a negative length -1",
    ),
    (
        lambda: JaggedTensor(t([1, 2, 3]), offsets=t([0, 2]), lengths=t([1, 2]), validate=True),
        "JaggedTensor: offsets has 2 entries but 2 samples need 3",
    ),
    (
        lambda: KeyedTensor(["a", "b"], [2], torch.zeros(2, 2)).validate(),
        "KeyedTensor: length_per_key has 1 entries for 2 keys",
    ),
    (
        lambda: KeyedTensor(["a", "b"], [2, 2], torch.zeros(2, 3)).validate(),
        "KeyedTensor: sum(length_per_key)=4 but values has 3 columns",
    ),
    (
        lambda: KeyedTensor(["a", "a"], [1, 1], torch.zeros(2, 2)).validate(),
        "KeyedTensor: key 'a' appears 2 times in keys",
    ),
    (
        lambda: KeyedTensor(["a"], [-1], torch.zeros(2, 0)).validate(),
        "KeyedTensor: key 'a' has a negative length -1",
    ),
]


@pytest.mark.parametrize("build, message", VALIDATION_ERRORS, ids=[m for _, m in VALIDATION_ERRORS])
def test_validation_errors_name_the_culprit(build: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError) as raised:
        build()
    assert str(raised.value) == message


def test_usage_errors_name_the_culprit() -> None:
    kjt = Ref(["a", "b"], 1, [[[(1, 1.0)]], [[(2, 1.0)]]], False).build()
    kt = KeyedTensor(["x"], [1], torch.zeros(2, 1))
    cases: list[tuple[Callable[[], object], str]] = [
        (
            lambda: kjt.split([1, 2]),
            "KeyedJaggedTensor.split: segments [1, 2] do not add up to the 2 keys",
        ),
        (
            lambda: kjt.permute([0, 2]),
            "KeyedJaggedTensor.permute: index 2 out of range for 2 keys",
        ),
        (
            lambda: KeyedJaggedTensor.concat([kjt, BATCH_OF_ONE.build()]),
            "KeyedJaggedTensor.concat: input 0 has no weights, input 1 not",
        ),
        (
            lambda: KeyedJaggedTensor.concat([kjt, Ref([], 4, [], False).build()]),
            "KeyedJaggedTensor.concat: input 1 has stride 4 but input 0 has stride 1",
        ),
        (
            lambda: KeyedJaggedTensor.concat([]),
            "KeyedJaggedTensor.concat: needs at least one KeyedJaggedTensor",
        ),
        (lambda: kjt.weights(), "KeyedJaggedTensor has no weights; use weights_or_none()"),
        (
            lambda: KeyedTensor.regroup([kt], [["x"], ["y"]]),
            "KeyedTensor.regroup: group 1: key 'y' is in no input",
        ),
        (lambda: KeyedTensor.regroup([kt], [[]]), "KeyedTensor.regroup: group 0: it is empty"),
        (
            lambda: JaggedTensor.from_dense([]),
            "JaggedTensor.from_dense: needs at least one sample to know the dtype",
        ),
    ]
    for build, message in cases:
        with pytest.raises(ValueError) as raised:
            build()
        assert str(raised.value) == message
    with pytest.raises(KeyError, match="KeyedJaggedTensor has no key 'zz'"):
        kjt["zz"]


@SETTINGS
@given(refs(), st.sampled_from(["lazy", "offsets"]))
def test_valid_batches_pass_validation(ref: Ref, via: str) -> None:
    kjt = ref.build(via)
    checked = KeyedJaggedTensor(
        ref.keys,
        kjt.values(),
        kjt.weights_or_none(),
        kjt.lengths(),
        kjt.offsets(),
        stride=ref.stride,
        length_per_key=ref.length_per_key(),
        offset_per_key=_cumsum(ref.length_per_key()),
        validate=True,
    )
    assert_matches(checked, ref)


# --- pytree, fx, export ------------------------------------------------------------------------


@SETTINGS
@given(refs(), st.sampled_from(["lengths", "offsets"]))
def test_pytree_round_trip(ref: Ref, via: str) -> None:
    leaves, spec = pytree.tree_flatten({"sparse": ref.build(via), "dense": torch.ones(1)})
    # Built from offsets or from lengths, a batch has the same spec.
    assert spec == pytree.tree_flatten({"sparse": ref.build(), "dense": torch.ones(1)})[1]
    assert pytree.treespec_loads(pytree.treespec_dumps(spec)) == spec
    assert_matches(pytree.tree_unflatten(leaves, spec)["sparse"], ref)
    paths = [pytree.keystr(path) for path, _ in pytree.tree_flatten_with_path(ref.build())[0]]
    assert paths == ["._values", "._weights", "._lengths"]  # None weights are a leaf too


def test_pytree_round_trip_of_jagged_and_keyed_tensors() -> None:
    jt = JaggedTensor(t([1, 2, 3]), t([0.5, 1.0, 2.0], F32), offsets=t([0, 1, 1, 3]))
    assert bag_lists(pytree.tree_unflatten(*pytree.tree_flatten(jt))) == bag_lists(jt)
    kt = KeyedTensor(["x", "y"], [1, 2], torch.arange(6.0).view(2, 3))
    leaves, spec = pytree.tree_flatten(kt)
    back = pytree.tree_unflatten(leaves, pytree.treespec_loads(pytree.treespec_dumps(spec)))
    assert back.keys() == ["x", "y"] and back.length_per_key() == [1, 2]
    assert torch.equal(back["y"], kt["y"])


class _SparseArch(torch.nn.Module):
    def forward(self, kjt: KeyedJaggedTensor, dense: torch.Tensor) -> tuple:
        pooled = kjt.values().float().sum() + dense.sum()
        return pooled, kjt["b"].lengths(), kjt.permute([1, 0])


def test_passes_through_fx_symbolic_trace() -> None:
    ref = Ref(["a", "b"], 2, [[[(1, 1.0)], []], [[(2, 2.0), (3, 0.5)], [(4, 1.0)]]], True)
    traced = torch.fx.symbolic_trace(_SparseArch())
    pooled, lengths, permuted = traced(ref.build(), torch.ones(2))
    assert pooled.item() == 12.0 and lengths.tolist() == [2, 1]
    assert_matches(permuted, ref.select([1, 0]))

    def build(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return KeyedJaggedTensor(["a", "b"], values, lengths=lengths)["b"].values()

    graph = torch.fx.symbolic_trace(build)
    assert any(node.target is KeyedJaggedTensor for node in graph.graph.nodes)
    assert graph(t([1, 2, 3]), t([1, 0, 1, 1])).tolist() == [2, 3]


def test_passes_through_torch_export() -> None:
    ref = Ref(["a", "b"], 2, [[[(1, 1.0)], []], [[(2, 2.0), (3, 0.5)], [(4, 1.0)]]], True)

    class Shift(torch.nn.Module):
        def forward(self, kjt: KeyedJaggedTensor) -> KeyedJaggedTensor:
            weights = kjt.weights() * 2
            return KeyedJaggedTensor(kjt.keys(), kjt.values() + 1, weights, kjt.lengths())

    program = torch.export.export(Shift(), (ref.build(),))
    shifted = [[[(i + 1, w * 2) for i, w in bag] for bag in per_key] for per_key in ref.bags]
    assert_matches(program.module()(ref.build("offsets")), Ref(ref.keys, 2, shifted, True))
