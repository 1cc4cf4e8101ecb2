"""User-facing errors: each carries a message a person can act on; the CLI prints it and exits non-zero."""


class DpDistillError(Exception):
    """Base class of every error the CLI turns into a clear message and a non-zero exit."""


class DatasetError(DpDistillError):
    """A dataset is missing, malformed, or of the wrong shape."""


class CheckpointError(DpDistillError):
    """A checkpoint is missing, corrupt, or does not belong to the expected model."""


class PrivacyParameterError(DpDistillError):
    """Privacy parameters are impossible (eps <= 0, delta outside (0, 1), k out of range, ...)."""


class BudgetExceededError(DpDistillError):
    """A plan or a query would spend more privacy budget than was granted."""


class ConfigError(DpDistillError):
    """A configuration value is invalid."""


class DistributedError(DpDistillError):
    """A process of a run on several processes failed (every other process of the run is then stopped)."""


class Note(UserWarning):
    """A change a run made that its user should know of (a layer of their model replaced): the CLI prints it as one
    `note:` line on stderr, the report keeps it."""
