"""TOML reading for the probe: tomllib where it exists (Python 3.11+), else a subset.

Nodes on Python 3.9/3.10 (Debian 11, Ubuntu 22.04, RHEL 9) have no tomllib, and
shipping a TOML library would double the payload. Container runtime configs
(containerd, CRI-O) written by their own `config default` and by nvidia-ctk use
only: [table."quoted".headers], `key = value` with strings, booleans, numbers and
arrays of those, and comments. That subset is what the fallback reads; anything
else raises TomlError, which the probe reports as data.
"""

from __future__ import annotations

import json
import re

try:
    import tomllib  # novermin: the subset below stands in for it before 3.11
except ImportError:  # Python < 3.11
    tomllib = None


class TomlError(ValueError):
    pass


_KEY_PART = re.compile(r'\s*(?:"((?:[^"\\]|\\.)*)"|\'([^\']*)\'|([A-Za-z0-9_-]+))\s*(\.|$)')
_NUMBER = re.compile(r"^[+-]?[\d_]+(\.[\d_]+)?([eE][+-]?\d+)?$")


def _keys(text: str, line_no: int) -> list[str]:
    keys, pos = [], 0
    while pos < len(text):
        match = _KEY_PART.match(text, pos)
        if not match:
            raise TomlError(f"line {line_no}: cannot read key {text!r}")
        quoted, literal, bare, dot = match.groups()
        keys.append(
            json.loads(f'"{quoted}"')
            if quoted is not None
            else literal
            if literal is not None
            else bare
        )
        pos = match.end()
        if not dot:
            break
    if pos < len(text.rstrip()):
        raise TomlError(f"line {line_no}: cannot read key {text!r}")
    return keys


def _strip_comment(line: str) -> str:
    quote = None
    i = 0
    while i < len(line):
        char = line[i]
        if quote:
            if char == "\\" and quote == '"':
                i += 2
                continue
            if char == quote:
                quote = None
        elif char in "\"'":
            quote = char
        elif char == "#":
            return line[:i]
        i += 1
    return line


def _value(text: str, line_no: int):
    text = text.strip()
    if text.startswith('"') and text.endswith('"') and len(text) >= 2:
        try:
            return json.loads(text)
        except ValueError as exc:
            raise TomlError(f"line {line_no}: bad string {text}") from exc
    if text.startswith("'") and text.endswith("'") and len(text) >= 2:
        return text[1:-1]
    if text in ("true", "false"):
        return text == "true"
    if _NUMBER.match(text):
        number = text.replace("_", "")
        return float(number) if any(c in number for c in ".eE") else int(number)
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip().rstrip(",")
        if not inner:
            return []
        items = re.findall(r'"(?:[^"\\]|\\.)*"|\'[^\']*\'|[^,\s][^,]*', inner)
        return [_value(item, line_no) for item in items]
    raise TomlError(f"line {line_no}: value outside the supported subset: {text[:60]}")


def _parse_subset(text: str) -> dict:
    doc: dict = {}
    table = doc
    pending = ""  # a multi-line array being collected
    pending_line = 0
    for line_no, raw in enumerate(text.splitlines(), 1):
        line = _strip_comment(raw).strip()
        if pending:
            pending += " " + line
            if pending.count("[") > pending.count("]"):
                continue
            line, pending = pending, ""
            line_no = pending_line
        if not line:
            continue
        if line.startswith("[["):
            raise TomlError(f"line {line_no}: arrays of tables are outside the supported subset")
        if line.startswith("["):
            if not line.endswith("]"):
                raise TomlError(f"line {line_no}: unterminated table header")
            table = doc
            for key in _keys(line[1:-1], line_no):
                table = table.setdefault(key, {})
                if not isinstance(table, dict):
                    raise TomlError(f"line {line_no}: {key} is not a table")
            continue
        key_text, eq, value_text = line.partition("=")
        if not eq:
            raise TomlError(f"line {line_no}: expected key = value")
        if value_text.strip().startswith("[") and value_text.count("[") > value_text.count("]"):
            pending, pending_line = line, line_no
            continue
        keys = _keys(key_text.strip(), line_no)
        target = table
        for key in keys[:-1]:
            target = target.setdefault(key, {})
        target[keys[-1]] = _value(value_text, line_no)
    if pending:
        raise TomlError(f"line {pending_line}: unterminated array")
    return doc


def loads(text: str) -> dict:
    if tomllib is not None:
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise TomlError(str(exc)) from exc
    return _parse_subset(text)
