"""The `model:` block types of a spec, one module each (`pooled` holds the blocks over pooled vectors)."""
