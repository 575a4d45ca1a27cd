/**
 * The pipeline's own small contract with whatever builds environments.
 * prepare/evaluate only need "make this task's environment ready" and "give
 * me a fresh sandbox of it"; how layers are built and stacked is the
 * provider's business (see localProvider.ts, and envLibProvider.ts for the
 * lib/env adapter).
 */
import type { Limits } from '../../sandbox/limits.js';
import type { ExecOptions, ExecResult } from '../../sandbox/sandbox.js';
import type { Task } from '../tasks.js';

/** Where the repository is inside every task sandbox (SWE-bench's path). */
export const TESTBED = '/testbed';

export interface SandboxRequest {
  /** Directory for the sandbox's private directory (default: the sandbox default). */
  stateDir?: string;
  limits?: Limits;
}

/**
 * What an evaluation needs of a sandbox: run a command, close. A Sandbox
 * fits as is; lib/env's EnvSandbox fits through a small adapter.
 */
export interface TaskSandbox {
  exec(cmd: string | string[], opts?: ExecOptions): Promise<ExecResult<string>>;
  close(): Promise<void>;
}

/** A task whose environment exists: everything an evaluation needs. */
export interface PreparedTask {
  instance_id: string;
  /** What was stacked, for reports and debugging. */
  env: PreparedEnvInfo;
  /** A fresh sandbox: repo at /testbed (cwd), venv first on PATH. The caller closes it. */
  createSandbox(request?: SandboxRequest): Promise<TaskSandbox>;
}

export interface PreparedEnvInfo {
  provider: string;
  /** Identifies the shared environment (same for tasks of one repo+version recipe). */
  envKey: string;
  venvDigest?: string;
  repoDigest?: string;
  venvPath: string;
  python: { path: string; version: string; prefix: string };
}

export type PrepareStage = 'validate' | 'python' | 'repo' | 'venv';

export type ProgressStatus = 'start' | 'built' | 'reused' | 'failed';

/** One step of preparation, for progress bars and logs. */
export interface PrepareProgress {
  stage: 'venv' | 'repo';
  status: ProgressStatus;
  /** e.g. "venv owner/repo@1.0" or "repo owner/repo@abc1234". */
  label: string;
  /** Steps finished so far and in all (venv builds + repo layers). */
  done: number;
  total: number;
  /** Why, for status 'failed'. */
  error?: string;
}

/** Result of one provider step: a layer that was built now or found in the store. */
export interface StepOutcome<T> {
  value: T;
  reused: boolean;
}

export interface EnvProvider {
  readonly name: string;
  /**
   * Builds (or finds) the shared environment of a task's recipe group. Tasks
   * with equal `envKey(task)` share one result; the pipeline calls this once
   * per key.
   */
  envKey(task: Task): string;
  prepareEnv(task: Task, opts: { signal?: AbortSignal }): Promise<StepOutcome<unknown>>;
  /** Builds (or finds) the task's own repository state at base_commit. */
  prepareRepo(task: Task, opts: { signal?: AbortSignal }): Promise<StepOutcome<unknown>>;
  /** Combines the two into a ready task. */
  finish(task: Task, env: unknown, repo: unknown): PreparedTask;
  /** Bytes of disk the provider's store uses (for the summary), if known. */
  diskUsage?(): Promise<number | undefined>;
}
