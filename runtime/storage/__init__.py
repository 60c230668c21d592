"""What is written to disk beside the tensors: file manifests (sizes, sha256, format version)."""

from __future__ import annotations

from runtime import lazy_exports

lazy_exports(
    globals(),
    {
        "manifest": (
            "MANIFEST",
            "FileProblem",
            "ManifestProblem",
            "check_file",
            "describe_files",
            "file_facts",
            "file_sha256",
            "read_manifest",
            "write_manifest",
        ),
    },
)
