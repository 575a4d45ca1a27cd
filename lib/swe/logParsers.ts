/**
 * Turning raw test-run logs into per-test statuses (SWE-bench vocabulary).
 *
 * Entry points: {@link parseTestLog} (markers + auto-detection),
 * {@link LOG_PARSERS} (registry by name) and {@link extractTestOutput}.
 */
import { SweError } from './errors.js';
import { parsePytestLog } from './parsers/pytest.js';
import { parseUnittestLog } from './parsers/unittest.js';
import type { TestStatusMap } from './testStatus.js';

export { parsePytestLog, splitSummaryRest } from './parsers/pytest.js';
export { parseUnittestLog, canonicalTestId, canonicalUnittestId } from './parsers/unittest.js';
export { stripAnsi, logLines } from './parsers/logText.js';
export type { TestStatus, TestStatusMap } from './testStatus.js';
export { TEST_STATUSES, isTestStatus } from './testStatus.js';

export type LogParser = (log: string) => TestStatusMap;

/** Parsers by the name a task's recipe (`log_parser`) may refer to. */
export const LOG_PARSERS = {
  pytest: parsePytestLog,
  unittest: parseUnittestLog,
} as const satisfies Record<string, LogParser>;

export type LogParserName = keyof typeof LOG_PARSERS;

export const LOG_PARSER_NAMES = Object.keys(LOG_PARSERS) as LogParserName[];

export function isLogParserName(name: unknown): name is LogParserName {
  return typeof name === 'string' && Object.hasOwn(LOG_PARSERS, name);
}

export function getLogParser(name: string): LogParser {
  if (!isLogParserName(name)) {
    throw new SweError(`unknown log parser "${name}": known parsers are ${LOG_PARSER_NAMES.join(', ')}`);
  }
  return LOG_PARSERS[name];
}

/**
 * SWE-bench's eval scripts print these around the test command so that
 * install/apply noise before and teardown noise after are not parsed. With
 * `set -x` the marker also shows up inside a trace line (`+ : '>>>>> ...'`),
 * hence markers are searched anywhere in a line, first occurrence first.
 */
export const START_TEST_OUTPUT = '>>>>> Start Test Output';
export const END_TEST_OUTPUT = '>>>>> End Test Output';

/**
 * The part of `log` between the start and end markers. Without a start
 * marker the whole log is returned (a bare test run); without an end marker
 * everything after the start is returned, because a run cut short by a
 * timeout still reports the tests that did finish.
 */
export function extractTestOutput(log: string): string {
  const start = log.indexOf(START_TEST_OUTPUT);
  if (start === -1) return log;
  const lineEnd = log.indexOf('\n', start);
  if (lineEnd === -1) return '';
  const body = log.slice(lineEnd + 1);
  const end = body.indexOf(END_TEST_OUTPUT);
  if (end === -1) return body;
  return body.slice(0, body.lastIndexOf('\n', end) + 1);
}

const PYTEST_SIGNATURES = [
  /^=+ test session starts =+$/m,
  /^=+ short test summary info =+$/m,
  /^(?:\x1b\[[0-9;]*m)*(?:PASSED|FAILED|ERROR|XFAIL|XPASS)(?:\x1b\[[0-9;]*m)* \S*::/m,
  /::\S*.* (?:PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)(?: \(.*\))?\s+\[\s*\d+%\]/m,
];
const UNITTEST_SIGNATURES = [/^\w+ \([A-Za-z_][\w.]*\) \.\.\. /m, /^Ran \d+ tests? in [\d.]+s$/m];

/**
 * Which runner produced `log`, judged by output only a given runner prints.
 * pytest is checked first: it can run unittest-style tests, but then the
 * log is in pytest's format.
 */
export function detectLogFormat(log: string): LogParserName | undefined {
  if (PYTEST_SIGNATURES.some((re) => re.test(log))) return 'pytest';
  if (UNITTEST_SIGNATURES.some((re) => re.test(log))) return 'unittest';
  return undefined;
}

export interface ParseTestLogOptions {
  /** Parser to use; 'auto' (default) detects it from the log. */
  parser?: LogParserName | 'auto';
  /** Restrict parsing to the SWE-bench marker section (default true). */
  useMarkers?: boolean;
}

/**
 * Per-test statuses of a test-run log. An unrecognisable log yields an empty
 * map, which grading treats as "every expected test failed" - the right
 * verdict for a run that crashed before reporting anything.
 */
export function parseTestLog(log: string, options: ParseTestLogOptions = {}): TestStatusMap {
  const text = options.useMarkers === false ? log : extractTestOutput(log);
  const requested = options.parser ?? 'auto';
  const name = requested === 'auto' ? detectLogFormat(text) : requested;
  if (name === undefined) return new Map();
  return getLogParser(name)(text);
}
