/** Declarative description of one demo repository and its task. */
export interface DemoRepoSpec {
  /** Directory name under `repos/`, also the project name. */
  name: string;
  /** "owner/name" written to the task's `repo` field. */
  repo: string;
  instanceId: string;
  version: string;
  /** Directory holding the import packages ("src" layout or the repo root). */
  sourceRoot: 'src' | '.';
  /** Top-level import packages, for the build backend. */
  packages: string[];
  problemStatement: string;
  /** Repository content at base_commit (the buggy state), path -> text. */
  baseFiles: Record<string, string>;
  /** Files rewritten by the gold fix; their diff is the task's `patch`. */
  fixFiles: Record<string, string>;
  /** Test files rewritten/added; their diff is the task's `test_patch`. */
  testFiles: Record<string, string>;
  /** Test files (relative paths) test_cmd runs. */
  testPaths: string[];
  FAIL_TO_PASS: string[];
  PASS_TO_PASS: string[];
  /** A plausible fix that repairs only part of the bug. */
  partialFix?: {
    description: string;
    files: Record<string, string>;
    /** FAIL_TO_PASS tests that still fail with the partial fix. */
    stillFailing: string[];
  };
}

/**
 * Python sources are written flush-left inside String.raw templates (so
 * regex backslashes survive); this drops the newline after the opening
 * backtick so files do not start with an empty line.
 */
export function source(text: string): string {
  return text.replace(/^\n/, '');
}
