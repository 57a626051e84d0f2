"""Control-plane settings, read from the environment with the prefix `ADAPTERPLANE_`.

Every path-like default derives from `data_dir` (default `./var`), so the embedded
default needs no configuration at all: SQLite database, file object store and a
SQLite-backed Celery broker/result backend all live under that one directory.

Outside development/test, settings that still carry well-known default secrets are
refused at start-up (`InsecureSettings`). `file://` imports are off unless asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

Environment = Literal["development", "test", "staging", "production"]

KNOWN_DEFAULT_SECRETS = frozenset(
    {"", "changethis", "changeme", "secret", "password", "adapterplane", "minioadmin",
     "testing", "postgres"}
)


class InsecureSettings(Exception):
    """A non-development environment was configured with a default secret."""


class Settings(BaseSettings):
    """All knobs of the control plane (API, worker, migrations)."""

    model_config = SettingsConfigDict(env_prefix="ADAPTERPLANE_", extra="ignore",
                                      use_attribute_docstrings=True)

    environment: Environment = "development"
    """Deployment environment; outside `development`/`test` default secrets are refused at
    start-up."""
    data_dir: Path = Path("./var")
    """Directory of the embedded stores: the default database, object store and Celery
    broker/result backend all live under it (created on first use)."""

    database_url: str = ""
    """SQLAlchemy URL; default `sqlite:///<data_dir>/adapterplane.db`. Postgres:
    `postgresql+psycopg://user:pass@host/db` (`postgresql://` is accepted too)."""
    database_pool_size: int = Field(default=20, ge=1)
    """Connection pool size of the API's database engine (as many again may overflow);
    SQLite ignores it."""

    storage_url: str = ""
    """`file:///abs/dir` or `s3://bucket[/prefix]`; default `file://<data_dir>/objects`."""
    s3_bucket: str = ""
    """Convenience: when set and `storage_url` is empty, storage is `s3://<s3_bucket>`."""
    s3_endpoint_url: str | None = None
    """S3 endpoint for S3-compatible stores (MinIO, moto; path-style addressing when set);
    unset: AWS."""
    s3_region: str = "us-east-1"
    """Region of the S3 client."""
    s3_access_key_id: str | None = None
    """S3 access key id; unset: boto3's default credential chain."""
    s3_secret_access_key: SecretStr | None = None
    """S3 secret access key (with `s3_access_key_id`); refused outside development/test
    when it is a well-known default."""
    s3_retry_mode: Literal["standard", "adaptive"] = "standard"
    """botocore retry mode of the S3 client (exponential backoff; `adaptive` adds
    client-side rate limiting)."""
    s3_max_attempts: int = Field(default=5, ge=1)
    """Attempts per S3 call, the first included (botocore `max_attempts`)."""
    s3_multipart_chunk_bytes: int = Field(default=8 * 1024 * 1024, ge=5 * 1024 * 1024)
    """Part size of multipart uploads to S3 (S3's minimum part is 5 MiB)."""

    celery_broker_url: str = ""
    """Default `sqla+sqlite:///<data_dir>/celery-broker.db`; e.g. `redis://host:6379/0`."""
    celery_result_backend: str = ""
    """Default `db+sqlite:///<data_dir>/celery-results.db`."""
    celery_queue: str = "adapterplane"
    """Celery queue the API sends jobs to and the worker consumes."""
    celery_task_always_eager: bool = False
    """Run jobs inline in the sending process (tests/debugging only)."""
    validation_max_retries: int = Field(default=8, ge=0)
    """Retries of a job (artifact validation, collection fit) after a transient fault (a
    storage error, a lost or refused database connection) before the attempt fails; its
    row then waits for the reaper (`job_reap_after_s`)."""
    validation_retry_backoff_s: int = Field(default=1, ge=1)
    """First retry delay in seconds; doubles per retry (`backoff_s * 2**retries`)."""
    validation_retry_backoff_max_s: int = Field(default=60, ge=1)
    """Cap on the retry delay in seconds."""
    job_time_limit_s: int = Field(default=1800, ge=1)
    """Hard time limit of one job attempt (validation, fit), in seconds (enforced by the
    prefork pool: an attempt that runs longer is killed, its row stays busy and the reaper
    sends the job again)."""
    job_visibility_margin_s: int = Field(default=300, ge=1)
    """Seconds added to `job_time_limit_s` to make the broker's visibility timeout (Redis):
    a job whose worker died is delivered again that long after it was taken."""
    job_reap_after_s: int = Field(default=3600, ge=1)
    """A job row still `pending`/`validating` (`pending`/`fitting`) this many seconds after
    it was created, or after the reaper last sent it again, gets its job sent again; keep
    it above `job_time_limit_s + job_visibility_margin_s`."""
    job_reap_interval_s: int = Field(default=300, ge=0)
    """How often a worker runs the reaper (and once at start), in seconds; 0: never."""

    gc_grace_s: int = Field(default=24 * 3600, ge=0)
    """Blob garbage collection removes an unreferenced blob only when it was last written
    this many seconds ago and no push or fit leased it within as long; keep it above the
    longest push or fit (`job_time_limit_s`)."""
    gc_interval_s: int = Field(default=3600, ge=0)
    """How often Celery beat (`adapterplane worker --beat`) runs blob garbage collection,
    in seconds; 0: never (`POST /v1/gc` still runs it on demand)."""

    max_artifact_bytes: int = Field(default=2 * 1024**3, ge=1)
    """Upper bound on the sum of an artifact's file sizes (push and validation)."""
    max_rank: int = Field(default=256, ge=1)
    """Largest LoRA rank validation accepts; a higher-rank artifact is rejected."""
    allow_file_uri_import: bool = False
    """Whether pushes may name `file://` URIs the API server reads (only directories under
    `file_import_roots`); off by default, since the server would read its own disk on a
    caller's behalf. The embedded demo turns it on for its own adapter directory."""
    file_import_roots: list[Path] = Field(default_factory=list)
    """Absolute directories a `file://` import may read from (the resolved directory must
    lie inside one); empty: no `file://` import is allowed even when enabled."""
    max_json_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    """Upper bound on a request body that is not an artifact upload (JSON), enforced while
    it streams in, chunked or not (413 REQUEST_TOO_LARGE)."""

    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Level of the API's structlog JSON lines on stderr (one `request` line per request
    at info)."""

    api_host: str = "127.0.0.1"
    """Address `adapterplane api` binds (its `--host` overrides it)."""
    api_port: int = 8400
    """Port `adapterplane api` listens on (its `--port` overrides it)."""

    @model_validator(mode="after")
    def _derive_defaults(self) -> Settings:
        data = self.data_dir
        if not self.database_url:
            self.database_url = f"sqlite:///{data / 'adapterplane.db'}"
        if not self.storage_url:
            self.storage_url = (
                f"s3://{self.s3_bucket}" if self.s3_bucket
                else f"file://{(data / 'objects').resolve()}"
            )
        if not self.celery_broker_url:
            self.celery_broker_url = f"sqla+sqlite:///{data / 'celery-broker.db'}"
        if not self.celery_result_backend:
            self.celery_result_backend = f"db+sqlite:///{data / 'celery-results.db'}"
        if not self.is_development:
            self._refuse_default_secrets()
        return self

    @field_validator("file_import_roots")
    @classmethod
    def _absolute_roots(cls, roots: list[Path]) -> list[Path]:
        relative = [str(r) for r in roots if not r.is_absolute()]
        if relative:
            raise ValueError(f"file_import_roots must be absolute directories: {relative}")
        return roots

    @property
    def is_development(self) -> bool:
        return self.environment in ("development", "test")

    def _refuse_default_secrets(self) -> None:
        from sqlalchemy.engine import make_url

        url = make_url(self.database_url)
        if url.get_backend_name() != "sqlite" and (url.password or "") in KNOWN_DEFAULT_SECRETS:
            raise InsecureSettings(
                f"environment={self.environment}: database password is a default secret"
            )
        if self.s3_secret_access_key is not None and (
            self.s3_secret_access_key.get_secret_value() in KNOWN_DEFAULT_SECRETS
        ):
            raise InsecureSettings(
                f"environment={self.environment}: s3_secret_access_key is a default secret"
            )
