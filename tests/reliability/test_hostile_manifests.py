"""Hostile manifests: a row naming a file outside the manifest's folder (`..` at depths 1 to 8, an absolute path, an
absolute path with `..`, a symlink out of the folder) is refused by a named rule and never read, and a refused file's
quarantine copy never lands outside the quarantine folder, whatever its name says. Through prepare's core (the source
plus an accepted batch whose stored names climb out) and through ingest, every file outside data/quarantine/ stays
byte for byte as it was and nothing is created outside it."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pandas as pd
import pytest

from tasks.core import paths
from tasks.core.params_spec import PrepareParams
from tasks.core.schema_spec import Schema
from tasks.modalities.image.contract import ImageShape
from tasks.modalities.image.prepare import prepare_images
from tasks.modalities.image.settings import ImagesParams
from tasks.modalities.image.sources import OUTSIDE_MANIFEST_RULE, list_images
from tests.helpers.images import CLASSES, shapes_folder

pytestmark = pytest.mark.reliability
DEPTH = 8   # the manifest sits 7 folders below the project, so `..` x 8 climbs out of the project too
TEXT = b"stages: {}  # the project's own file: a manifest row must never replace it\n"


def tree(root: Path) -> dict[str, str]:
    """Every file and folder under `root` (symlinks not followed) -> its sha256, "dir" or "link"."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            key = str(path.relative_to(root))
            found[key] = ("link" if path.is_symlink() else "dir" if path.is_dir()
                          else hashlib.sha256(path.read_bytes()).hexdigest())
    return found


def outside_quarantine(snapshot: dict[str, str]) -> dict[str, str]:
    quarantine = str(Path("project") / paths.QUARANTINE)
    return {k: v for k, v in snapshot.items() if not (k == quarantine or k.startswith(quarantine + os.sep))}


@pytest.fixture()
def hostile(tmp_path, monkeypatch) -> tuple[Path, list[str], Path]:
    """(the manifest, its hostile rows, a valid image outside its folder): good rows of rendered shapes, rows that
    climb out to a valid PNG at every depth and to the project's own dvc.yaml, and symlinks out of the folder."""
    project = tmp_path / "project"
    folder = project.joinpath(*[f"l{i}" for i in range(1, DEPTH)])
    shapes_folder(folder / "imgs", count=60, side=16)
    secret = shapes_folder(tmp_path / "outside", count=4, seed=7, side=16) / "circle" / "0.png"
    target = secret.read_bytes()
    for level in [tmp_path, project, *folder.parents[:DEPTH - 2]]:   # a valid image at every depth above
        (level / "target.png").write_bytes(target)
    (project / "dvc.yaml").write_bytes(TEXT)
    (folder / "link.png").symlink_to(secret)
    (folder / "linkdir").symlink_to(project, target_is_directory=True)
    rows = [("../" * depth + "target.png") for depth in range(1, DEPTH + 1)]
    rows += ["../" * (DEPTH - 1) + "dvc.yaml", "imgs/../../dvc.yaml", str(secret), str(project / "dvc.yaml"),
             f"{folder}/../../../target.png", f"{folder}/imgs/../../../dvc.yaml", "link.png", "linkdir/dvc.yaml",
             "linkdir/target.png"]
    good = sorted(p.relative_to(folder).as_posix() for p in (folder / "imgs").rglob("*.png"))
    manifest = folder / "manifest.csv"
    pd.DataFrame({"path": good + rows, "label": [p.split("/")[1] for p in good] + ["circle"] * len(rows)}
                 ).to_csv(manifest, index=False)
    monkeypatch.chdir(project)
    return manifest, rows, secret


def assert_refused_unread(refused: dict[str, list[str]], rows: list[str]) -> None:
    for row in rows:
        assert row in refused, f"{row} was not refused"
        assert refused[row] == [refused[row][0]] and refused[row][0].startswith(OUTSIDE_MANIFEST_RULE), refused[row]


def test_prepare_refuses_rows_outside_the_manifest_folder_and_writes_only_quarantine(hostile, tmp_path):
    manifest, rows, secret = hostile
    from tasks.modalities.image.batches import write_image_batch
    from tasks.modalities.image.sources import ImageFile

    # an accepted batch whose stored image names climb out (written before names were checked): refused as
    # undecodable, its quarantine copy must still land inside the quarantine folder
    climbing = [ImageFile(name="../" * depth + "dvc.yaml", label="circle",
                          read=lambda limit=None, d=depth: b"not an image %d" % d) for depth in range(1, DEPTH + 1)]
    write_image_batch(climbing, "escape")
    before = tree(tmp_path)
    files, origin = list_images(str(manifest), "label", "path", 100, 0)
    from tasks.modalities.image.batches import batch_files

    files += batch_files()
    prepared = prepare_images(files, origin, "label", ImagesParams(max_bad_share=0.5), PrepareParams())
    after = tree(tmp_path)
    assert outside_quarantine(after) == before, "a file outside data/quarantine/ was changed or created"
    copies = [k for k in after if k not in before and after[k] not in ("dir", "link")]
    assert len(copies) == DEPTH + 1   # each climbing batch image's copy, and the report, kept inside
    kept = set().union(*(set(split["sha256"]) for split in prepared.splits.values()))
    assert hashlib.sha256(secret.read_bytes()).hexdigest() not in kept, "a file outside the folder was read"
    assert_refused_unread(prepared.refused, rows)


def test_ingest_refuses_rows_outside_the_manifest_folder_and_writes_only_quarantine(hostile, tmp_path):
    manifest, rows, _ = hostile
    from tasks.config import parse_params
    from tasks.ingest import ingest_batch

    schema = Schema(source="t", target="label", classes=CLASSES, modality="image",
                    inputs=ImageShape(height=16, width=16, channels=3, mode="RGB").model_dump())
    paths.SCHEMA.parent.mkdir(parents=True)
    paths.SCHEMA.write_text(schema.to_json())
    before = tree(tmp_path)
    gate, where = ingest_batch(manifest, parse_params({}, origin="test"))
    assert gate.status == "fail" and Path(where).resolve().is_relative_to(paths.QUARANTINE.resolve())
    reasons = " ".join(gate.reasons)
    for row in rows:
        assert f"{row}: {OUTSIDE_MANIFEST_RULE}" in reasons, row
    assert outside_quarantine(tree(tmp_path)) == before, "a file outside data/quarantine/ was changed or created"
