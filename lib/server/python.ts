/**
 * Python-side details the SWE-ReX client sees: exceptions named by their
 * Python class path (the client re-raises `class_path`), `repr()` of strings
 * in messages, float formatting, and `bytes.decode(encoding, errors)`.
 */
import { SwerexError } from '../shell/errors.js';

/** An exception the Python server would raise from the standard library (FileNotFoundError...). */
export class PythonError extends SwerexError {
  static override readonly code = 'MSBX_PYTHON';
  override readonly swerexClassPath: string;
  constructor(classPath: string, message: string, extraInfo: Record<string, unknown> = {}) {
    super(message, extraInfo);
    this.swerexClassPath = classPath;
  }
}

/** OSError subclasses by the errno text tools print, with their numbers. */
const OS_ERRORS: Array<[RegExp, string, number, string]> = [
  [/no such file or directory/i, 'builtins.FileNotFoundError', 2, 'No such file or directory'],
  [/is a directory/i, 'builtins.IsADirectoryError', 21, 'Is a directory'],
  [/not a directory/i, 'builtins.NotADirectoryError', 20, 'Not a directory'],
  [/permission denied/i, 'builtins.PermissionError', 13, 'Permission denied'],
  [/read-only file system/i, 'builtins.OSError', 30, 'Read-only file system'],
  [/no space left on device/i, 'builtins.OSError', 28, 'No space left on device'],
  [/file exists/i, 'builtins.FileExistsError', 17, 'File exists'],
];

/** `[Errno 2] No such file or directory: '/x'` from a tool's stderr. */
export function osErrorFrom(stderr: string, path: string): PythonError {
  for (const [re, cls, errno, text] of OS_ERRORS) {
    if (re.test(stderr)) return new PythonError(cls, `[Errno ${errno}] ${text}: ${pyRepr(path)}`, { stderr });
  }
  return new PythonError('builtins.OSError', `${stderr.trim() || 'I/O error'}: ${pyRepr(path)}`, { stderr });
}

/** Python's repr() of a str or a list of str. */
export function pyRepr(v: string | string[]): string {
  if (Array.isArray(v)) return `[${v.map(pyRepr).join(', ')}]`;
  const quote = v.includes("'") && !v.includes('"') ? '"' : "'";
  let out = quote;
  for (const ch of v) {
    const c = ch.codePointAt(0)!;
    if (ch === '\\') out += '\\\\';
    else if (ch === quote) out += '\\' + quote;
    else if (ch === '\n') out += '\\n';
    else if (ch === '\r') out += '\\r';
    else if (ch === '\t') out += '\\t';
    else if (c < 0x20 || c === 0x7f) out += '\\x' + c.toString(16).padStart(2, '0');
    else out += ch;
  }
  return out + quote;
}

/** str(float) in Python: 1 -> "1.0". */
export function pyFloat(n: number | null): string {
  if (n === null) return 'None';
  return Number.isInteger(n) ? n.toFixed(1) : String(n);
}

// ---------------------------------------------------------------- decoding

const ERROR_HANDLERS = new Set(['strict', 'replace', 'ignore', 'backslashreplace', 'surrogateescape']);

function normalizeEncoding(encoding: string | null): string {
  return (encoding ?? 'utf-8').trim().toLowerCase().replace(/_/g, '-');
}

/** Length of the valid UTF-8 sequence starting at `i`, or 0. */
function utf8SequenceLength(b: Buffer, i: number): number {
  const c = b[i]!;
  if (c < 0x80) return 1;
  let n: number;
  let min: number;
  if (c >= 0xc2 && c <= 0xdf) [n, min] = [2, 0x80];
  else if (c >= 0xe0 && c <= 0xef) [n, min] = [3, 0x800];
  else if (c >= 0xf0 && c <= 0xf4) [n, min] = [4, 0x10000];
  else return 0;
  if (i + n > b.length) return 0;
  let cp = c & (0xff >> (n + 1));
  for (let k = 1; k < n; k++) {
    const cc = b[i + k]!;
    if ((cc & 0xc0) !== 0x80) return 0;
    cp = (cp << 6) | (cc & 0x3f);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return n;
}

function undecodable(encoding: string, byte: number, pos: number, reason: string): PythonError {
  return new PythonError(
    'builtins.UnicodeDecodeError',
    `'${encoding}' codec can't decode byte 0x${byte.toString(16).padStart(2, '0')} in position ${pos}: ${reason}`,
  );
}

/** One undecodable byte under a Python error handler. */
function handleBadByte(errors: string, byte: number): string {
  switch (errors) {
    case 'replace':
      return '\ufffd';
    case 'ignore':
      return '';
    case 'surrogateescape':
      return String.fromCharCode(0xdc00 + byte);
    default: // backslashreplace
      return `\\x${byte.toString(16).padStart(2, '0')}`;
  }
}

/**
 * `data.decode(encoding, errors)` for the encodings agents use: UTF-8,
 * ASCII and Latin-1 with every common error handler, anything else the
 * WHATWG decoder knows with 'strict' or 'replace'. `errors` null means
 * 'strict', as in Python.
 */
export function pyDecode(data: Buffer, encoding: string | null, errorsArg: string | null): string {
  const errors = errorsArg ?? 'strict';
  if (!ERROR_HANDLERS.has(errors)) throw new PythonError('builtins.LookupError', `unknown error handler name ${pyRepr(errors)}`);
  const enc = normalizeEncoding(encoding);
  if (enc === 'utf-8' || enc === 'utf8') return decodeUtf8(data, errors);
  if (enc === 'latin-1' || enc === 'latin1' || enc === 'iso-8859-1' || enc === 'iso8859-1') return data.toString('latin1');
  if (enc === 'ascii' || enc === 'us-ascii') {
    let out = '';
    data.forEach((b, i) => {
      if (b < 0x80) out += String.fromCharCode(b);
      else if (errors === 'strict') throw undecodable('ascii', b, i, 'ordinal not in range(128)');
      else out += handleBadByte(errors, b);
    });
    return out;
  }
  let decoder: InstanceType<typeof TextDecoder>;
  try {
    decoder = new TextDecoder(enc, { fatal: errors === 'strict' });
  } catch {
    throw new PythonError('builtins.LookupError', `unknown encoding: ${encoding}`);
  }
  try {
    return decoder.decode(data);
  } catch {
    throw new PythonError('builtins.UnicodeDecodeError', `'${enc}' codec can't decode the data`);
  }
}

function decodeUtf8(data: Buffer, errors: string): string {
  try {
    return new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(data);
  } catch {
    // Fall through to the byte-by-byte path, which knows where it failed.
  }
  let out = '';
  let start = 0;
  for (let i = 0; i < data.length; ) {
    const n = utf8SequenceLength(data, i);
    if (n > 0) {
      i += n;
      continue;
    }
    const byte = data[i]!;
    if (errors === 'strict') {
      const lead = byte >= 0xc2 && byte <= 0xf4;
      const reason = !lead ? 'invalid start byte' : i + 1 >= data.length ? 'unexpected end of data' : 'invalid continuation byte';
      throw undecodable('utf-8', byte, i, reason);
    }
    out += data.subarray(start, i).toString('utf8') + handleBadByte(errors, byte);
    i += 1;
    start = i;
  }
  return out + data.subarray(start).toString('utf8');
}
