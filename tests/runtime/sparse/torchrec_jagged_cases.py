"""Calls on jagged tensors that test_jagged_torchrec.py makes on the runtime's and on TorchRec's.

Imports torch only: the classes come in as arguments (tests/torchrec_anchor.py).
"""

from __future__ import annotations

from typing import Any

import torch


def _jt(jt: Any) -> dict[str, Any]:
    return {
        "values": jt.values(),
        "weights": jt.weights_or_none(),
        "lengths_or_none": jt.lengths_or_none(),
        "offsets_or_none": jt.offsets_or_none(),
    }


def _kjt(kjt: Any) -> dict[str, Any]:
    return {
        "keys": kjt.keys(),
        "values": kjt.values(),
        "weights": kjt.weights_or_none(),
        "lengths_or_none": kjt.lengths_or_none(),
        "offsets_or_none": kjt.offsets_or_none(),
        "stride": kjt.stride(),
        "length_per_key_or_none": kjt.length_per_key_or_none(),
        "offset_per_key_or_none": kjt.offset_per_key_or_none(),
    }


def cases(JaggedTensor: Any, KeyedJaggedTensor: Any, KeyedTensor: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    values = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    weights = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    lengths = torch.tensor([2, 0, 1, 3], dtype=torch.int32)

    # lengths_or_none / offsets_or_none: what is held, before and after the other is computed
    jt = JaggedTensor(values=values, weights=weights, lengths=lengths)
    out["jt_from_lengths"] = _jt(jt)
    out["jt_size_in_bytes_lengths"] = jt.size_in_bytes()
    jt.offsets()
    out["jt_after_offsets"] = _jt(jt)
    out["jt_size_in_bytes_both"] = jt.size_in_bytes()
    by_offsets = JaggedTensor(values=values, offsets=torch.tensor([0, 2, 2, 3, 6]))
    out["jt_from_offsets"] = _jt(by_offsets)
    by_offsets.lengths()
    out["jt_from_offsets_after_lengths"] = _jt(by_offsets)

    # to_dense_weights / to_padded_dense_weights, with and without weights
    out["to_dense"] = jt.to_dense()
    out["to_dense_weights"] = jt.to_dense_weights()
    out["to_dense_weights_none"] = by_offsets.to_dense_weights()
    out["to_padded_dense_weights"] = jt.to_padded_dense_weights()
    out["to_padded_dense_weights_2"] = jt.to_padded_dense_weights(desired_length=2, padding_value=1.0)
    out["to_padded_dense_weights_5"] = jt.to_padded_dense_weights(5, -1.0)
    out["to_padded_dense_weights_none"] = by_offsets.to_padded_dense_weights()
    out["to_padded_dense_2"] = jt.to_padded_dense(desired_length=2, padding_value=9.0)

    # from_dense_lengths
    dense = torch.arange(12, dtype=torch.float32).view(4, 3)
    dense_weights = dense / 10
    out["from_dense_lengths"] = _jt(JaggedTensor.from_dense_lengths(dense, torch.tensor([2, 0, 3, 1]), dense_weights))
    out["from_dense_lengths_ids"] = _jt(
        JaggedTensor.from_dense_lengths(torch.arange(8).view(2, 4), torch.tensor([4, 1], dtype=torch.int32))
    )
    rows = torch.arange(24, dtype=torch.float32).view(2, 3, 4)  # each entry a vector
    out["from_dense_lengths_vectors"] = _jt(JaggedTensor.from_dense_lengths(rows, torch.tensor([1, 3])))

    # JaggedTensor.empty (offsets differ by design: docs/torchrec_differences.md)
    for name, empty in {
        "jt_empty": JaggedTensor.empty(),
        "jt_empty_typed": JaggedTensor.empty(
            is_weighted=True, values_dtype=torch.int64, weights_dtype=torch.float64, lengths_dtype=torch.int64
        ),
        "jt_empty_positional": JaggedTensor.empty(True, None, torch.int32),
    }.items():
        out[name] = {"values": empty.values(), "weights": empty.weights_or_none(), "lengths": empty.lengths()}
        out[f"{name}_to_dense"] = empty.to_dense()

    # KeyedJaggedTensor.empty
    out["kjt_empty"] = _kjt(KeyedJaggedTensor.empty())
    out["kjt_empty_typed"] = _kjt(
        KeyedJaggedTensor.empty(
            is_weighted=True, values_dtype=torch.int32, weights_dtype=torch.float16, lengths_dtype=torch.int64
        )
    )
    out["kjt_empty_positional"] = _kjt(KeyedJaggedTensor.empty(True))
    out["kjt_empty_stride_per_key"] = KeyedJaggedTensor.empty().stride_per_key()
    out["kjt_empty_size_in_bytes"] = KeyedJaggedTensor.empty(True).size_in_bytes()

    # from_jt_dict: weighted and not, ids of two dtypes of lengths
    a = JaggedTensor(
        values=torch.tensor([1, 2, 3]), weights=torch.tensor([0.5, 1.0, 1.5]), lengths=torch.tensor([2, 0, 1])
    )
    b = JaggedTensor(values=torch.tensor([7, 8]), weights=torch.tensor([2.0, 3.0]), offsets=torch.tensor([0, 0, 1, 2]))
    out["from_jt_dict"] = _kjt(KeyedJaggedTensor.from_jt_dict({"a": a, "b": b}))
    plain = {
        "y": JaggedTensor(values=torch.tensor([4, 5, 6, 9]), lengths=torch.tensor([1, 3])),
        "x": JaggedTensor(values=torch.tensor([0]), lengths=torch.tensor([0, 1])),
    }
    kjt = KeyedJaggedTensor.from_jt_dict(plain)
    out["from_jt_dict_plain"] = _kjt(kjt)
    out["from_jt_dict_round_trip"] = {  # to_dict's JaggedTensors hold offsets in TorchRec only: compared computed
        key: [value.values(), value.lengths(), value.offsets()] for key, value in kjt.to_dict().items()
    }

    # stride_per_key, inverse_indices_or_none, unsync, size_in_bytes
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["f1", "f2", "f3"],
        values=torch.tensor([5, 6, 7, 8, 9, 10]),
        lengths=torch.tensor([1, 0, 2, 1, 1, 1]),
        weights=torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
    )
    out["stride_per_key"] = kjt.stride_per_key()
    out["inverse_indices_or_none"] = kjt.inverse_indices_or_none()
    out["kjt_size_in_bytes_lengths"] = kjt.size_in_bytes()
    out["kjt_synced"] = _kjt(kjt)
    out["unsync_returns_self"] = kjt.unsync() is kjt
    out["kjt_unsynced"] = _kjt(kjt)
    out["length_per_key_after_unsync"] = kjt.length_per_key()
    kjt.offsets()
    out["kjt_size_in_bytes_both"] = kjt.size_in_bytes()
    by_offsets = KeyedJaggedTensor(keys=["u"], values=torch.tensor([1, 2]), offsets=torch.tensor([0, 2, 2]))
    out["kjt_offsets_only"] = _kjt(by_offsets)
    out["kjt_offsets_only_size_in_bytes"] = by_offsets.size_in_bytes()
    out["kjt_offsets_only_stride_per_key"] = by_offsets.stride_per_key()

    # KeyedTensor.regroup_as_dict, with a key in two groups, and its gradient
    first = torch.arange(12, dtype=torch.float32).view(2, 6).requires_grad_()
    second = torch.arange(6, dtype=torch.float32).view(2, 3).requires_grad_()
    kts = [
        KeyedTensor(keys=["a", "b"], length_per_key=[2, 4], values=first),
        KeyedTensor(keys=["c"], length_per_key=[3], values=second),
    ]
    grouped = KeyedTensor.regroup_as_dict(kts, [["c", "a"], ["b", "a"]], ["user", "item"])
    out["regroup_as_dict"] = {key: value.detach() for key, value in grouped.items()}
    scale = torch.arange(1, 6, dtype=torch.float32)
    (grouped["user"] * scale).sum().backward(retain_graph=True)
    (grouped["item"] * torch.arange(1, 7, dtype=torch.float32)).sum().backward()
    out["regroup_as_dict_grads"] = [first.grad, second.grad]
    out["regroup_as_dict_one_to_one"] = KeyedTensor.regroup_as_dict(
        [KeyedTensor(keys=["a", "b"], length_per_key=[2, 4], values=first.detach())], [["b"], ["a"]], ["x", "y"]
    )
    out["kt_size_in_bytes"] = kts[0].size_in_bytes()
    return out


