"""The homagg exception tree.

Every error homagg raises derives from :class:`HomAggError`, so callers can catch one type::

    HomAggError
    ├── ConfigError            invalid options, scheme names, world sizes, link parameters
    │   └── AuthenticationError  a switch refused a control request: missing or wrong shared secret
    ├── InputError             a tensor homagg cannot aggregate
    │   ├── NonFiniteError     NaN or Inf in an input (raised before anything is sent)
    │   └── IntegerOverflowError  an integer SUM whose exact result does not fit the dtype
    ├── ProtocolError          workers disagree, or a combined stream is malformed
    │   └── RankMismatchError  ranks called a collective on different sizes/dtypes/options
    ├── WireFormatError        a datagram does not parse as a homagg packet
    └── TransportError         the switch could not be reached or did not answer
        ├── SwitchTimeoutError  a bounded wait ran out (names job, slot/offset, missing workers)
        ├── RankTimeoutError    ranks of a process group did not arrive in time (``ranks``)
        └── GroupCreationError  a homagg process group could not be created on every rank

Warnings (not errors: nothing failed for the caller)::

    PathWarning (UserWarning)  a process group changed path: the switch failed and its collectives
                               continue on the host path (gloo), or the switch is back
"""

from __future__ import annotations

__all__ = [
    "HomAggError",
    "ConfigError",
    "AuthenticationError",
    "InputError",
    "NonFiniteError",
    "IntegerOverflowError",
    "ProtocolError",
    "RankMismatchError",
    "WireFormatError",
    "TransportError",
    "SwitchTimeoutError",
    "RankTimeoutError",
    "GroupCreationError",
    "PathWarning",
]


class HomAggError(Exception):
    """Root of every error raised by homagg."""


class ConfigError(HomAggError, ValueError):
    """An option, scheme name or parameter is invalid."""


class AuthenticationError(ConfigError):
    """A switch refused a control request: it carried no shared secret, or the wrong one."""


class InputError(HomAggError, ValueError):
    """An input tensor cannot be aggregated (dtype, shape mismatch, ...)."""


class NonFiniteError(InputError):
    """An input holds NaN or +-Inf; raised before any word is sent."""


class IntegerOverflowError(InputError, OverflowError):
    """The exact sum of integer inputs does not fit the input dtype."""


class ProtocolError(HomAggError):
    """Workers or streams are inconsistent (e.g. different shapes, short combined stream)."""


class RankMismatchError(ProtocolError):
    """Ranks disagree about a collective (tensor size, dtype, scheme, world size); raised on every
    rank within the call's first round trip, naming each field's range over the ranks."""


class WireFormatError(HomAggError):
    """Bytes that do not form a valid homagg packet."""


class TransportError(HomAggError, ConnectionError):
    """The switch could not be reached, or answered something unusable."""


class SwitchTimeoutError(TransportError, TimeoutError):
    """A bounded network wait ran out; the message names what was missing."""


class RankTimeoutError(TransportError, TimeoutError, RuntimeError):
    """Ranks of a process group did not arrive within a bounded wait (``monitored_barrier``).

    Also a ``RuntimeError``, as gloo's ``monitored_barrier`` failure is (code written for gloo
    catches it unchanged).

    ``ranks`` names them (group ranks, ascending); the message names them too.
    """

    def __init__(self, message: str = "", ranks: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.ranks = tuple(ranks)


class GroupCreationError(TransportError):
    """Creating a homagg process group failed on this rank: a peer died or never registered, the
    rendezvous store or the switch went away.  ``ranks`` names the group ranks known not to have
    finished registering (empty when the store could not tell); the cause is chained.
    """

    def __init__(self, message: str = "", ranks: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.ranks = tuple(ranks)


class PathWarning(UserWarning):
    """A homagg process group changed path (switch -> host after a switch failure, host -> switch
    when it is back); issued once per transition on every rank, with the cause."""
