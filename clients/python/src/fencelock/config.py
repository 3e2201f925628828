"""Client configuration (the same fields and defaults as the Rust client's
``ClientConfig``, docs/client.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

from .errors import InvalidConfigError

MAX_ENDPOINTS = 16
MAX_CALL_TIMEOUT_MS = 600_000
MAX_WAIT_TIMEOUT_MS = 300_000
MAX_STOP_BY_MARGIN_PERCENT = 50
MAX_REQUEST_ID_LEN = 64
#: Largest value a lease may publish (lock.proto ``AcquireRequest.value``).
MAX_VALUE_LEN = 4096
#: Most permits of a semaphore (lock.proto ``AcquireRequest.permits``).
MAX_PERMITS = 1024


@dataclass(frozen=True)
class TlsConfig:
    """Mutual TLS (docs/security.md): trust ``ca_pem``, present the client
    certificate whose URI SAN ``spiffe://fencelock/tenant/<tenant>/<name>``
    is the caller's identity."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes = field(repr=False)

    @classmethod
    def from_files(
        cls, ca: Union[str, Path], cert: Union[str, Path], key: Union[str, Path]
    ) -> "TlsConfig":
        try:
            return cls(Path(ca).read_bytes(), Path(cert).read_bytes(), Path(key).read_bytes())
        except OSError as e:
            raise InvalidConfigError(f"cannot read TLS file: {e}") from e


@dataclass(frozen=True)
class ClientConfig:
    #: Deadline of one call, retries included (+ the wait for an acquire).
    call_timeout_ms: int = 10_000
    #: Deadline of one attempt of a call that does not wait.
    attempt_timeout_ms: int = 3_000
    #: Opening a connection.
    connect_timeout_ms: int = 2_000
    #: First backoff step when the server suggests none.
    backoff_base_ms: int = 50
    #: Largest backoff step.
    backoff_max_ms: int = 2_000
    #: The stop-by margin, in percent of the TTL.
    stop_by_margin_percent: int = 5
    #: Mutual TLS; None = plaintext (a cluster in insecure dev mode).
    tls: Optional[TlsConfig] = None

    def validate(self) -> None:
        def check(name: str, value: int, lo: int, hi: int) -> None:
            if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
                raise InvalidConfigError(f"{name} = {value!r} is outside {lo}..={hi}")

        check("call_timeout_ms", self.call_timeout_ms, 1, MAX_CALL_TIMEOUT_MS)
        check("attempt_timeout_ms", self.attempt_timeout_ms, 1, self.call_timeout_ms)
        check("connect_timeout_ms", self.connect_timeout_ms, 1, self.call_timeout_ms)
        check("backoff_max_ms", self.backoff_max_ms, 1, self.call_timeout_ms)
        check("backoff_base_ms", self.backoff_base_ms, 1, self.backoff_max_ms)
        check("stop_by_margin_percent", self.stop_by_margin_percent, 1, MAX_STOP_BY_MARGIN_PERCENT)
