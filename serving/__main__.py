"""`python -m serving`: run the service with uvicorn on 127.0.0.1 (see `torchship serve --help`).
Flags override the `serve` params section for this run only; they are validated like params."""
from __future__ import annotations

import argparse
import logging
import os
import tempfile
from dataclasses import replace
from pathlib import Path

from pydantic import ValidationError

from tasks.config import load_params
from tasks.core.env import DEFAULT_PARAMS, PARAMS_ENV, SERVE_SETTINGS_ENV, TELEMETRY_OFF, set_defaults
from tasks.core.params_spec import Params, ServeParams
from tasks.modalities import modality_sections

# The serve params a flag may override for one run (`--request-log ""` turns the log off; `--ship-to ""` keeps it on
# this host, as the canary's own service does: replayed rows are not production traffic).
SERVE_FLAGS = ("host", "port", "challenger_share", "poll_seconds", "request_log", "workers", "ship_to")


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


def configure_logging() -> None:
    set_defaults(TELEMETRY_OFF)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(process)d %(name)s: %(message)s")
    logging.getLogger("mlflow").setLevel(logging.WARNING)


def worker_app():
    """The app of one worker process (uvicorn's factory when serve.workers > 1), from the parent's settings."""
    from serving.app import create_app
    from serving.service import ServiceSettings

    configure_logging()
    return create_app(ServiceSettings.from_json(os.environ[SERVE_SETTINGS_ENV]))


def main(argv: list[str] | None = None) -> None:
    params = load_params(os.environ.get(PARAMS_ENV, DEFAULT_PARAMS))
    args = parse_args(params, argv)
    serve = serve_params(params.serve, args)

    import uvicorn

    from serving.app import create_app
    from serving.service import ServiceSettings
    from serving.variants import SharedShare

    configure_logging()
    settings = ServiceSettings(serve=serve, model_name=args.model_name, tracking=params.tracking, seed=args.seed,
                               host=modality_sections(params), model_file=args.model_file)
    # uvloop and httptools: the C event loop and HTTP parser (bench/results/serving.json); no access log (a line
    # per request on the loop; the request log and metrics already account for every request).
    server = {"host": serve.host, "port": serve.port, "log_level": "warning", "access_log": False, "loop": "uvloop",
              "http": "httptools"}
    if serve.workers == 1:
        uvicorn.run(create_app(settings), **server)
        return
    # Each worker loads the models, polls the aliases and appends to the request log itself (the log's writes are
    # locked across processes); the challenger share lives in a file they all map, so /admin/share moves them all.
    with tempfile.TemporaryDirectory(prefix="torchship-serve-") as folder:
        share = SharedShare.create(Path(folder) / "share", serve.challenger_share)
        os.environ[SERVE_SETTINGS_ENV] = replace(settings, share_file=share).to_json()
        uvicorn.run("serving.__main__:worker_app", factory=True, workers=serve.workers, **server)


if __name__ == "__main__":
    main()
