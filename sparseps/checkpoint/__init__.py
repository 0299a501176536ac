"""Model files: checkpoints (to resume), inference models (to serve), their manifests."""

from ..files.manifest import MANIFEST, read_manifest, verify

__all__ = ["MANIFEST", "read_manifest", "verify"]
