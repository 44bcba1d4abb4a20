"""YAML output for configs: no anchors/aliases, multi-line strings as literal blocks."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:  # readable files: repeat, never alias
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(data: Any) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=100)


def dump_all(docs: Iterable[Any]) -> str:
    return yaml.dump_all(list(docs), Dumper=_Dumper, sort_keys=False, width=100)
