/** Preparing task environments and evaluating patches in sandboxes. */
export { TESTBED, type EnvProvider, type PreparedTask, type PreparedEnvInfo, type PrepareProgress, type SandboxRequest, type StepOutcome } from './types.js';
export { LocalEnvProvider, EnvBuildError, EVAL_CAPABILITIES, type LocalProviderOptions } from './localProvider.js';
export { resolveBasePython, type BasePython } from './basePython.js';
export { prepareTasks, checkTaskForPrepare, type PrepareOptions, type PrepareResult, type PrepareFailure, type PrepareSummary } from './prepare.js';
export { evaluate, type EvaluateOptions, type EvalResult, type EvalTimings } from './evaluate.js';
export { listRefs, type LayerRef, type RefKind } from './refs.js';
export { APPLY_COMMANDS, modifiedFiles, applyScript, testPatchScript, testScript } from './evalScript.js';
export { evaluateAll, summarizeTimings, overheadOf, type EvaluateAllOptions, type EvaluateAllResult, type EvalRunReport, type TimingSummary } from './runReport.js';
export { createProgress, type ProgressLine } from './progress.js';
