"""The serving bench's floor: a minimal FastAPI app a new user would write around the registered ONNX bytes.
One async route, a pydantic body, ONNX Runtime on the same file, one uvicorn worker (uvicorn's defaults: uvloop
and httptools when installed, as they are here). No validation beyond the body's shape, no routing, metrics or
log. ONNX Runtime gets 1 intra-op thread, as torchship's service does (serve.threads): the stronger peer on a
shared 2-core machine. An image model's graph (input `image`) gets `{"images": [base64 PNG or JPEG]}`: each
decoded with Pillow, converted to the model's mode and resized to its size, as a user would. A text model's graph
(input `text`, strings: the tokenizer is inside it) gets `{"texts": ["...", ...]}`, fed to it as they came.

Run: python bench/minimal_onnx_app.py MODEL.onnx PORT
"""
from __future__ import annotations

import sys

import numpy as np
import onnxruntime as ort
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel


class Body(BaseModel):
    rows: list[dict[str, float | str | None]]


def create_app(path: str) -> FastAPI:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    inputs = [(i.name, i.type == "tensor(double)") for i in session.get_inputs()]
    app = FastAPI()
    if [name for name, _ in inputs] == ["image"]:
        return image_routes(app, session)
    if [(i.name, i.type) for i in session.get_inputs()] == [("text", "tensor(string)")]:
        return text_routes(app, session)

    @app.post("/predict")
    async def predict(body: Body) -> dict:
        feed = {name: np.array([row[name] for row in body.rows], dtype=np.float64) if numeric
                else np.array(["" if row[name] is None else row[name] for row in body.rows], dtype=object)
                for name, numeric in inputs}
        return {"probabilities": session.run(["probabilities"], feed)[0].tolist()}

    return app


class Images(BaseModel):
    images: list[str]


def image_routes(app: FastAPI, session) -> FastAPI:
    import base64
    import io

    from PIL import Image

    _, height, width, channels = session.get_inputs()[0].shape
    mode = "L" if channels == 1 else "RGB"

    @app.post("/predict")
    async def predict(body: Images) -> dict:
        pixels = []
        for text in body.images:
            image = Image.open(io.BytesIO(base64.b64decode(text))).convert(mode).resize((width, height))
            array = np.asarray(image, dtype=np.uint8)
            pixels.append(array[:, :, None] if array.ndim == 2 else array)
        return {"probabilities": session.run(["probabilities"], {"image": np.stack(pixels)})[0].tolist()}

    return app


class Texts(BaseModel):
    texts: list[str]


def text_routes(app: FastAPI, session) -> FastAPI:
    @app.post("/predict")
    async def predict(body: Texts) -> dict:
        feed = {"text": np.array(body.texts, dtype=object)}
        return {"probabilities": session.run(["probabilities"], feed)[0].tolist()}

    return app


if __name__ == "__main__":
    uvicorn.run(create_app(sys.argv[1]), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
