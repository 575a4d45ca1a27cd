/**
 * Task sets in the SWE-bench instance format (JSON array or JSONL), extended
 * with what MiniSandbox needs to evaluate a task: either an environment
 * recipe (base Python version, install commands) or a container image that
 * already holds the environment, the test command, where the repository is,
 * and which isolation to run it under.
 */
import { dirname, isAbsolute, resolve } from 'node:path';
import { isLogParserName, LOG_PARSER_NAMES, type LogParserName } from './logParsers.js';
import {
  describeLocation,
  describeType,
  FieldReader,
  guessFormat,
  readTextFile,
  splitRecords,
  type RawRecord,
  type RecordFileFormat,
} from './records.js';

export { loadPredictions, parsePredictions, type Prediction, type PredictionLoadResult } from './predictions.js';
export type { RecordFileFormat } from './records.js';

/** How a task asks to be run; `eval --isolation` overrides it for a whole set. */
export type TaskIsolation = 'sandbox' | 'docker';
export const TASK_ISOLATIONS: readonly TaskIsolation[] = ['sandbox', 'docker'];

export function isTaskIsolation(value: unknown): value is TaskIsolation {
  return typeof value === 'string' && (TASK_ISOLATIONS as readonly string[]).includes(value);
}

/** Where a task's repository is inside its sandbox or container unless `repo_dir` says otherwise. */
export const DEFAULT_REPO_DIR = '/testbed';

/**
 * An image reference that names a file rather than an image: absolute, or
 * relative with ./ or ../ (a bare "name:tag" is a reference, never a path).
 */
export function isImageFile(image: string): boolean {
  return image.startsWith('/') || image.startsWith('./') || image.startsWith('../');
}

export interface Task {
  instance_id: string;
  /** "owner/name", informational (SWE-bench uses it to pick specs). */
  repo: string;
  /** Commit the evaluation starts from (the buggy state). */
  base_commit: string;
  /** Commit used to build the environment; defaults to base_commit. */
  environment_setup_commit?: string;
  version: string;
  /** Gold fix, a unified git diff. */
  patch: string;
  /** Diff adding/updating the tests that expose the bug. */
  test_patch: string;
  /** Tests that must go from failing to passing (exact test ids). */
  FAIL_TO_PASS: string[];
  /** Tests that must keep passing. */
  PASS_TO_PASS: string[];
  /**
   * Base Python version, "major.minor[.patch]", e.g. "3.11". Required
   * without `image`; with one, the image is the environment and this is
   * not used.
   */
  python?: string;
  /**
   * Shell commands run in the repo, inside the venv, to install it. A file
   * may give one string, as SWE-bench's specs write it: one command. Not
   * used with `image` (empty when the task gives none).
   */
  install: string[];
  /**
   * A container image holding the task's environment (SWE-bench's instance
   * image name, or any reference): a name in the image store or Docker, a
   * registry reference, or a `docker save` / OCI archive file (a path
   * beginning with `/`, `./` or `../`; relative to the task file).
   */
  image?: string;
  /**
   * Where the repository is inside the image (default /testbed, as in
   * SWE-bench's images). With `repo_path` / `repo_url` it is checked out
   * there at base_commit, over whatever the image holds; without, the image
   * must hold it at base_commit.
   */
  repo_dir?: string;
  /**
   * 'sandbox' (default): a MiniSandbox sandbox, of the image when the task
   * names one, else of its venv. 'docker': a Docker container of the image
   * (a task that needs a real container: a system service, a kernel feature).
   */
  isolation?: TaskIsolation;
  /** Shell command that runs the tests, e.g. "python -m pytest -rA tests". */
  test_cmd: string;
  /** Local git repository (absolute once loaded from a file). */
  repo_path?: string;
  /** Remote (or file://) git URL, used when there is no repo_path. */
  repo_url?: string;
  problem_statement?: string;
  hints_text?: string;
  created_at?: string;
  /** Log parser for test_cmd's output; auto-detected when absent. */
  log_parser?: LogParserName;
}

