"""Soak (opt-in: pytest -m soak): the probe client against the scripted server at a high
concurrency for minutes; reports the client's CPU and memory use and its timing error.

Settings from the environment: SOAK_CONCURRENCY (256), SOAK_SECONDS (300), SOAK_ITL_MS
(100), SOAK_TOKENS (32), SOAK_OUT (a JSON file for the figures; default: none).
"""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from specadapt.testing.load import soak

pytestmark = pytest.mark.soak


def test_soak(scripted_url):
    env = os.environ
    result = asyncio.run(soak(scripted_url, int(env.get("SOAK_CONCURRENCY", 256)), float(env.get("SOAK_SECONDS", 300)),
                              float(env.get("SOAK_ITL_MS", 100)), int(env.get("SOAK_TOKENS", 32))))
    text = json.dumps(result, indent=1)
    print("\nsoak:", text)
    if env.get("SOAK_OUT"):
        with open(env["SOAK_OUT"], "w") as fh:
            fh.write(text)
    assert result["requests_failed"] == 0, result["failures"]
    assert result["requests_ok"] > 0
    first, last, _peak = result["client_rss_mib_first_last_max"]
    assert last - first < 100, "client memory grew by more than 100 MiB during the soak"
