import { MinisandboxError } from '../errors.js';

/**
 * One error type for the layer store, so callers can tell "the layer store
 * refused or failed" apart from programming errors. Messages always name the
 * thing (archive, member, file, lock) and the reason.
 */
export class LayerError extends MinisandboxError {
  static override readonly code = 'MSBX_LAYER';
}
