"""Reading a speculative config the user gives as vLLM's own JSON (inline or a file)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from specadapt.errors import UsageError


def load_spec_json(value: str) -> dict[str, Any]:
    """``--spec-config`` value -> dict: inline JSON (starts with '{') or a .json/.yaml file."""
    text = value.strip()
    if text.startswith("{"):
        source = "--spec-config"
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(
                f"--spec-config is not valid JSON ({exc.msg} at column {exc.colno}): "
                'give a JSON object such as \'{"method": "ngram", "num_speculative_tokens": 4}\' or a file path'
            ) from exc
    else:
        path = Path(text).expanduser()
        source = str(path)
        if not path.is_file():
            raise UsageError(f"--spec-config {text!r} is neither a JSON object nor an existing file")
        try:
            data = yaml.safe_load(path.read_text())  # YAML is a superset of JSON
        except yaml.YAMLError as exc:
            raise UsageError(f"{path} is not valid JSON or YAML: {str(exc).splitlines()[0]}") from exc
        if isinstance(data, dict) and isinstance(data.get("speculative_config"), dict):
            data = data["speculative_config"]  # a whole vLLM YAML config file
    if not isinstance(data, dict):
        raise UsageError(f"{source} must hold a JSON object (a mapping), not {type(data).__name__}")
    return data
