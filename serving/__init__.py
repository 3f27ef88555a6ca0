"""The inference service: champion + challenger ONNX variants behind one FastAPI app."""
