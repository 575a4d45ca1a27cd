import { source, type DemoRepoSpec } from '../spec.js';

const T = 'tests/test_loads.py';

const parserModule = (split: string): string =>
  source(String.raw`
"""A small INI parser: sections, key = value pairs, # and ; comments."""


class ParseError(ValueError):
    """Malformed INI input; lineno is 1-based."""

    def __init__(self, lineno, message):
        super().__init__(f"line {lineno}: {message}")
        self.lineno = lineno


def loads(text):
    """Parse INI text into {section: {key: value}}.

    Keys before the first section header go to the "" section, which is
    dropped when empty. Keys are case-insensitive (stored lowercase).
    """
    data = {"": {}}
    section = data[""]
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            if not line.endswith("]"):
                raise ParseError(lineno, f"unterminated section header: {line!r}")
            section = data.setdefault(line[1:-1].strip(), {})
            continue
        if "=" not in line:
            raise ParseError(lineno, f"expected 'key = value': {line!r}")
        key, value = ${split}
        section[key.strip().lower()] = value.strip()
    if not data[""]:
        del data[""]
    return data


def load(path):
    with open(path, encoding="utf-8") as handle:
        return loads(handle.read())
`);

const baseTests = source(String.raw`
import pytest

from miniini import ParseError, loads

SAMPLE = """
# global settings
name = demo

[server]
Host = example.org
port = 8080

; database settings
[database]
user = admin
"""


def test_sections_and_keys():
    data = loads(SAMPLE)
    assert data["server"] == {"host": "example.org", "port": "8080"}
    assert data["database"] == {"user": "admin"}


def test_keys_before_first_section():
    assert loads(SAMPLE)[""] == {"name": "demo"}


def test_comments_and_blank_lines_ignored():
    assert loads("# c\n; c\n\n[a]\nk = v\n") == {"a": {"k": "v"}}


def test_unterminated_section_raises():
    with pytest.raises(ParseError, match="line 2"):
        loads("[a]\n[b\n")


def test_missing_equals_raises():
    with pytest.raises(ParseError, match="expected"):
        loads("[a]\njust words\n")
`);

const newTests = source(String.raw`


def test_value_containing_equals_sign():
    assert loads("[web]\nurl = http://example.org/?q=1\n") == {"web": {"url": "http://example.org/?q=1"}}


def test_connection_string_value():
    data = loads("[db]\ndsn = host=db port=5432 user=app\n")
    assert data["db"]["dsn"] == "host=db port=5432 user=app"
`);

export const miniini: DemoRepoSpec = {
  name: 'miniini',
  repo: 'minisandbox-demo/miniini',
  instanceId: 'minisandbox-demo__miniini-12',
  version: '0.3',
  sourceRoot: '.',
  packages: ['miniini'],
  problemStatement: source(`
loads() crashes on values that contain "="

    [web]
    url = http://example.org/?q=1

raises "ValueError: too many values to unpack (expected 2)" instead of
returning {"web": {"url": "http://example.org/?q=1"}}. Only the first "="
should separate the key from the value.
`),
  baseFiles: {
    'README.md': '# miniini\n\nA small INI file parser.\n',
    'miniini/__init__.py': source(`
"""miniini: a small INI file parser."""
from .parser import ParseError, load, loads

__all__ = ["ParseError", "load", "loads"]
`),
    'miniini/parser.py': parserModule('line.split("=")'),
    [T]: baseTests,
  },
  fixFiles: { 'miniini/parser.py': parserModule('line.split("=", 1)') },
  testFiles: { [T]: baseTests + newTests },
  testPaths: [T],
  FAIL_TO_PASS: [`${T}::test_value_containing_equals_sign`, `${T}::test_connection_string_value`],
  PASS_TO_PASS: [
    `${T}::test_sections_and_keys`,
    `${T}::test_keys_before_first_section`,
    `${T}::test_comments_and_blank_lines_ignored`,
    `${T}::test_unterminated_section_raises`,
    `${T}::test_missing_equals_raises`,
  ],
};
