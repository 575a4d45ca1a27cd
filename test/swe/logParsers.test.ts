import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  canonicalTestId,
  detectLogFormat,
  END_TEST_OUTPUT,
  extractTestOutput,
  getLogParser,
  LOG_PARSERS,
  parsePytestLog,
  parseTestLog,
  parseUnittestLog,
  splitSummaryRest,
  START_TEST_OUTPUT,
  stripAnsi,
} from '../../lib/swe/logParsers.js';
import {
  makeTempDir,
  NO_PYTEST_REASON,
  oldUnittestPython,
  pytestPython,
  pythonEnv,
  removeDir,
  run,
  unittestPython,
} from './helpers.js';

const MIXED_TESTS = `
import pytest

def test_pass():
    assert True

def test_fail():
    assert 1 == 2, "nope"

@pytest.fixture
def broken():
    raise RuntimeError("fixture boom")

def test_error(broken):
    pass

@pytest.mark.skip(reason="not today")
def test_skip():
    pass

@pytest.mark.xfail(reason="known bug")
def test_xfail():
    assert False

@pytest.mark.xfail(reason="fixed already")
def test_xpass():
    assert True

@pytest.mark.parametrize("text, n", [("a b", 1), ("[x]", 2), ("c::d - e", 3), ("PASSED word", 4)])
def test_param(text, n):
    assert n != 2

class TestGroup:
    def test_method(self):
        pass

@pytest.fixture
def bad_teardown():
    yield
    raise RuntimeError("teardown boom")

def test_passes_then_teardown_fails(bad_teardown):
    pass
`;

const F = 'tests/test_mixed.py';
/** What the mixed suite must parse to, whatever the output mode. */
const EXPECTED_MIXED: Record<string, string> = {
  [`${F}::test_pass`]: 'PASSED',
  [`${F}::test_fail`]: 'FAILED',
  [`${F}::test_error`]: 'ERROR',
  [`${F}::test_xfail`]: 'XFAIL',
  [`${F}::test_xpass`]: 'PASSED',
  [`${F}::test_param[a b-1]`]: 'PASSED',
  [`${F}::test_param[[x]-2]`]: 'FAILED',
  [`${F}::test_param[c::d - e-3]`]: 'PASSED',
  [`${F}::test_param[PASSED word-4]`]: 'PASSED',
  [`${F}::TestGroup::test_method`]: 'PASSED',
  [`${F}::test_passes_then_teardown_fails`]: 'ERROR',
};

describe.skipIf(!pytestPython)(`pytest logs from real runs (${pytestPython?.path ?? NO_PYTEST_REASON})`, () => {
  let dir = '';
  const pytest = (...args: string[]): string =>
    run(pytestPython!.path, ['-m', 'pytest', '-p', 'no:cacheprovider', ...args], { cwd: dir, env: pythonEnv() }).output;

  beforeAll(() => {
    dir = makeTempDir('pytest-log');
    mkdirSync(join(dir, 'tests'));
    writeFileSync(join(dir, F), MIXED_TESTS);
    writeFileSync(join(dir, 'tests/test_broken_import.py'), 'import module_that_does_not_exist\n\ndef test_never():\n    pass\n');
  });
  afterAll(() => removeDir(dir));

  it('parses the -rA short summary, including a collection error', () => {
    const log = pytest('-rA', '--continue-on-collection-errors', 'tests');
    const statuses = parsePytestLog(log);
    expect(Object.fromEntries(statuses)).toEqual({ ...EXPECTED_MIXED, 'tests/test_broken_import.py': 'ERROR' });
    // -rA reports skips by location only; the skipped test has no node id there.
    expect(statuses.has(`${F}::test_skip`)).toBe(false);
    expect(detectLogFormat(log)).toBe('pytest');
  });

  it('parses -v lines with ANSI colours, including skip reasons and the collection-error header', () => {
    const log = pytest('-v', '--color=yes', '--continue-on-collection-errors', 'tests');
    expect(log).toContain('\x1b[');
    const statuses = parsePytestLog(log);
    expect(Object.fromEntries(statuses)).toEqual({
      ...EXPECTED_MIXED,
      [`${F}::test_skip`]: 'SKIPPED',
      'tests/test_broken_import.py': 'ERROR',
    });
  });

  it('gives the same result for -v -rA together, CRLF line ends and auto-detection', () => {
    const log = pytest('-v', '-rA', '--color=yes', '--continue-on-collection-errors', 'tests');
    const direct = parsePytestLog(log);
    expect(direct.get(`${F}::test_skip`)).toBe('SKIPPED');
    expect(parsePytestLog(log.replace(/\n/g, '\r\n'))).toEqual(direct);
    expect(parseTestLog(log)).toEqual(direct);
  });

  it('records a collection error that interrupts the session', () => {
    const log = pytest('-rA', 'tests');
    expect(log).toContain('Interrupted');
    expect(Object.fromEntries(parsePytestLog(log))).toEqual({ 'tests/test_broken_import.py': 'ERROR' });
  });

  it('only parses the part between SWE-bench markers', () => {
    const testOutput = pytest('-rA', `${F}::test_pass`, `${F}::test_fail`);
    const log = [
      '+ git apply -v /tmp/patch.diff',
      `PASSED ${F}::test_noise_before`,
      `+ : '${START_TEST_OUTPUT}'`,
      START_TEST_OUTPUT,
      testOutput,
      END_TEST_OUTPUT,
      `FAILED ${F}::test_noise_after`,
    ].join('\n');
    expect(Object.fromEntries(parseTestLog(log))).toEqual({ [`${F}::test_pass`]: 'PASSED', [`${F}::test_fail`]: 'FAILED' });
  });
});

