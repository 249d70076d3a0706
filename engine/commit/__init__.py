"""The commit: one protocol (``protocol.py``), at-least-once and exactly-once behind it."""

from .at_least_once import AtLeastOnce, Committer
from .exactly_once import EOS_TRANSACTION_TIMEOUT_MS, ExactlyOnce, TransactionalCommitter, transactional_id
from .protocol import CommitProtocol, CommitResult, CommitStatus

__all__ = [
    "EOS_TRANSACTION_TIMEOUT_MS",
    "AtLeastOnce",
    "CommitProtocol",
    "CommitResult",
    "CommitStatus",
    "Committer",
    "ExactlyOnce",
    "TransactionalCommitter",
    "transactional_id",
]
