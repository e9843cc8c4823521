"""The floor the benchmark compares against: ``kratos_admit.webhook.floor`` (kept here under its old name).

.venv/bin/python bench/noop_webhook.py --listen 127.0.0.1:8443 --tls-cert tls.crt --tls-key tls.key [--event-loop uvloop]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kratos_admit.webhook.floor import main

if __name__ == "__main__":
    main()
