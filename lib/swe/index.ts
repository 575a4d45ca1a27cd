/** SWE-bench-style task evaluation: the sandbox-independent parts. */
export * from './tasks.js';
export * from './logParsers.js';
export * from './grading.js';
export { findPython, probePython, pythonCandidates, type FindPythonOptions, type PythonInterpreter } from './python.js';
export { recordStatus } from './testStatus.js';
export * from './pipeline/index.js';
