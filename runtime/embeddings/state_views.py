"""Loading a state dict into live views: table tensors kept outside the module tree.

The embedding collections hold their tables in fbgemm buffers, not as
parameters or buffers, so their `_load_from_state_dict` copies each entry
into a live view of that storage. `load_views` is that copy, with
nn.Module's bookkeeping: missing keys, mismatches as error messages, and
unexpected keys under `strict`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = ["load_views", "shape_mismatch"]


def load_views(
    views: Mapping[str, torch.Tensor],
    state_dict: Mapping[str, Any],
    prefix: str,
    strict: bool,
    missing_keys: list[str],
    unexpected_keys: list[str],
    error_msgs: list[str],
    mismatch: Callable[[str, torch.Tensor, torch.Tensor], str | None],
) -> None:
    """Copy state_dict[key] into views[key] (keys with `prefix`), in place.

    `mismatch(key, source, view)` returns the error message for a source
    that cannot go into its view, or None.
    """
    for key, view in views.items():
        if key not in state_dict:
            missing_keys.append(key)
            continue
        source = state_dict[key]
        message = mismatch(key, source, view)
        if message is not None:
            error_msgs.append(message)
            continue
        with torch.no_grad():
            view.copy_(source)
    if strict:
        unexpected_keys.extend(k for k in state_dict if k.startswith(prefix) and k not in views)


def shape_mismatch(key: str, source: torch.Tensor, view: torch.Tensor) -> str | None:
    """nn.Module's message for a checkpoint tensor of another shape than its view, or None."""
    if source.shape == view.shape:
        return None
    return (
        f"size mismatch for {key}: copying a tensor of shape {tuple(source.shape)} "
        f"from the checkpoint, the shape in the current model is {tuple(view.shape)}."
    )
