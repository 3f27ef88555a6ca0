"""Loading a registered version as the service does (verified bytes, opened and warmed), for `torchship predict`."""
from __future__ import annotations

from tasks.core.errors import DataError
from tasks.modalities import modality_sections


def load_version(params, version: str | None = None, alias: str | None = None, client=None):
    """The registered version (by number, or by alias: champion unless told) as the service loads it: verified
    bytes, opened and warmed."""
    from serving.variants import bytes_variant
    from tasks.registry.read import CHAMPION, alias_version, registry_client, verified_onnx

    client = client or registry_client(params.tracking)
    name = params.data.registered_model_name()
    if version is None:
        alias = alias or CHAMPION
        held = alias_version(client, name, alias)
        if held is None:
            raise DataError(f"{name} has no version with alias '{alias}': see `torchship status`, or pass --version")
        version = str(held.version)
    return bytes_variant(alias or f"v{version}", str(version), verified_onnx(client, name, version),
                         params.runtime.threads, modality_sections(params))