def differences(JaggedTensor: Any, KeyedJaggedTensor: Any, KeyedTensor: Any) -> dict[str, Any]:
    """The calls of docs/torchrec_differences.md's rows about jagged tensors: each result, or the error's type."""
    out: dict[str, Any] = {}

    def attempt(name: str, call: Any) -> None:
        try:
            out[name] = ["ok", call()]
        except Exception as error:  # noqa: BLE001 (what is raised is the result)
            out[name] = ["raises", type(error).__name__]

    empty = JaggedTensor(values=torch.empty(0), lengths=torch.empty(0, dtype=torch.int32))
    attempt("padded_of_empty", lambda: list(empty.to_padded_dense().shape))
    attempt("padded_weights_of_empty", lambda: list(JaggedTensor.empty(True).to_padded_dense_weights().shape))
    attempt("empty_offsets", lambda: JaggedTensor.empty().offsets().tolist())
    a = JaggedTensor(values=torch.tensor([1, 2]), lengths=torch.tensor([1, 1]))
    b = JaggedTensor(values=torch.tensor([3]), lengths=torch.tensor([1]))
    attempt("variable_batch", lambda: KeyedJaggedTensor.from_jt_dict({"a": a, "b": b}).stride_per_key())
    w = JaggedTensor(values=torch.tensor([1, 2]), weights=torch.tensor([0.5, 0.5]), lengths=torch.tensor([1, 1]))
    attempt("mixed_weights", lambda: KeyedJaggedTensor.from_jt_dict({"a": a, "w": w}).weights().tolist())
    attempt("no_jts", lambda: KeyedJaggedTensor.from_jt_dict({}).keys())
    kjt = KeyedJaggedTensor.from_lengths_sync(["a"], torch.tensor([1, 2]), torch.tensor([2, 0]))
    attempt("to_dict_offsets_held", lambda: kjt.to_dict()["a"].offsets_or_none() is not None)
    kt = KeyedTensor(keys=["a"], length_per_key=[2], values=torch.ones(1, 2))
    attempt("regroup_as_dict_names", lambda: list(KeyedTensor.regroup_as_dict([kt], [["a"]], ["x", "y"])))
    return out
