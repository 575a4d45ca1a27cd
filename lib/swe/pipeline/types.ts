/**
 * What prepare hands to evaluate: a task whose environment exists, and a
 * way to get a fresh sandbox of it. Types only: this module loads nothing.
 */
import type { Limits } from '../../sandbox/limits.js';
import type { ExecOptions, ExecResult } from '../../sandbox/sandbox.js';
import { DEFAULT_REPO_DIR } from '../tasks.js';

/** Where the repository is inside every venv task's sandbox (SWE-bench's path). */
export const TESTBED = DEFAULT_REPO_DIR;

/**
 * What an instance actually ran in, as reports say it:
 * - 'sandbox-venv': a sandbox of the host's /usr with the task's venv and repo layers;
 * - 'sandbox-image': a sandbox whose root is the task's image (its tests, git, patch);
 * - 'docker': a Docker container of the task's image.
 */
export type IsolationKind = 'sandbox-venv' | 'sandbox-image' | 'docker';

export interface SandboxRequest {
  /** Directory for the sandbox's private directory (default: the sandbox default). */
  stateDir?: string;
  limits?: Limits;
}

/** What an evaluation reads of a command's result (a sandbox's exec, or a `docker exec`). */
export type TaskExecResult = Pick<ExecResult<string>, 'stdout' | 'stderr' | 'exitCode' | 'timedOut' | 'durationMs'>;

/** What an evaluation needs of a sandbox or container: run a command, close. */
export interface TaskSandbox {
  exec(cmd: string | string[], opts?: Pick<ExecOptions, 'input' | 'timeout' | 'signal'>): Promise<TaskExecResult>;
  close(): Promise<void>;
}

/** A task whose environment exists: everything an evaluation needs. */
export interface PreparedTask {
  instance_id: string;
  /** What the evaluations of this task run in. */
  isolation: IsolationKind;
  /** Where the repository is inside (the eval script's working tree). */
  repoDir: string;
  /** The venv and repo layers stacked ('sandbox-venv' only), for reports and debugging. */
  env?: PreparedEnvInfo;
  /** The image ('sandbox-image' and 'docker'). */
  image?: PreparedImageInfo;
  /**
   * A fresh sandbox (or container): the repo at `repoDir`, the environment
   * active (venv first on PATH, or the image's). The caller closes it.
   */
  createSandbox(request?: SandboxRequest): Promise<TaskSandbox>;
}

export interface PreparedImageInfo {
  /** The task's `image` as written (a file made absolute). */
  ref: string;
  /** The image's id where it runs: the store's config digest, or Docker's image id. */
  id: string;
  /** The repository layer checked out at repoDir (absent: the image holds the repo). */
  repoDigest?: string;
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

export type PrepareStage = 'validate' | 'python' | 'repo' | 'venv' | 'image';

export type ProgressStatus = 'start' | 'built' | 'reused' | 'failed';

/** One step of preparation, for progress bars and logs. */
export interface PrepareProgress {
  stage: 'venv' | 'repo' | 'image';
  status: ProgressStatus;
  /** e.g. "venv owner/repo@1.0", "repo owner/repo@abc1234" or "image sweb.eval.x86_64.x:latest (docker)". */
  label: string;
  /** Steps finished so far and in all (venv builds + repo layers + images). */
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
