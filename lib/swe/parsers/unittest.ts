import { recordStatus, type TestStatus, type TestStatusMap } from '../testStatus.js';
import { logLines } from './logText.js';

/**
 * unittest (`python -m unittest -v`, Django's runner) log parser.
 *
 * unittest describes a test as `test_a (pkg.mod.TestX)` before Python 3.11
 * and `test_a (pkg.mod.TestX.test_a)` from 3.11 on. Both are recorded under
 * one canonical dotted id, `pkg.mod.TestX.test_a`, so that a task's test list
 * does not depend on the Python version the log came from; grading applies
 * the same canonicalisation to FAIL_TO_PASS / PASS_TO_PASS entries.
 *
 * Handled quirks of the verbose stream: a docstring's first line printed on
 * its own line before ` ... ok`; test stdout glued in front of the status
 * (`... noiseok`) or spanning lines before a bare `ok`; failing subtests
 * that leave ` ... ` with no status (pre-3.11 even continues the next test
 * on the same line), whose verdict only appears as `FAIL: test (...)` in the
 * detailed section; import failures reported as `unittest.loader._FailedTest`.
 */

const DESCRIPTION = /(\w+) \(([A-Za-z_][\w.]*)\)/;
const HEADER = new RegExp(`${DESCRIPTION.source} \\.\\.\\. `, 'g');
const DESCRIPTION_ONLY = new RegExp(`^${DESCRIPTION.source}$`);
const DETAIL_HEADER = new RegExp(`^(FAIL|ERROR|UNEXPECTED SUCCESS): ${DESCRIPTION.source}`);
// Lazy prefix tolerates test output printed just before the verdict.
const VERDICT = /^(.*?)(ok|FAIL|ERROR|expected failure|unexpected success|skipped(?: .*)?)$/;
const SECTION_RULE = /^(=+|-+)$/;

/** Dotted id for `name` described as `(target)` in either Python form. */
export function canonicalUnittestId(name: string, target: string): string {
  return target === name || target.endsWith(`.${name}`) ? target : `${target}.${name}`;
}

/**
 * Canonical form of any test id: unittest descriptions (`test_a (pkg.T)`,
 * `test_a (pkg.T.test_a)`) become `pkg.T.test_a`; anything else (pytest node
 * ids, already-dotted ids) is returned unchanged.
 */
export function canonicalTestId(id: string): string {
  const match = DESCRIPTION_ONLY.exec(id.trim());
  return match ? canonicalUnittestId(match[1] as string, match[2] as string) : id;
}

function verdictToStatus(verdict: string): TestStatus {
  if (verdict === 'ok') return 'PASSED';
  if (verdict === 'FAIL') return 'FAILED';
  if (verdict === 'ERROR') return 'ERROR';
  if (verdict === 'expected failure') return 'XFAIL';
  // unittest counts an unexpected success as a failed run.
  if (verdict === 'unexpected success') return 'FAILED';
  return 'SKIPPED';
}

/** Status named at the end of `text`, if any (`text` may start with test output). */
function readVerdict(text: string, allowPrefix: boolean): TestStatus | undefined {
  const match = VERDICT.exec(text.trim());
  if (!match || (!allowPrefix && match[1] !== '')) return undefined;
  return verdictToStatus(match[2] as string);
}

export function parseUnittestLog(log: string): TestStatusMap {
  const statuses: TestStatusMap = new Map();
  // A test whose description was printed but whose verdict is still to come.
  let pending: string | undefined;
  // A test whose description line was followed by its docstring line.
  let awaitingDocstring: string | undefined;

  for (const line of logLines(log)) {
    const detail = DETAIL_HEADER.exec(line);
    if (detail) {
      const status: TestStatus = detail[1] === 'ERROR' ? 'ERROR' : 'FAILED';
      recordStatus(statuses, canonicalUnittestId(detail[2] as string, detail[3] as string), status);
      pending = awaitingDocstring = undefined;
      continue;
    }
    if (SECTION_RULE.test(line)) {
      pending = awaitingDocstring = undefined;
      continue;
    }
    const headers = [...line.matchAll(HEADER)];
    if (headers.length > 0) {
      awaitingDocstring = undefined;
      headers.forEach((header, i) => {
        const id = canonicalUnittestId(header[1] as string, header[2] as string);
        const start = (header.index ?? 0) + header[0].length;
        const end = headers[i + 1]?.index ?? line.length;
        const status = readVerdict(line.slice(start, end), true);
        if (status) {
          recordStatus(statuses, id, status);
          pending = undefined;
        } else {
          pending = id;
        }
      });
      continue;
    }
    const descriptionOnly = DESCRIPTION_ONLY.exec(line);
    if (descriptionOnly) {
      awaitingDocstring = canonicalUnittestId(descriptionOnly[1] as string, descriptionOnly[2] as string);
      pending = undefined;
      continue;
    }
    if (awaitingDocstring !== undefined && line.includes(' ... ')) {
      const status = readVerdict(line.slice(line.indexOf(' ... ') + 5), true);
      if (status) recordStatus(statuses, awaitingDocstring, status);
      else pending = awaitingDocstring;
      awaitingDocstring = undefined;
      continue;
    }
    if (pending !== undefined) {
      const status = readVerdict(line, false);
      if (status) {
        recordStatus(statuses, pending, status);
        pending = undefined;
      }
    }
  }
  return statuses;
}
