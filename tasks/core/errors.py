"""Errors a user can act on: each message names the problem and what to do."""


class TorchshipError(Exception):
    """Base of every error torchship reports as one paragraph, without a traceback."""

    exit_code = 2


class ConfigError(TorchshipError):
    """params.yaml or an override is wrong."""


class DataError(TorchshipError):
    """Input data breaks the contract: the message names file, line/column and rule."""


class GateFailed(TorchshipError):
    """A gate returned `fail` (or `warn` where the policy blocks)."""
