import { MinisandboxError } from '../errors.js';

/**
 * What the file utilities raise: an archive refused or failed to unpack, a
 * lock not acquired, a helper command (tar, cp, git) that failed. Messages
 * name the thing (archive and member, lock file, command line) and the
 * reason.
 */
export class FileError extends MinisandboxError {
  static override readonly code = 'MSBX_FILE';
}
