import { recordStatus, type TestStatus, type TestStatusMap } from '../testStatus.js';
import { logLines } from './logText.js';

/**
 * pytest log parser. Understands the three places pytest names a test:
 *
 * - the `-rA` short summary (`PASSED id`, `FAILED id - message`,
 *   `SKIPPED [n] file:line: reason`, ...), which SWE-bench relies on;
 * - `-v` progress lines (`id PASSED [ 50%]`, `id SKIPPED (reason) [ 60%]`),
 *   including pytest-xdist's `[gw0] [ 50%] PASSED id` form;
 * - collection-error headers (`____ ERROR collecting tests/x.py ____`), the
 *   only trace a module that fails to import leaves in `-v` output.
 *
 * Node ids are kept verbatim (parametrized ids may contain spaces, `::`,
 * ` - ` and nested brackets), because FAIL_TO_PASS lists use exact ids.
 */

const PYTEST_WORDS = ['PASSED', 'FAILED', 'ERROR', 'SKIPPED', 'XFAIL', 'XPASS'] as const;
type PytestWord = (typeof PYTEST_WORDS)[number];
const WORD_ALTERNATION = PYTEST_WORDS.join('|');

// `-rA` summary: status word first.
const SUMMARY_LINE = new RegExp(`^(${WORD_ALTERNATION}) (.+)$`);
// `SKIPPED [2] tests/x.py:10: reason` names a location, not a node id.
const SKIP_LOCATION = /^\[\d+\] /;
// `-v` line: greedy id so that the *last* status word that leaves a valid
// tail is taken (a parametrized id may itself contain "PASSED").
const VERBOSE_LINE = new RegExp(
  `^(\\S.*::.*) (${WORD_ALTERNATION})(?: \\(.*\\))?(?:\\s+\\[\\s*\\d+%\\])?$`,
);
const XDIST_LINE = new RegExp(`^\\[gw\\d+\\] \\[\\s*\\d+%\\] (${WORD_ALTERNATION}) (.+)$`);
const COLLECTION_ERROR_HEADER = /^_+ ERROR collecting (.+?) _+$/;

function toTestStatus(word: PytestWord): TestStatus {
  // Non-strict XPASS: the test body passed and pytest does not fail the run
  // (strict XPASS is already reported by pytest as FAILED).
  return word === 'XPASS' ? 'PASSED' : word;
}

/**
 * Splits `tests/x.py::test_p[a - b] - AssertionError: ...` into node id and
 * message. The separator is ` - `, but parametrized ids may contain ` - `
 * too, so when the id has a `[`, the id ends at a `]` that is followed by
 * ` - ` or the end of the line, preferring the one that balances brackets.
 */
export function splitSummaryRest(rest: string): { id: string; message?: string } {
  const firstSeparator = rest.indexOf(' - ');
  const firstBracket = rest.indexOf('[');
  if (firstBracket === -1 || (firstSeparator !== -1 && firstSeparator < firstBracket)) {
    return firstSeparator === -1
      ? { id: rest }
      : { id: rest.slice(0, firstSeparator), message: rest.slice(firstSeparator + 3) };
  }
  let depth = 0;
  let firstCandidate = -1;
  for (let i = firstBracket; i < rest.length; i++) {
    const ch = rest[i];
    if (ch === '[') depth++;
    if (ch !== ']') continue;
    depth--;
    const tail = rest.slice(i + 1);
    if (tail !== '' && !tail.startsWith(' - ')) continue;
    if (depth === 0) return splitAt(rest, i + 1);
    if (firstCandidate === -1) firstCandidate = i + 1;
  }
  return firstCandidate === -1 ? { id: rest } : splitAt(rest, firstCandidate);
}

function splitAt(rest: string, end: number): { id: string; message?: string } {
  const tail = rest.slice(end);
  return tail === '' ? { id: rest.slice(0, end) } : { id: rest.slice(0, end), message: tail.slice(3) };
}

export function parsePytestLog(log: string): TestStatusMap {
  const statuses: TestStatusMap = new Map();
  for (const line of logLines(log)) {
    const summary = SUMMARY_LINE.exec(line);
    if (summary) {
      const word = summary[1] as PytestWord;
      const rest = summary[2] as string;
      if (word === 'SKIPPED' && SKIP_LOCATION.test(rest)) continue;
      recordStatus(statuses, splitSummaryRest(rest).id, toTestStatus(word));
      continue;
    }
    const xdist = XDIST_LINE.exec(line);
    if (xdist) {
      recordStatus(statuses, splitSummaryRest(xdist[2] as string).id, toTestStatus(xdist[1] as PytestWord));
      continue;
    }
    const verbose = VERBOSE_LINE.exec(line);
    if (verbose) {
      recordStatus(statuses, verbose[1] as string, toTestStatus(verbose[2] as PytestWord));
      continue;
    }
    const collection = COLLECTION_ERROR_HEADER.exec(line);
    if (collection) {
      recordStatus(statuses, collection[1] as string, 'ERROR');
    }
  }
  return statuses;
}
