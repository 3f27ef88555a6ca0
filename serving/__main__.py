"""`python -m serving`: run the service with uvicorn on 127.0.0.1 (see `torchship serve --help`).
Flags override the `serve` params section for this run only; they are validated like params."""
from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from pydantic import ValidationError

from tasks.config import Params, ServeParams, load_params

# The serve params a flag may override for one run (`--request-log ""` turns the log off, as the canary does).
SERVE_FLAGS = ("host", "port", "challenger_share", "poll_seconds", "request_log")


def parse_args(params: Params, argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m serving", description="Serve the registered champion "
                                     "(and a share of traffic to the challenger) over HTTP.")
    for name in SERVE_FLAGS:  # flag, type and help come from the params field: defaults live in one place
        field = ServeParams.model_fields[name]
        parser.add_argument(f"--{name.replace('_', '-')}", type=field.annotation,
                            help=f"{field.description} Default: serve.{name} = {getattr(params.serve, name)!r}.")
    parser.add_argument("--model-name", default=params.data.registered_model_name(),
                        help="registered model to serve (default: from data params)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the traffic split (reproducible canaries)")
    parser.add_argument("--shadow", action="store_true",
                        help="also score every request with the other variant and return it under 'shadow' (canary)")
    parser.add_argument("--model-file", type=Path, default=None,
                        help="serve this local ONNX file as the champion instead of the registry's: no alias poller, "
                             "no request log (how bless tries a candidate before it is registered)")
    return parser.parse_args(argv)


def serve_params(serve: ServeParams, args: argparse.Namespace) -> ServeParams:
    """The `serve` section with the flags given on the command line applied and validated."""
    flags = {name: getattr(args, name) for name in SERVE_FLAGS if getattr(args, name) is not None}
    try:
        return ServeParams.model_validate({**serve.model_dump(), **flags})
    except ValidationError as exc:
        raise SystemExit(f"python -m serving: invalid option: {exc}") from None


def main(argv: list[str] | None = None) -> None:
    params = load_params(os.environ.get("TORCHSHIP_PARAMS", "params.yaml"))
    args = parse_args(params, argv)
    serve = serve_params(params.serve, args)

    import uvicorn

    from serving.app import create_app
    from serving.service import ServiceSettings

    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    settings = ServiceSettings(serve=serve, model_name=args.model_name, tracking=params.tracking, seed=args.seed,
                               shadow=args.shadow, model_file=args.model_file)
    uvicorn.run(create_app(settings), host=serve.host, port=serve.port, log_level="warning")


if __name__ == "__main__":
    main()