/** One rejected task: where it is, which instance (if known) and why. */
export interface TaskLoadError {
  instance_id?: string;
  line?: number;
  index: number;
  problems: string[];
  /** Human-readable summary naming the task and every problem. */
  message: string;
}

export interface TaskLoadResult {
  tasks: Task[];
  errors: TaskLoadError[];
}

export interface ParseTasksOptions {
  /**
   * Directory that relative `repo_path`s are relative to. loadTasks passes
   * the task file's directory so a task set can be moved as a whole.
   */
  baseDir?: string;
  /**
   * 'optional' accepts tasks without FAIL_TO_PASS / PASS_TO_PASS (absent
   * lists become []): a task set being built, whose lists `tasks derive`
   * finds. Default 'required'.
   */
  testLists?: 'required' | 'optional';
}

// SWE-bench commits are full SHA-1s; abbreviations are accepted, refs are
// not, because a branch name would make the task non-reproducible.
const COMMIT_SHA = /^[0-9a-f]{7,40}$/;
// Must be a string: as a JSON number, "3.10" would silently become 3.1.
const PYTHON_VERSION = /^\d+\.\d+(\.\d+)?$/;

/** Reads a task file; the format comes from the extension or the content. */
export function loadTasks(path: string, format?: RecordFileFormat, options: Omit<ParseTasksOptions, 'baseDir'> = {}): TaskLoadResult {
  const text = readTextFile(path, 'task');
  return parseTasks(text, format ?? guessFormat(path, text), { ...options, baseDir: dirname(resolve(path)) });
}

export function parseTasks(text: string, format: RecordFileFormat, options: ParseTasksOptions = {}): TaskLoadResult {
  const tasks: Task[] = [];
  const errors: TaskLoadError[] = [];
  const seen = new Map<string, string>();
  for (const record of splitRecords(text, format, 'tasks')) {
    const { task, problems, instanceId } = readTask(record, options);
    if (task && seen.has(task.instance_id)) {
      problems.push(`duplicate instance_id (first defined at ${seen.get(task.instance_id)})`);
    }
    if (task && problems.length === 0) {
      seen.set(task.instance_id, describeLocation(record));
      tasks.push(task);
    } else {
      errors.push(makeError(record, instanceId, problems));
    }
  }
  return { tasks, errors };
}

function makeError(record: RawRecord, instanceId: string | undefined, problems: string[]): TaskLoadError {
  const subject = instanceId ? `task "${instanceId}" (${describeLocation(record)})` : `task at ${describeLocation(record)}`;
  return {
    ...(instanceId ? { instance_id: instanceId } : {}),
    ...(record.line !== undefined ? { line: record.line } : {}),
    index: record.index,
    problems,
    message: `${subject}: ${problems.join('; ')}`,
  };
}

