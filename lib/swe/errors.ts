import { MinisandboxError } from '../errors.js';

/**
 * What lib/swe raises for input it cannot use: a task or predictions file
 * that cannot be read or is not the JSON it must be, an unknown log parser,
 * a run report given two outcomes for one instance. Messages name the file,
 * the field or the instance, and the reason.
 */
export class SweError extends MinisandboxError {
  static override readonly code = 'MSBX_SWE';
}
