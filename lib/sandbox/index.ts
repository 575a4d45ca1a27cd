export * from './errors.js';
export type * from './options.js';
export { buildPlan, describeNativeOp, type BuiltPlan } from './plan.js';
export { spawn, SandboxProcess, type ExitInfo, type Terminal } from './process.js';
export { run, type RunResult } from './run.js';
export * as policy from './policy.js';
export { doctor, type Check } from './doctor.js';