const UNITTEST_MODULE = `
import unittest

class TestThing(unittest.TestCase):
    def test_ok(self):
        pass

    def test_fail(self):
        self.assertEqual(1, 2)

    def test_error(self):
        raise ValueError("boom")

    @unittest.skip("not now")
    def test_skipped(self):
        pass

    @unittest.expectedFailure
    def test_expected_failure(self):
        self.assertTrue(False)

    @unittest.expectedFailure
    def test_unexpected_success(self):
        pass

    def test_with_docstring(self):
        """The first docstring line is printed by -v."""

    def test_prints(self):
        print("noise without newline", end="")

    def test_subtests(self):
        for i in range(3):
            with self.subTest(i=i):
                self.assertLess(i, 2)

    def test_zzz_after_subtests(self):
        pass
`;

const U = 'pkg.test_thing.TestThing';
const EXPECTED_UNITTEST: Record<string, string> = {
  [`${U}.test_ok`]: 'PASSED',
  [`${U}.test_fail`]: 'FAILED',
  [`${U}.test_error`]: 'ERROR',
  [`${U}.test_skipped`]: 'SKIPPED',
  [`${U}.test_expected_failure`]: 'XFAIL',
  [`${U}.test_unexpected_success`]: 'FAILED',
  [`${U}.test_with_docstring`]: 'PASSED',
  [`${U}.test_prints`]: 'PASSED',
  [`${U}.test_subtests`]: 'FAILED',
  [`${U}.test_zzz_after_subtests`]: 'PASSED',
  'unittest.loader._FailedTest.test_broken': 'ERROR',
};

describe.skipIf(!unittestPython)('unittest logs from real runs', () => {
  let dir = '';
  beforeAll(() => {
    dir = makeTempDir('unittest-log');
    mkdirSync(join(dir, 'pkg'));
    writeFileSync(join(dir, 'pkg/__init__.py'), '');
    writeFileSync(join(dir, 'pkg/test_thing.py'), UNITTEST_MODULE);
    writeFileSync(join(dir, 'pkg/test_broken.py'), 'import module_that_does_not_exist\n');
  });
  afterAll(() => removeDir(dir));

  const unittestLog = (python: string): string =>
    run(python, ['-m', 'unittest', '-v', 'pkg.test_thing', 'pkg.test_broken'], { cwd: dir, env: pythonEnv() }).output;

  it(`parses Python ${unittestPython?.version} -v output (3.11+ description form)`, () => {
    const log = unittestLog(unittestPython!.path);
    expect(detectLogFormat(log)).toBe('unittest');
    expect(Object.fromEntries(parseUnittestLog(log))).toEqual(EXPECTED_UNITTEST);
    expect(parseTestLog(log)).toEqual(parseUnittestLog(log));
  });

  it.skipIf(!oldUnittestPython)(
    `parses pre-3.11 output to the same canonical ids (${oldUnittestPython?.path ?? 'no Python < 3.11 found'})`,
    () => {
      const log = unittestLog(oldUnittestPython!.path);
      expect(log).toContain(`test_ok (${U}) ... ok`);
      expect(Object.fromEntries(parseUnittestLog(log))).toEqual(EXPECTED_UNITTEST);
    },
  );
});

