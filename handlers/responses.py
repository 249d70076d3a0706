"""The answers handlers give; the engine acts on them (handlers never act themselves)."""

from __future__ import annotations

from enum import Enum


class StreamThreadExceptionResponse(Enum):
    """What to do when a stream thread dies of an exception (KIP-671)."""

    REPLACE_THREAD = "replace_thread"
    """Start a new thread in place of the failed one (the failed record is read again)."""
    SHUTDOWN_THREAD = "shutdown_thread"
    """Let only this thread die; the client goes to ERROR when no thread is left alive."""
    SHUTDOWN_CLIENT = "shutdown_client"
    """Shut down every thread of this client; the client goes to ERROR."""
    SHUTDOWN_APPLICATION = "shutdown_application"
    """Shut down every client of the application, in every process (via the group protocol)."""
