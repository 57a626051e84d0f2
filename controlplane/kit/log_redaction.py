"""Secrets in URLs never reach a log line.

A presigned S3 GET carries its credential in the query string (`X-Amz-Signature`,
`X-Amz-Credential`, `X-Amz-Security-Token`; `Signature` and `AWSAccessKeyId` in the
older form) and is a bearer credential for its whole lifetime. Libraries log URLs on
their own (httpx logs every request at INFO, uvicorn's access log the path with its
query), so redaction sits where every record is made, not at each call site:
`install_log_redaction()` wraps the stdlib log record factory once per process, and the
API's structlog processor (kit/request_log.py) applies `redact_url_secrets` too.
"""

from __future__ import annotations

import logging
import re
from typing import Any

REDACTED = "[redacted]"
URL_SECRET_PARAMS = ("X-Amz-Signature", "X-Amz-Credential", "X-Amz-Security-Token",
                     "Signature", "AWSAccessKeyId", "x-amz-security-token")
_URL_SECRET = re.compile(
    r"(?i)(?<![A-Za-z0-9-])(" + "|".join(re.escape(p) for p in URL_SECRET_PARAMS)
    + r")=[^&\s\"'<>]*")
_installed = False


def redact_url_secrets(text: str) -> str:
    """`text` with the value of every signing query parameter replaced by REDACTED."""
    if "=" not in text:
        return text
    return _URL_SECRET.sub(lambda m: f"{m.group(1)}={REDACTED}", text)


def install_log_redaction() -> None:
    """Make every stdlib log record of this process carry redacted text (idempotent)."""
    global _installed
    if _installed:
        return
    make_record = logging.getLogRecordFactory()

    def redacting_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a malformed call: leave it to the handler to report
            return record
        redacted = redact_url_secrets(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return record

    logging.setLogRecordFactory(redacting_record)
    _installed = True
