/**
 * What prepare hands to evaluate: a task whose environment exists, and a
 * way to get a fresh sandbox of it. Types only: this module loads nothing.
 */
import type { Limits } from '../../sandbox/limits.js';
import type { ExecOptions, ExecResult } from '../../sandbox/sandbox.js';

/** Where the repository is inside every task sandbox (SWE-bench's path). */
export const TESTBED = '/testbed';

export interface SandboxRequest {
  /** Directory for the sandbox's private directory (default: the sandbox default). */
  stateDir?: string;
  limits?: Limits;
}

/** What an evaluation needs of a sandbox: run a command, close. */
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
  /** The lib/env env (loadEnv) the task's venv belongs to. */
  envId: string;
  /** Identifies the shared environment (same for tasks of one repo+version recipe). */
  envKey: string;
  venvDigest: string;
  repoDigest: string;
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

/** Result of one preparation step: a layer that was built now or found in the store. */
export interface StepOutcome<T> {
  value: T;
  reused: boolean;
}
