"""Block names that the generated model cannot hold a block under.

Each block becomes the attribute of its name on the generated `Model`, an
`nn.Module` (an `fx.GraphModule` while the compiler checks shapes). A name
that is already an attribute there (`training`, `forward`, `parameters`, ...)
or that the compiler gives one of its own modules and methods would replace
it, or break far from the spec, so the spec check refuses it at the name.
"""

from __future__ import annotations

from collections.abc import Collection

__all__ = ["GENERATED", "TORCH_MODULE", "module_name_clash", "numeric_embedding_name"]

# The public attributes of torch.fx.GraphModule (nn.Module's among them) in torch 2.13;
# tests/compiler/spec/test_module_names.py fails when the installed torch has more.
TORCH_MODULE = frozenset(
    {
        "T_destination",
        "add_module",
        "add_submodule",
        "apply",
        "bfloat16",
        "buffers",
        "call_super_init",
        "children",
        "code",
        "compile",
        "cpu",
        "cuda",
        "delete_all_unused_submodules",
        "delete_submodule",
        "double",
        "dump_patches",
        "eval",
        "extra_repr",
        "float",
        "forward",
        "get_buffer",
        "get_extra_state",
        "get_parameter",
        "get_submodule",
        "graph",
        "half",
        "ipu",
        "load_state_dict",
        "meta",
        "modules",
        "mtia",
        "named_buffers",
        "named_children",
        "named_modules",
        "named_parameters",
        "parameters",
        "print_readable",
        "recompile",
        "register_backward_hook",
        "register_buffer",
        "register_forward_hook",
        "register_forward_pre_hook",
        "register_full_backward_hook",
        "register_full_backward_pre_hook",
        "register_load_state_dict_post_hook",
        "register_load_state_dict_pre_hook",
        "register_module",
        "register_parameter",
        "register_state_dict_post_hook",
        "register_state_dict_pre_hook",
        "requires_grad_",
        "set_extra_state",
        "set_submodule",
        "shape_env",
        "share_memory",
        "state_dict",
        "to",
        "to_empty",
        "to_folder",
        "train",
        "training",
        "type",
        "xpu",
        "zero_grad",
    }
)

# What compiler/codegen's templates and the lowering name on the generated models (training and serving).
GENERATED = {
    "sparse_arch": "its embedding tables",
    "sequence_arch": "its sequence tables",
    "retrieval_loss": "its retrieval loss",
    "item_attributes": "its item catalogue of attributes",
    "input_dist": "its first pipeline stage",
    "compute": "its second pipeline stage",
    "loss": "its loss method",
    "scores": "its scores method",
    "full_state_dict": "its full_state_dict method",
    "dense_parameters": "its dense_parameters method",
    "item_catalogue": "its item_catalogue method",
    "retrieval_term": "its retrieval_term method",
    "query_vectors": "its query_vectors method",
    "item_vectors": "its item_vectors method",
}


def numeric_embedding_name(feature: str) -> str:
    """The generated model's attribute holding dense feature `feature`'s numeric embedding."""
    return f"dense_{feature}_embedding"


def module_name_clash(name: str, dense_features: Collection[str]) -> str | None:
    """What the generated model already holds under `name` (a block's name), or None if it is free."""
    if name in TORCH_MODULE:
        return "an attribute of torch's nn.Module, which the generated model is"
    if name in GENERATED:
        return f"what the generated model names {GENERATED[name]}"
    for feature in dense_features:
        if name == numeric_embedding_name(feature):
            return f"what the generated model names the numeric embedding of dense feature '{feature}'"
    return None