describe('pytest edge cases (fixtures)', () => {
  it('splits ids from messages when ids contain " - " and brackets', () => {
    expect(splitSummaryRest('t.py::test_a - AssertionError: x - y')).toEqual({ id: 't.py::test_a', message: 'AssertionError: x - y' });
    expect(splitSummaryRest('t.py::test_p[a - b]')).toEqual({ id: 't.py::test_p[a - b]' });
    expect(splitSummaryRest('t.py::test_p[[x]-2] - assert [1] - [2]')).toEqual({ id: 't.py::test_p[[x]-2]', message: 'assert [1] - [2]' });
    expect(splitSummaryRest('t.py::test_p[x]]-1] - boom')).toEqual({ id: 't.py::test_p[x]]-1]', message: 'boom' });
  });

  it('reads xdist lines, keeps the worst status and ignores skip locations', () => {
    const log = [
      '[gw0] [ 50%] PASSED tests/t.py::test_a[1 2]',
      '[gw1] [100%] FAILED tests/t.py::test_b',
      'tests/t.py::test_c PASSED                                    [ 10%]',
      'tests/t.py::test_c ERROR                                     [ 10%]',
      'ERROR tests/t.py::test_c - RuntimeError: teardown',
      'PASSED tests/t.py::test_c',
      'SKIPPED [2] tests/t.py:40: needs network',
      'XPASS tests/t.py::test_d - reason',
    ].join('\n');
    expect(Object.fromEntries(parsePytestLog(log))).toEqual({
      'tests/t.py::test_a[1 2]': 'PASSED',
      'tests/t.py::test_b': 'FAILED',
      'tests/t.py::test_c': 'ERROR',
      'tests/t.py::test_d': 'PASSED',
    });
  });

  it('strips ANSI sequences and honours carriage-return redraws', () => {
    expect(stripAnsi('\x1b[31mFAILED\x1b[0m x')).toBe('FAILED x');
    const log = 'collecting ... \rcollected 1 item\r\n\x1b[32mPASSED\x1b[0m tests/t.py::\x1b[1mtest_a\x1b[0m\r\n';
    expect(Object.fromEntries(parsePytestLog(log))).toEqual({ 'tests/t.py::test_a': 'PASSED' });
  });
});

describe('unittest edge cases (fixtures)', () => {
  it('binds a verdict printed on a later line and reads Django-style output', () => {
    const log = [
      'test_a (app.tests.T) ... Testing against Django installed in /x',
      'ok',
      'test_b (app.tests.T) ... skipped "needs db"',
      'test_c (app.tests.T) ... FAIL',
      'test_d (app.tests.T) ... ',
      '======================================================================',
      'ERROR: test_d (app.tests.T)',
    ].join('\n');
    expect(Object.fromEntries(parseUnittestLog(log))).toEqual({
      'app.tests.T.test_a': 'PASSED',
      'app.tests.T.test_b': 'SKIPPED',
      'app.tests.T.test_c': 'FAILED',
      'app.tests.T.test_d': 'ERROR',
    });
  });

  it('leaves a test whose run was cut off without a status', () => {
    const statuses = parseUnittestLog('test_a (m.T.test_a) ... ok\ntest_b (m.T.test_b) ... ');
    expect(Object.fromEntries(statuses)).toEqual({ 'm.T.test_a': 'PASSED' });
  });

  it('canonicalises both description forms', () => {
    expect(canonicalTestId('test_a (pkg.mod.T)')).toBe('pkg.mod.T.test_a');
    expect(canonicalTestId('test_a (pkg.mod.T.test_a)')).toBe('pkg.mod.T.test_a');
    expect(canonicalTestId('tests/t.py::test_a')).toBe('tests/t.py::test_a');
  });
});

describe('registry, detection and markers', () => {
  it('exposes parsers by name and rejects unknown names', () => {
    expect(Object.keys(LOG_PARSERS).sort()).toEqual(['pytest', 'unittest']);
    expect(getLogParser('pytest')).toBe(parsePytestLog);
    expect(() => getLogParser('nose')).toThrow(/unknown log parser "nose".*pytest, unittest/);
  });

  it('returns an empty map for unrecognisable logs', () => {
    expect(detectLogFormat('make: *** [all] Error 1')).toBeUndefined();
    expect(parseTestLog('make: *** [all] Error 1').size).toBe(0);
  });

  it('keeps output after a start marker when the end marker is missing (timeout)', () => {
    expect(extractTestOutput(`noise\n${START_TEST_OUTPUT}\nPASSED t.py::a\n`)).toBe('PASSED t.py::a\n');
    expect(extractTestOutput('PASSED t.py::a')).toBe('PASSED t.py::a');
  });
});
