"""Trainer-side helpers for materializerd.

    from materializer_client import shm
    with shm.map_export(export_response) as imported:
        model.load_state_dict(imported.tensors, strict=True, assign=True)

`shm` maps a CPU export (ExportHandle's SharedMemoryExport) as torch tensors
without copying; `digest` computes the service's content digests and
`fingerprint` its shard-composable fingerprints.
"""

from materializer_client import digest, fingerprint, shm

__all__ = ["digest", "fingerprint", "shm"]
