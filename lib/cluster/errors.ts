import { MinisandboxError } from '../errors.js';

/**
 * What lib/cluster raises: a queue URL or Redis credentials it cannot use,
 * a Redis it cannot reach or that refused it, a job payload a worker will
 * not run, a queue run that cannot finish. Messages name the URL (never its
 * password), the job or the instance, and the reason.
 */
export class ClusterError extends MinisandboxError {
  static override readonly code = 'MSBX_CLUSTER';
}
