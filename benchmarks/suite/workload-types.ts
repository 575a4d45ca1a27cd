/**
 * The contract between the suite's workload builder (workload.ts: repos,
 * tasks, environments, Docker images) and its runner (the measurements,
 * report and charts). Both sides import only this file of each other.
 */
import type { Task } from '../../lib/swe/tasks.js';

export type WorkloadSize = 'quick' | 'full';

/** One environment: a repository at one version, with its venv recipe. */
export interface WorkloadEnv {
  /** Stable key, e.g. "attrs-23". */
  key: string;
  /** The repository's short name (its folder under `reposDir`). */
  repo: string;
  version: string;
  /** Base interpreter, "3.11". */
  python: string;
  /** Ids of the tasks that use this environment. */
  tasks: string[];
}

/** The Docker images of the set, built the way SWE-bench builds them. */
export interface WorkloadDockerImages {
  /** OS and Python: one image every env image is built FROM. */
  base: string;
  /** env key -> image (FROM base, adds the venv). */
  envs: Record<string, string>;
  /** instance_id -> image (FROM its env image, adds the repository at base_commit in /testbed). */
  instances: Record<string, string>;
}

export interface Workload {
  size: WorkloadSize;
  /** The builder's cache directory; everything below is inside it. */
  dir: string;
  /** SWE-bench-format tasks (JSONL), readable by `minisandbox prepare` / `eval`. */
  tasksFile: string;
  tasks: Task[];
  /** The gold patches as predictions (JSONL, SWE-bench's format). */
  goldPredictionsFile: string;
  /** Git repositories with their histories, one folder per repository. */
  reposDir: string;
  envs: WorkloadEnv[];
  /** Absent when Docker was not asked for or is not available (reason in `dockerSkipped`). */
  docker?: WorkloadDockerImages;
  dockerSkipped?: string;
  /**
   * The layer store the builder prepared the tasks in to derive their test
   * lists: every venv and repository layer is there (a warm store).
   */
  storeDir?: string;
  /** JSON: how long the builder took (repositories, venvs + derivation, each Docker image). */
  timingsFile?: string;
  /**
   * What the tasks' install commands need to build a venv cold: the local
   * package indexes served on loopback (`serve()`, on a port of the
   * caller's own, until close), `prepareTasks(..., { installNetwork,
   * installVariables })` with this installNetwork, so the build sandbox can
   * reach them, and the served index's `variables` (PIP_INDEX_URL, ...:
   * not part of the venv's key). Not needed when every venv is already in
   * the store (the recipe index reuses it without running the install).
   */
  packageIndex?: {
    installNetwork: 'host';
    serve: () => Promise<{ url: string; variables: Record<string, string>; close(): Promise<void> }>;
  };
}

export interface BuildWorkloadOptions {
  size: WorkloadSize;
  /** Default: /var/cache/minisandbox/bench-suite (root) or ~/.cache/minisandbox/bench-suite. */
  cacheDir?: string;
  /** Build (or reuse) the Docker images; needs a running engine (benchmarks/lib/docker.ts). */
  docker?: boolean;
  onProgress?: (message: string) => void;
  signal?: AbortSignal;
}
