"""`ServeOptions`: how `gpt1 serve` runs, as one value checked where it is built.

`gpt1.cli.serve` builds it from the command's flags, a program by keyword; `serve` and
`create_app` take it whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpt1.errors import ConfigError
from gpt1.serve.schemas import Limits
from gpt1.serve.security import Security


@dataclass(frozen=True)
class ServeOptions:
    """The server's settings, each the `gpt1 serve` flag of its name with the flag's default.

    `security`: the address, port and who may use the server; `limits`: what one request may
    take; `threads`: "auto" or a count (`gpt1.threads`; None keeps torch's);
    `batch_wait_ms`: how long a batch waits for more requests; `request_timeout`: seconds a
    request may take to arrive; `max_connections`: open connections (None: no bound, as
    `request_timeout`); `graceful_timeout`: seconds SIGTERM waits for requests in flight (None:
    no limit); `served_model_name`: what the OpenAI endpoints call the model (None: its run's
    name); the playground page at `/` unless `with_playground` is false.
    """

    security: Security = field(default_factory=Security)
    limits: Limits = field(default_factory=Limits)
    device: str = "auto"
    precision: str = "auto"
    threads: str | int | None = None
    batch_tokens: int = 8192
    batch_items: int = 16
    batch_wait_ms: float = 2.0
    max_queue: int = 1024
    max_generations: int | None = None  # None: `generations_for(precision)`
    request_timeout: float | None = 10.0
    max_connections: int | None = 512
    graceful_timeout: float | None = None
    served_model_name: str | None = None
    with_playground: bool = True

    def generations_for(self, precision: str) -> int:
        """Generations decoded together: `max_generations`, else by the model's precision. An
        int8 model's aggregate tokens/s keeps growing to 32 rows a step on 2 cores (its
        integer step multiplies them on int8 instructions); bf16 and fp32 level off by 16
        (`python benchmarks/concurrency.py`: docs/results.md)."""
        if self.max_generations is not None:
            return self.max_generations
        return 32 if precision == "int8" else 16

    def __post_init__(self) -> None:
        for name in ("max_items", "max_new_tokens", "max_body_bytes"):
            if getattr(self.limits, name) < 1:
                flag = f"--{name.replace('_', '-')}"
                raise ConfigError(f"{flag} must be >= 1, got {getattr(self.limits, name)}")
        if not 0 <= self.security.port <= 65535:
            raise ConfigError(f"--port must be in 0..65535, got {self.security.port}")
        for flag, value in (
            ("--batch-tokens", self.batch_tokens),
            ("--batch-items", self.batch_items),
            ("--max-queue", self.max_queue),
            ("--max-generations", 1 if self.max_generations is None else self.max_generations),
            ("--max-connections", 1 if self.max_connections is None else self.max_connections),
        ):
            if value < 1:
                raise ConfigError(f"{flag} must be >= 1, got {value}")
        if self.batch_wait_ms < 0:
            raise ConfigError(f"--batch-wait-ms must be >= 0, got {self.batch_wait_ms}")
        if self.request_timeout is not None and not self.request_timeout > 0:
            raise ConfigError(f"--request-timeout must be > 0 seconds, got {self.request_timeout}")
        # The queue must hold the largest request the limits allow, or that request could
        # never be answered (a 503 forever).
        if self.max_queue < self.limits.max_items:
            raise ConfigError(
                f"--max-queue {self.max_queue} is less than --max-items {self.limits.max_items}: "
                "a request of --max-items items could never be queued; raise --max-queue or "
                "lower --max-items"
            )
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise ConfigError("--served-model-name must not be empty")
