/**
 * SWE-bench-style task sets: loading, log parsing and grading (pure
 * functions), preparing environments and evaluating patches in sandboxes.
 * Importing this module does not load the native addon: the pipeline loads
 * it when it first builds or starts a sandbox, so the parsers and the grader
 * work on any machine. Interpreters are found by minisandbox/env's
 * findPython.
 */
export { SweError } from './errors.js';
export * from './tasks.js';
export * from './logParsers.js';
export * from './grading.js';
export { recordStatus } from './testStatus.js';
export * from './pipeline/index.js';
