import { MinisandboxError } from '../errors.js';

/**
 * The images room's error: an image that cannot be read, imported, found or
 * run as asked. Messages name the image (file, reference or id) and the
 * reason; a refusal of the layer store or the archive checker is adopted
 * (its message kept, the original as `cause`).
 */
export class ImageError extends MinisandboxError {
  static override readonly code = 'MSBX_IMAGE';
}
