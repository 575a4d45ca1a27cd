/**
 * Errors a sandbox can raise. Each names the thing and the reason, so a
 * caller never has to decode an exit status to learn what went wrong.
 */
import { getSystemErrorMap } from 'node:util';
import { MinisandboxError } from '../errors.js';

const errnoNames = new Map<number, [string, string]>();
for (const [negErrno, entry] of getSystemErrorMap()) errnoNames.set(-negErrno, entry);

/** "ENOENT (no such file or directory)" for 2. */
export function describeErrno(errno: number): string {
  const entry = errnoNames.get(errno);
  return entry ? `${entry[0]} (${entry[1]})` : `errno ${errno}`;
}

export function errnoCode(errno: number): string {
  return errnoNames.get(errno)?.[0] ?? `E${errno}`;
}

/** A sandbox could not be made or used as asked. */
export class SandboxError extends MinisandboxError {
  static override readonly code: string = 'MSBX_SANDBOX';
}

/** Options that cannot describe a valid sandbox; nothing was started. */
export class ConfigError extends SandboxError {
  static override readonly code = 'MSBX_CONFIG';
  constructor(
    message: string,
    /** The option at fault, as a dotted path (`mounts[2].source`). */
    readonly option?: string,
  ) {
    super(message);
  }
}

/**
 * A setup step failed inside the new namespaces, before the command ran: a
 * failed system call, so `code` is its errno name ('ENOENT'), as for Node's
 * own system errors, and `errno` its number.
 */
export class SetupError extends SandboxError {
  constructor(
    message: string,
    readonly step: string,
    readonly errno: number,
    readonly detail = '',
  ) {
    super(message, { code: errnoCode(errno) });
  }
}

/** A mount of the plan failed: `MountError: bind /data -> /mnt: ENOENT`. */
export class MountError extends SetupError {}

/** The command itself could not be executed. */
export class ExecError extends SetupError {}

/**
 * The kernel refused to create the namespaces (user namespaces disabled...):
 * `code` is the errno name of the refused call where it is known.
 */
export class NamespaceError extends SandboxError {
  static override readonly code = 'MSBX_NAMESPACE';
  constructor(message: string, errnoName?: string) {
    super(message, errnoName === undefined ? {} : { code: errnoName });
  }
}

/**
 * The sandbox spawner (msbx-spawner, the process that clones sandboxes for
 * this Node process) died while it handled this request; the request may or
 * may not have started a process (one with dieWithParent died with it). The
 * next spawn starts a new spawner.
 */
export class SpawnerError extends SandboxError {
  static override readonly code = 'MSBX_SPAWNER';
}