function readTask(
  record: RawRecord,
  options: ParseTasksOptions,
): { task?: Task; problems: string[]; instanceId?: string } {
  if (record.parseError) return { problems: [record.parseError] };
  const value = record.value;
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    return { problems: [`must be a JSON object, got ${describeType(value)}`] };
  }
  const raw = value as Record<string, unknown>;
  const fields = new FieldReader(raw);
  const instanceId = fields.string('instance_id');
  const testList = (field: 'FAIL_TO_PASS' | 'PASS_TO_PASS') =>
    options.testLists === 'optional' && !fields.has(field) ? [] : fields.stringList(field, true);
  const task: Task = {
    instance_id: instanceId,
    repo: fields.string('repo'),
    base_commit: fields.string('base_commit'),
    version: fields.string('version'),
    patch: fields.string('patch', true),
    test_patch: fields.string('test_patch', true),
    FAIL_TO_PASS: testList('FAIL_TO_PASS'),
    PASS_TO_PASS: testList('PASS_TO_PASS'),
    install: [],
    test_cmd: fields.string('test_cmd'),
  };
  // With an image, the image is the environment: the venv recipe may be
  // absent (and is not used when present).
  const hasImage = fields.has('image');
  if (!hasImage || fields.has('python')) task.python = fields.string('python');
  if (!hasImage || fields.has('install')) {
    task.install = typeof raw.install === 'string' ? [fields.string('install')] : fields.stringList('install');
  }
  const optional = ['environment_setup_commit', 'repo_path', 'repo_url', 'image', 'repo_dir', 'problem_statement', 'hints_text', 'created_at'] as const;
  for (const field of optional) {
    const text = fields.optionalString(field);
    if (text !== undefined) task[field] = text;
  }
  checkRecipe(task, raw, fields.problems, options.testLists ?? 'required');
  if (task.repo_path !== undefined && options.baseDir !== undefined && !isAbsolute(task.repo_path)) {
    task.repo_path = resolve(options.baseDir, task.repo_path);
  }
  if (task.image !== undefined && isImageFile(task.image) && options.baseDir !== undefined && !isAbsolute(task.image)) {
    task.image = resolve(options.baseDir, task.image);
  }
  return { task, problems: fields.problems, ...(instanceId ? { instanceId } : {}) };
}

/** Semantic checks beyond field types. */
function checkRecipe(task: Task, raw: Record<string, unknown>, problems: string[], testLists: 'required' | 'optional'): void {
  for (const field of ['base_commit', 'environment_setup_commit'] as const) {
    const commit = task[field];
    if (commit && !COMMIT_SHA.test(commit)) {
      problems.push(`"${field}" must be a commit SHA (7-40 lowercase hex digits), got "${commit}"`);
    }
  }
  if (task.python && !PYTHON_VERSION.test(task.python)) {
    problems.push(`"python" must be a version like "3.11", got "${task.python}"`);
  }
  if (testLists === 'required' && (Array.isArray(raw.FAIL_TO_PASS) || typeof raw.FAIL_TO_PASS === 'string')) {
    // An empty FAIL_TO_PASS would make every patch "resolve" the task.
    if (task.FAIL_TO_PASS.length === 0 && !problems.some((p) => p.includes('"FAIL_TO_PASS"'))) {
      problems.push('"FAIL_TO_PASS" must list at least one test');
    }
  }
  if (task.repo_path === undefined && task.repo_url === undefined && task.image === undefined) {
    problems.push('needs "repo_path" or "repo_url" to know where the git repository is (or an "image" that holds it)');
  }
  if (task.repo_dir !== undefined) {
    if (task.image === undefined) problems.push(`"repo_dir" needs an "image" (a venv task's repository is always at ${DEFAULT_REPO_DIR})`);
    else if (!isAbsolute(task.repo_dir) || task.repo_dir.split('/').includes('..') || task.repo_dir.replace(/\/+$/, '') === '') {
      problems.push(`"repo_dir" must be an absolute path below / without "..", got "${task.repo_dir}"`);
    }
  }
  if (raw.isolation !== undefined && raw.isolation !== null) {
    if (!isTaskIsolation(raw.isolation)) problems.push(`"isolation" must be one of ${TASK_ISOLATIONS.join(', ')}, got ${JSON.stringify(raw.isolation)}`);
    else if (raw.isolation === 'docker' && task.image === undefined) {
      problems.push('"isolation": "docker" needs an "image" to run (Docker cannot run a venv recipe)');
    } else task.isolation = raw.isolation;
  }
  if (raw.log_parser !== undefined && raw.log_parser !== null) {
    if (isLogParserName(raw.log_parser)) task.log_parser = raw.log_parser;
    else problems.push(`"log_parser" must be one of ${LOG_PARSER_NAMES.join(', ')}, got ${JSON.stringify(raw.log_parser)}`);
  }
}
