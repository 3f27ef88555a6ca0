"""`python -m serving`: run the service with uvicorn on 127.0.0.1 (see `torchship serve --help`)."""
from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from tasks.config import load_params


def main(argv: list[str] | None = None) -> None:
    params = load_params(os.environ.get("TORCHSHIP_PARAMS", "params.yaml"))
    parser = argparse.ArgumentParser(prog="python -m serving", description="Serve the registered champion "
                                     "(and a share of traffic to the challenger) over HTTP.")
    parser.add_argument("--host", default=params.serve.host, help="bind address (default: loopback only)")
    parser.add_argument("--port", type=int, default=params.serve.port)
    parser.add_argument("--model-name", default=params.data.registered_model_name())
    parser.add_argument("--challenger-share", type=float, default=params.serve.challenger_share)
    parser.add_argument("--poll-seconds", type=float, default=params.serve.poll_seconds)
    parser.add_argument("--request-log", default=params.serve.request_log)
    parser.add_argument("--seed", type=int, default=None, help="seed of the traffic split (reproducible canaries)")
    parser.add_argument("--shadow", action="store_true",
                        help="also score every request with the other variant and return it under 'shadow' (canary)")
    args = parser.parse_args(argv)

    import mlflow
    import uvicorn

    from serving.app import ServiceSettings, create_app

    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    mlflow.set_tracking_uri(params.tracking.resolved_uri())
    settings = ServiceSettings(model_name=args.model_name, challenger_share=args.challenger_share,
                               poll_seconds=args.poll_seconds,
                               request_log=Path(args.request_log) if args.request_log else None, seed=args.seed,
                               shadow=args.shadow)
    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
