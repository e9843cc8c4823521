from __future__ import annotations

import io
import json
import logging

from kratos_admit.edge.logs import configure_logging


def test_log_lines_are_json_with_the_extra_fields():
    stream = io.StringIO()
    configure_logging("INFO", stream)
    logging.getLogger("kratos.webhook").info(
        "admission", extra={"uid": "u-1", "outcome": "denied", "violations": ["x (gpu-count)"]}
    )
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("kratos.webhook").exception("failed")
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["msg"] == "admission" and first["uid"] == "u-1" and first["violations"] == ["x (gpu-count)"]
    assert first["level"] == "info" and first["logger"] == "kratos.webhook"
    assert first["ts"].endswith("Z") and len(first["ts"]) == len("2026-11-22T10:00:00.000Z")
    assert "ValueError: boom" in second["exception"]
