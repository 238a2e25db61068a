"""gpuprov/output.py: the JSON documents on stdout."""

from __future__ import annotations

import io
import json

from gpuprov.output import print_json


class _Writes(io.StringIO):
    """A stream that records each write() it gets."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)


def test_print_json_writes_the_indented_document_at_once():
    # A stream Ansible's Display has wrapped sends every write to the OS (verify --json).
    doc = {"schema_version": 1, "results": [{"node": f"n{i}", "details": {"gpus": [0, 1]}}
                                            for i in range(3)], "summary": {"exit_code": 0}}
    stream = _Writes()
    print_json(doc, stream)
    assert stream.writes == [json.dumps(doc, indent=2) + "\n"]
    assert json.loads(stream.getvalue()) == doc
