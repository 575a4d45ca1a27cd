/** Preparing task environments and evaluating patches in sandboxes. */
export { TESTBED, type IsolationKind, type PreparedImageInfo, type TaskExecResult, type PreparedTask, type PreparedEnvInfo, type PrepareProgress, type SandboxRequest, type StepOutcome, type TaskSandbox } from './types.js';
export { TaskEnvs, type TaskEnvOptions } from './taskEnvs.js';
export { dockerUnavailable, liveDockerContainers } from './docker.js';
export { prepareTasks, checkTaskForPrepare, isolationOf, type PrepareOptions, type PrepareResult, type PrepareFailure, type PrepareSummary } from './prepare.js';
export { evaluate, runTaskTests, type EvaluateOptions, type EvalResult, type EvalTimings, type TestRun } from './evaluate.js';
export { APPLY_COMMANDS, modifiedFiles, applyScript, testPatchScript, testScript } from './evalScript.js';
export { evaluateAll, buildRunReport, summarizeTimings, overheadOf, type EvaluateAllOptions, type EvaluateAllResult, type EvalRunReport, type TimingSummary } from './runReport.js';
export { createProgress, type ProgressLine } from './progress.js';
