/**
 * The shell side of an evaluation, following SWE-bench's eval.sh: apply the
 * model patch with three increasingly lenient tools, put the test files
 * back to base_commit and apply the test patch, then run the test command
 * between markers. stderr is merged into stdout (`exec 2>&1`) so the log
 * interleaves as SWE-bench's test_output.txt does.
 */
import { shQuote } from '../../shell/text.js';
import { END_TEST_OUTPUT, START_TEST_OUTPUT } from '../logParsers.js';
import type { Task } from '../tasks.js';
import { TESTBED } from './types.js';

export const PATCH_FILE = '/tmp/patch.diff';
export const TEST_PATCH_FILE = '/tmp/test_patch.diff';

/** Printed by the apply step: which tool applied the patch, or that none did. */
export const APPLY_OK = '>>>>> Applied Patch';
export const APPLY_FAILED = '>>>>> Patch Apply Failed';
/** Printed when the task's own test patch does not apply (a harness error, not the model's). */
export const TEST_PATCH_FAILED = '>>>>> Test Patch Apply Failed';

/** Followed by the test command's start and end ($EPOCHREALTIME seconds). */
export const TEST_TIME_PREFIX = '>>>>> Test Command Time';

/** The test command's own wall time in ms, from the line testScript prints. */
export function parseTestTime(log: string): number | undefined {
  const m = new RegExp(`^${TEST_TIME_PREFIX} (\\d+\\.\\d+) (\\d+\\.\\d+)$`, 'm').exec(log);
  return m ? (Number(m[2]) - Number(m[1])) * 1000 : undefined;
}

/** SWE-bench's GIT_APPLY_CMDS, tried in order. */
export const APPLY_COMMANDS = [
  `git apply --verbose ${PATCH_FILE}`,
  `git apply --verbose --reject ${PATCH_FILE}`,
  `patch --batch --fuzz=5 -p1 -i ${PATCH_FILE}`,
] as const;

/**
 * Files a diff modifies that existed before it ("--- a/path"): the ones
 * `git checkout base -- files` can restore. New files (--- /dev/null) are
 * left alone, as SWE-bench does.
 */
export function modifiedFiles(diff: string): string[] {
  const files = new Set<string>();
  for (const m of diff.matchAll(/^--- a\/(.+?)\t?$/gm)) files.add(m[1]!.replace(/\t.*$/, ''));
  return [...files];
}

/** The repository's directory in the task's sandbox or container. */
function repoDirOf(task: Pick<Task, 'repo_dir'>): string {
  return shQuote(task.repo_dir ?? TESTBED);
}

/** Applies /tmp/patch.diff; prints APPLY_OK or APPLY_FAILED; exit 0 iff applied. */
export function applyScript(task: Pick<Task, 'repo_dir'> = {}): string {
  const attempts = APPLY_COMMANDS.map(
    (cmd) => `if ${cmd}; then echo ${shQuote(`${APPLY_OK} (${cmd.replace(` ${PATCH_FILE}`, '')})`)}; exit 0; fi`,
  );
  return ['exec 2>&1', `cd ${repoDirOf(task)}`, ...attempts, `echo ${shQuote(APPLY_FAILED)}`, 'exit 1', ''].join('\n');
}

/** Restores the test files, applies test_patch; exit 0 iff it applied. */
export function testPatchScript(task: Pick<Task, 'base_commit' | 'test_patch' | 'repo_dir'>): string {
  const files = modifiedFiles(task.test_patch).map(shQuote).join(' ');
  return [
    'exec 2>&1',
    'set -x',
    `cd ${repoDirOf(task)}`,
    ...(files ? [`git checkout ${task.base_commit} -- ${files}`] : []),
    `git apply --verbose ${TEST_PATCH_FILE} || { echo ${shQuote(TEST_PATCH_FAILED)}; exit 1; }`,
    '',
  ].join('\n');
}

/** Runs test_cmd between SWE-bench's markers (the trace of `:` prints them). */
export function testScript(task: Pick<Task, 'test_cmd' | 'repo_dir'>): string {
  return [
    'exec 2>&1',
    'set -uxo pipefail',
    `cd ${repoDirOf(task)}`,
    `: '${START_TEST_OUTPUT}'`,
    // bash's clock around the command alone: the benchmark subtracts it to
    // get the harness's own overhead.
    't0=$EPOCHREALTIME',
    task.test_cmd,
    'rc=$?',
    't1=$EPOCHREALTIME',
    `: '${END_TEST_OUTPUT}'`,
    `echo "${TEST_TIME_PREFIX} $t0 $t1"`,
    'exit $rc',
    '',
  ].join('\n');
}
