"""/predict's OpenAPI, generated from the serving champion's contract: its request row (the same pydantic model
that words the 422s: every column, its type, range, category set and nullability) and its answer (the model's
classes). /predict is answered outside FastAPI's body parsing (serving/front.py), so FastAPI cannot infer this;
the document is rebuilt whenever a different champion is swapped in."""
from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from serving.variants import Variant
from tasks.modalities.image.serving import IMAGES_SHAPE
from tasks.modalities.table.serving import ROWS_SHAPE

PROBLEM = {"type": "object", "properties": {
    "row": {"type": "integer", "description": "index of the row in `rows`"},
    "field": {"type": "string", "description": "the column (or `(row)` when the row itself is no object)"},
    "rule": {"type": "string", "description": "the rule broken, e.g. missing, less_than_equal, literal_error, "
                                             "finite_number, float32_range, extra_forbidden"},
    "message": {"type": "string"}}}


def _error(description: str, detail: dict) -> dict:
    return {"description": description, "content": {"application/json": {"schema": {
        "type": "object", "properties": {"detail": detail, "request_id": {"type": "string"}}}}}}


def image_request() -> dict:
    """An image model's /predict bodies: JSON with base64 files, or a multipart upload of `image` parts."""
    return {"application/json": {"schema": {
                "type": "object", "title": "PredictImages", "required": ["images"], "additionalProperties": False,
                "properties": {"images": {"type": "array", "minItems": 1, "items": {
                    "type": "string", "format": "byte", "description": "a PNG or JPEG file, base64 (a `data:` URL "
                                                                       "prefix is allowed)"}}}}},
            "multipart/form-data": {"schema": {
                "type": "object", "title": "PredictUpload", "required": ["image"],
                "properties": {"image": {"type": "array", "items": {"type": "string", "format": "binary"},
                                         "description": "one or more PNG or JPEG files (curl -F image=@file.png)"}}}}}


def predict_operation(champion: Variant | None) -> dict:
    """The OpenAPI operation of POST /predict for this champion (a generic row when none is loaded)."""
    if champion is not None and champion.schema.is_image:
        return image_operation(champion)
    if champion is None:
        row: dict = {"type": "object", "description": "no champion is loaded yet: the columns are not known"}
        classes: dict = {"type": "string"}
        served = "no champion loaded"
    else:
        row = champion.decoder.row_type.model_json_schema(by_alias=True, ref_template="#/components/schemas/{model}")
        row["title"] = "PredictRow"
        classes = {"type": "string", "enum": list(champion.schema.classes)}
        served = f"champion v{champion.version}, {len(champion.schema.features)} columns"
    probabilities = {"type": "object", "description": "probability of each class",
                     "properties": {c: {"type": "number"} for c in classes.get("enum", [])}}
    answer = {"type": "object", "title": "PredictAnswer",
              "required": ["request_id", "variant", "version", "predictions"],
              "properties": {
                  "request_id": {"type": "string", "description": "also the x-request-id header"},
                  "variant": {"type": "string", "enum": ["champion", "challenger"]},
                  "version": {"type": "string"},
                  "served_ms": {"type": "number"},
                  "predictions": {"type": "array", "items": {"type": "object", "properties": {
                      "id": {"type": "string", "description": "<request_id>-<row index>: what /feedback names"},
                      "label": classes, "probabilities": probabilities}}}}}
    return {
        "summary": "Predict",
        "description": f"Scores raw rows with the champion (or, for a share of requests, the challenger). Schema from "
                       f"the serving model's contract ({served}); {ROWS_SHAPE}.",
        "operationId": "predict",
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "title": "PredictRequest", "required": ["rows"],
            "properties": {"rows": {"type": "array", "minItems": 1, "items": row}}}}}},
        "responses": {
            "200": {"description": "one prediction per row", "content": {"application/json": {"schema": answer}}},
            "400": _error("the body is not JSON", {"type": "string"}),
            "413": _error("the body is over serve.max_body_mb", {"type": "string"}),
            "422": _error("rows that break the contract: one problem per (row, field)",
                          {"anyOf": [{"type": "array", "items": PROBLEM}, {"type": "string"}]}),
            "503": _error("no champion is loaded yet", {"type": "string"})},
    }


def image_operation(champion: Variant) -> dict:
    """POST /predict of an image champion: images in (JSON base64 or an upload), one prediction per image out."""
    shape = champion.schema.image
    operation = predict_operation(None)
    answer = operation["responses"]["200"]["content"]["application/json"]["schema"]
    answer["properties"]["predictions"]["items"]["properties"]["label"] = {
        "type": "string", "enum": list(champion.schema.classes)}
    answer["properties"]["predictions"]["items"]["properties"]["probabilities"] = {
        "type": "object", "properties": {c: {"type": "number"} for c in champion.schema.classes}}
    operation["description"] = (f"Scores images with the champion (or, for a share of requests, the challenger): "
                                f"champion v{champion.version}, {shape.height}x{shape.width} {shape.mode}. Each image "
                                "is scaled to cover that size (aspect kept) and centre-cropped, and converted to its "
                                f"mode. {IMAGES_SHAPE}.")
    operation["requestBody"] = {"required": True, "content": image_request()}
    operation["responses"]["413"] = _error("the body is over serve.max_body_mb, or an image over images.max_file_mb "
                                           "or images.max_pixels (read from its header, before decoding)",
                                           {"type": "string"})
    operation["responses"]["422"] = _error("images that break the rules: one problem per image (decodable, "
                                           "min_side, base64), or a body of another shape",
                                           {"anyOf": [{"type": "array", "items": PROBLEM}, {"type": "string"}]})
    return operation


def contract_openapi(app: FastAPI, champion: Callable[[], Variant | None]) -> Callable[[], dict]:
    """`app.openapi`: FastAPI's document for the other routes, with /predict from `champion()`; rebuilt when
    the champion changes (an alias swap), reused otherwise."""
    cached: dict = {}

    def openapi() -> dict:
        current = champion()
        key = None if current is None else (current.version, id(current))
        if cached.get("key") != key or "document" not in cached:
            document = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            operation = predict_operation(current)
            if current is not None and not current.schema.is_image:   # a row's nested models under components
                document.setdefault("components", {}).setdefault("schemas", {}).update(
                    operation["requestBody"]["content"]["application/json"]["schema"]["properties"]["rows"]["items"]
                    .pop("$defs", {}))
            document["paths"]["/predict"] = {"post": operation}
            cached.update(key=key, document=document)
        return cached["document"]

    return openapi
