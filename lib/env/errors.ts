import { MinisandboxError } from '../errors.js';

/**
 * One error type for environment building and mounting, so callers can tell
 * "the environment could not be built or mounted" from programming errors.
 * Messages name the thing (recipe step, interpreter, env id, path) and the
 * reason.
 */
export class EnvError extends MinisandboxError {
  static override readonly code = 'MSBX_ENV';
}
