"""/predict's OpenAPI, generated from the serving champion: its request, as its modality's serving part documents it
(a table's row is the same pydantic model that words the 422s: every column, its type, range, category set and
nullability), and its answer (the model's classes). /predict is answered outside FastAPI's body parsing
(serving/front.py), so FastAPI cannot infer this; the document is rebuilt whenever a different champion is swapped
in."""
from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from serving.variants import Variant
from tasks.modalities import modality_of, serving_part

PROBLEM = {"type": "object", "properties": {
    "row": {"type": "integer", "description": "index of the row in `rows`"},
    "field": {"type": "string", "description": "the column (or `(row)` when the row itself is no object)"},
    "rule": {"type": "string", "description": "the rule broken, e.g. missing, less_than_equal, literal_error, "
                                             "finite_number, float32_range, extra_forbidden"},
    "message": {"type": "string"}}}


def _error(description: str, detail: dict) -> dict:
    return {"description": description, "content": {"application/json": {"schema": {
        "type": "object", "properties": {"detail": detail, "request_id": {"type": "string"}}}}}}


def predict_operation(champion: Variant | None) -> dict:
    """The OpenAPI operation of POST /predict for this champion: its modality's request (a table's row, an image
    upload, ...: its serving part documents it), one prediction per item out (a generic request when none is
    loaded)."""
    request = serving_part(modality_of(champion.schema).name).document(champion) if champion is not None else {
        "description": "no champion is loaded yet: its request is not known.", "items": "item", "components": {},
        "content": {"application/json": {"schema": {"type": "object", "title": "PredictRequest"}}},
        "too_large": "the body is over serve.max_body_mb", "refused": "items that break the model's rules"}
    classes = {"type": "string", "enum": list(champion.schema.classes)} if champion is not None else {"type": "string"}
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
                      "id": {"type": "string", "description": f"<request_id>-<{request['items']} index>: what "
                                                              "/feedback names"},
                      "label": classes, "probabilities": probabilities}}}}}
    served = f" (champion v{champion.version})" if champion is not None else ""
    return {
        "summary": "Predict",
        "description": f"Scores with the champion{served} (or, for a share of requests, the challenger): "
                       + request["description"],
        "operationId": "predict",
        "requestBody": {"required": True, "content": request["content"]},
        "responses": {
            "200": {"description": f"one prediction per {request['items']}",
                    "content": {"application/json": {"schema": answer}}},
            "400": _error("the body is not JSON", {"type": "string"}),
            "413": _error(request["too_large"], {"type": "string"}),
            "422": _error(request["refused"], {"anyOf": [{"type": "array", "items": PROBLEM}, {"type": "string"}]}),
            "503": _error("no champion is loaded yet", {"type": "string"})},
        "x-components": request["components"],
    }


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
            components = operation.pop("x-components")   # a request's nested models (a table row's)
            if components:
                document.setdefault("components", {}).setdefault("schemas", {}).update(components)
            document["paths"]["/predict"] = {"post": operation}
            cached.update(key=key, document=document)
        return cached["document"]

    return openapi
