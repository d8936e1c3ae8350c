"""The one error type of gpuml.training for a failed peer (kept apart to avoid import cycles)."""


class PeerFailureError(RuntimeError):
    """Another worker died, hung or failed: a collective or remote call could not complete.

    Raised instead of the backend's own message (gloo's "Connection closed by peer",
    TensorPipe's "pipe closed") so that the message says which step, level or call and which
    ranks or workers were involved, and how long the timeout was.
    """
