"""`torchship contract suggest`: profile reference data (a table, or images) and write a proposed `contract:`
section (YAML) for a human to review and commit."""
from __future__ import annotations

import io

from tasks.contract import parse_table
from tasks.core.contract_spec import Contract, suggest_contract
from tasks.core.params_spec import DataParams, ImagesParams
from tasks.core.sources import is_image_data, load_source, resolve_target
from tasks.modalities.image.contract import ImageContract, suggest_image_contract


def contract_yaml(contract: Contract | ImageContract, origin: str, rows: int, unit: str = "rows") -> str:
    """The `contract:` section as YAML, headed by where it came from."""
    from ruamel.yaml import YAML

    buffer = io.StringIO()
    yaml = YAML()
    yaml.width = 120
    yaml.dump({"contract": contract.model_dump(exclude_none=True)}, buffer)
    return (f"# Proposed from {origin} ({rows} {unit}) by `torchship contract suggest`: review every rule.\n"
            + buffer.getvalue())


def suggested_image_contract(data: DataParams, images: ImagesParams, margin: float) -> str:
    """Read every image of the source once and propose the image contract from the decodable ones (what could not be
    decoded is named on the way, and left out of the profile)."""
    from tasks.modalities.image.decode import ImageLimits
    from tasks.modalities.image.prepare import inspect_files
    from tasks.modalities.image.sources import list_images

    files, origin = list_images(data.source, resolve_target(data, images=images), images.path_column, images.rendered,
                                data.seed)
    limits = ImageLimits(max_file_bytes=int(images.max_file_mb * (1 << 20)), max_pixels=images.max_pixels)
    records = inspect_files(files, limits)   # each measured first, read within the limit
    rows = [r.row() for r in records if r.decodable and r.label is not None]
    skipped = [f"{r.name} ({r.error or 'no class folder'})" for r in records if not (r.decodable and r.label)]
    text = contract_yaml(suggest_image_contract(rows, margin), origin, len(rows), "images")
    if skipped:
        text = (f"# Left out of the profile: {len(skipped)} image(s): {', '.join(skipped[:10])}"
                f"{' ...' if len(skipped) > 10 else ''}\n") + text
    return text


def suggested_contract(current: DataParams, source: str, target: str | None, margin: float,
                     images: ImagesParams | None = None) -> str:
    """Read `source` (a file, `synthetic` or `sklearn:<name>`; target defaults to the configured one), type it
    strictly, and propose a contract from what it holds (ranges widened by `margin`)."""
    data = DataParams(**{**current.model_dump(), "source": source, "target": target or current.target})
    if is_image_data(data, images):
        return suggested_image_contract(data, images or ImagesParams(), margin)
    label = resolve_target(data)
    raw, origin = load_source(data, with_batches=False)  # reference data: what the user brought, nothing else
    typed, kinds = parse_table(raw, label, origin)
    return contract_yaml(suggest_contract(typed, kinds, label, margin=margin), origin, len(typed))
