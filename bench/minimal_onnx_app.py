"""The serving bench's floor: a minimal FastAPI app a new user would write around the registered ONNX bytes.
One async route, a pydantic body, ONNX Runtime on the same file, one uvicorn worker (uvicorn's defaults: uvloop
and httptools when installed, as they are here). No validation beyond the body's shape, no routing, metrics or
log. ONNX Runtime gets 1 intra-op thread, as torchship's service does (serve.threads): the stronger peer on a
shared 2-core machine.

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

    @app.post("/predict")
    async def predict(body: Body) -> dict:
        feed = {name: np.array([row[name] for row in body.rows], dtype=np.float64) if numeric
                else np.array(["" if row[name] is None else row[name] for row in body.rows], dtype=object)
                for name, numeric in inputs}
        return {"probabilities": session.run(["probabilities"], feed)[0].tolist()}

    return app


if __name__ == "__main__":
    uvicorn.run(create_app(sys.argv[1]), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
