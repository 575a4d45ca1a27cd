import { source, type DemoRepoSpec } from '../spec.js';

const T = 'tests/test_parser.py';

const parserModule = (leapRule: string): string =>
  source(String.raw`
"""Parse calendar dates written as YYYY-MM-DD or DD/MM/YYYY."""
import re
from datetime import date

_ISO = re.compile(r"^(\d{4})-(\d{2})-(\d{2})$")
_DMY = re.compile(r"^(\d{1,2})/(\d{1,2})/(\d{4})$")
_DAYS_IN_MONTH = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]


class DateParseError(ValueError):
    """Raised when a string is not a valid calendar date."""


def is_leap_year(year):
    """Gregorian leap year rule."""
    return ${leapRule}


def days_in_month(year, month):
    if not 1 <= month <= 12:
        raise DateParseError(f"month out of range: {month}")
    if month == 2 and is_leap_year(year):
        return 29
    return _DAYS_IN_MONTH[month - 1]


def parse_date(text):
    """Return a datetime.date for text, or raise DateParseError."""
    text = text.strip()
    match = _ISO.match(text)
    if match:
        year, month, day = (int(group) for group in match.groups())
    else:
        match = _DMY.match(text)
        if not match:
            raise DateParseError(f"unrecognised date format: {text!r}")
        day, month, year = (int(group) for group in match.groups())
    if not 1 <= day <= days_in_month(year, month):
        raise DateParseError(f"day out of range for {year:04d}-{month:02d}: {day}")
    return date(year, month, day)
`);

const baseTests = source(String.raw`
from datetime import date

import pytest

from tinydate import DateParseError, is_leap_year, parse_date


def test_parse_iso():
    assert parse_date("2023-07-14") == date(2023, 7, 14)


def test_parse_day_month_year():
    assert parse_date(" 14/7/2023 ") == date(2023, 7, 14)


def test_rejects_unknown_format():
    with pytest.raises(DateParseError, match="unrecognised"):
        parse_date("July 14th")


def test_rejects_month_13():
    with pytest.raises(DateParseError, match="month out of range"):
        parse_date("2023-13-01")


def test_feb_29_in_leap_year():
    assert parse_date("2024-02-29") == date(2024, 2, 29)


def test_century_is_not_leap():
    assert not is_leap_year(1900)
    with pytest.raises(DateParseError):
        parse_date("1900-02-29")
`);

const newTests = source(String.raw`


def test_year_divisible_by_400_is_leap():
    assert is_leap_year(2000)
    assert is_leap_year(1600)


def test_parse_feb_29_2000():
    assert parse_date("29/02/2000") == date(2000, 2, 29)
`);

export const tinydate: DemoRepoSpec = {
  name: 'tinydate',
  repo: 'minisandbox-demo/tinydate',
  instanceId: 'minisandbox-demo__tinydate-7',
  version: '1.2',
  sourceRoot: '.',
  packages: ['tinydate'],
  problemStatement: source(`
parse_date rejects 29 February 2000

    >>> tinydate.parse_date("2000-02-29")
    DateParseError: day out of range for 2000-02: 29

2000 is a leap year: years divisible by 400 are leap years even though they
are divisible by 100. is_leap_year(2000) currently returns False.
`),
  baseFiles: {
    'README.md': '# tinydate\n\nA tiny date parser (ISO and day/month/year).\n',
    'tinydate/__init__.py': source(`
"""tinydate: a tiny date parser."""
from .parser import DateParseError, days_in_month, is_leap_year, parse_date

__all__ = ["DateParseError", "days_in_month", "is_leap_year", "parse_date"]
`),
    'tinydate/parser.py': parserModule('year % 4 == 0 and year % 100 != 0'),
    [T]: baseTests,
  },
  fixFiles: {
    'tinydate/parser.py': parserModule('year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)'),
  },
  testFiles: { [T]: baseTests + newTests },
  testPaths: [T],
  FAIL_TO_PASS: [`${T}::test_year_divisible_by_400_is_leap`, `${T}::test_parse_feb_29_2000`],
  PASS_TO_PASS: [
    `${T}::test_parse_iso`,
    `${T}::test_parse_day_month_year`,
    `${T}::test_rejects_unknown_format`,
    `${T}::test_rejects_month_13`,
    `${T}::test_feb_29_in_leap_year`,
    `${T}::test_century_is_not_leap`,
  ],
};
