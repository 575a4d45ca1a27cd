/**
 * Typed errors of the shell session layer.
 *
 * The class names mirror `swerex.exceptions` so that an HTTP server speaking
 * the SWE-ReX protocol can forward them as
 * `{"swerexception": {message, class_path, traceback, extra_info}}` and the
 * Python client re-raises the matching class (it imports `class_path`).
 */
import { MinisandboxError } from '../errors.js';

/** Wire form of an exception in the SWE-ReX protocol (HTTP 511 body). */
export interface SwerexExceptionPayload {
  message: string;
  class_path: string;
  traceback: string;
  extra_info: Record<string, unknown>;
}

export class SwerexError extends MinisandboxError {
  static override readonly code: string = 'MSBX_SHELL';
  /** Python class the SWE-ReX client should re-raise, e.g. `swerex.exceptions.CommandTimeoutError`. */
  readonly swerexClassPath: string = 'builtins.RuntimeError';
  readonly extraInfo: Record<string, unknown>;

  constructor(message: string, extraInfo: Record<string, unknown> = {}) {
    super(message);
    this.extraInfo = extraInfo;
  }

  toSwerexException(): SwerexExceptionPayload {
    return {
      message: this.message,
      class_path: this.swerexClassPath,
      traceback: this.stack ?? '',
      extra_info: this.extraInfo,
    };
  }
}

export class SessionNotInitializedError extends SwerexError {
  static override readonly code: string = 'MSBX_SESSION_NOT_INITIALIZED';
  override readonly swerexClassPath = 'swerex.exceptions.SessionNotInitializedError';
}

/**
 * The session was closed (or its shell exited). SWE-ReX has no dedicated
 * class; a closed BashSession behaves like an uninitialised one, so the wire
 * class is SessionNotInitializedError.
 */
export class SessionClosedError extends SessionNotInitializedError {
  static override readonly code = 'MSBX_SESSION_CLOSED';
}

export class NonZeroExitCodeError extends SwerexError {
  static override readonly code = 'MSBX_NONZERO_EXIT';
  override readonly swerexClassPath = 'swerex.exceptions.NonZeroExitCodeError';
  constructor(
    message: string,
    readonly output: string,
    readonly exitCode: number,
  ) {
    super(message, { output, exit_code: exitCode });
  }
}

export class BashIncorrectSyntaxError extends SwerexError {
  static override readonly code = 'MSBX_BASH_SYNTAX';
  override readonly swerexClassPath = 'swerex.exceptions.BashIncorrectSyntaxError';
  constructor(
    message: string,
    readonly bashStdout: string,
    readonly bashStderr: string,
  ) {
    // extra_info keys are the ones SWE-ReX uses.
    super(message, { bash_stdout: bashStdout, bash_stderr: bashStderr });
  }
}

export class CommandTimeoutError extends SwerexError {
  static override readonly code = 'MSBX_COMMAND_TIMEOUT';
  override readonly swerexClassPath = 'swerex.exceptions.CommandTimeoutError';
  constructor(
    message: string,
    /** Output seen before the deadline (plus the interrupt's output when auto-interrupted). */
    readonly output: string,
    /** True when `interruptOnTimeout` already brought the shell back to its prompt. */
    readonly interrupted = false,
  ) {
    super(message, { output, interrupted });
  }
}

export class NoExitCodeError extends SwerexError {
  static override readonly code = 'MSBX_NO_EXIT_CODE';
  override readonly swerexClassPath = 'swerex.exceptions.NoExitCodeError';
  constructor(
    message: string,
    readonly output = '',
  ) {
    super(message, { output });
  }
}

export class SessionExistsError extends SwerexError {
  static override readonly code = 'MSBX_SESSION_EXISTS';
  override readonly swerexClassPath = 'swerex.exceptions.SessionExistsError';
}

export class SessionDoesNotExistError extends SwerexError {
  static override readonly code = 'MSBX_NO_SUCH_SESSION';
  override readonly swerexClassPath = 'swerex.exceptions.SessionDoesNotExistError';
}

/**
 * Neither Ctrl-C nor the Ctrl-Z + `kill -9` fallback brought the prompt back.
 * SWE-ReX lets pexpect's TIMEOUT escape in that case, hence the class path.
 */
export class InterruptFailedError extends SwerexError {
  static override readonly code = 'MSBX_INTERRUPT_FAILED';
  override readonly swerexClassPath = 'pexpect.exceptions.TIMEOUT';
  constructor(
    message: string,
    readonly output = '',
  ) {
    super(message, { output });
  }
}
