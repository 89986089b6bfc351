"""Errors a user can cause. The CLI prints them as one line and exits non-zero."""


class DraftsmithError(Exception):
    """A problem with the user's input (model, data, files): one line, exit 1."""

    exit_code = 1


class ConfigError(DraftsmithError):
    """A problem with the config or a CLI override: one line naming the key, exit 2."""

    exit_code = 2
