"""The warnings and errors that more than one part of gpuml raises.

They live here, at the bottom of the package's layers, so that every module
may raise them without importing the module of another.
"""


class PartitionWarning(UserWarning):
    """A partitioned fit whose parts are a poor fit for the data (the message says why).

    Raised as a warning, never an error: the model is fitted and usable, but its
    accuracy is likely far from the one-part model's. Silence it with
    ``warnings.filterwarnings("ignore", category=gpuml.PartitionWarning)``.
    """


class PeerFailureError(RuntimeError):
    """Another worker died, hung or failed: a collective or remote call could not complete.

    Raised instead of the backend's own message (gloo's "Connection closed by peer",
    TensorPipe's "pipe closed") so that the message says which step, level or call and which
    ranks or workers were involved, and how long the timeout was.
    """
