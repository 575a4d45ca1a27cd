/**
 * Shared reading of JSON / JSONL record files (task sets, predictions).
 * A broken record must not hide the good ones, so records are handed out
 * one by one with their location, and each consumer reports its own
 * per-record problems. Only whole-file problems (unreadable file, invalid
 * JSON document) throw, because then there is nothing left to go on with.
 */
import { readFileSync } from 'node:fs';
import { extname } from 'node:path';
import { SweError } from './errors.js';

export type RecordFileFormat = 'json' | 'jsonl';

export interface RawRecord {
  /** Parsed value, or undefined when the line was not valid JSON. */
  value: unknown;
  /** 1-based line number (JSONL) - the thing a human opens the file at. */
  line?: number;
  /** 0-based position in the JSON array (or key order of a JSON object). */
  index: number;
  /** Key of the record when the JSON document is an object of records. */
  key?: string;
  /** Why the record could not be parsed at all. */
  parseError?: string;
}

/** Where a record sits, for error messages: "line 4" or "entry 2". */
export function describeLocation(record: Pick<RawRecord, 'line' | 'index' | 'key'>): string {
  if (record.line !== undefined) return `line ${record.line}`;
  if (record.key !== undefined) return `entry "${record.key}"`;
  return `entry ${record.index}`;
}

/** Format implied by a file name, falling back to sniffing the content. */
export function guessFormat(path: string, text: string): RecordFileFormat {
  const ext = extname(path).toLowerCase();
  if (ext === '.jsonl' || ext === '.ndjson') return 'jsonl';
  if (ext === '.json') return 'json';
  return stripBom(text).trimStart().startsWith('[') ? 'json' : 'jsonl';
}

function stripBom(text: string): string {
  return text.charCodeAt(0) === 0xfeff ? text.slice(1) : text;
}

export function readTextFile(path: string, what: string): string {
  try {
    return readFileSync(path, 'utf8');
  } catch (err) {
    throw new SweError(`cannot read ${what} file ${path}: ${(err as Error).message}`);
  }
}

/**
 * Splits `text` into records. `allowObject` accepts a JSON object whose
 * values are the records (SWE-bench accepts predictions in that shape).
 */
export function splitRecords(
  text: string,
  format: RecordFileFormat,
  what: string,
  allowObject = false,
): RawRecord[] {
  const body = stripBom(text);
  if (format === 'jsonl') {
    const records: RawRecord[] = [];
    body.split(/\r?\n/).forEach((lineText, i) => {
      if (lineText.trim() === '') return;
      const line = i + 1;
      try {
        records.push({ value: JSON.parse(lineText), line, index: records.length });
      } catch (err) {
        records.push({ value: undefined, line, index: records.length, parseError: `invalid JSON: ${(err as Error).message}` });
      }
    });
    return records;
  }
  let document: unknown;
  try {
    document = JSON.parse(body);
  } catch (err) {
    throw new SweError(`${what} JSON is not valid JSON: ${(err as Error).message}`);
  }
  if (Array.isArray(document)) {
    return document.map((value, index) => ({ value, index }));
  }
  if (allowObject && document !== null && typeof document === 'object') {
    return Object.entries(document).map(([key, value], index) => ({ value, index, key }));
  }
  throw new SweError(`${what} JSON must be an array of objects${allowObject ? ' or an object of objects' : ''}, got ${describeType(document)}`);
}

export function describeType(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  return typeof value === 'object' ? 'an object' : `a ${typeof value}`;
}

/** Collects the problems of one record while its fields are read. */
export class FieldReader {
  readonly problems: string[] = [];

  constructor(private readonly record: Record<string, unknown>) {}

  has(field: string): boolean {
    return this.record[field] !== undefined && this.record[field] !== null;
  }

  /** Required non-empty string (or empty when `allowEmpty`). */
  string(field: string, allowEmpty = false): string {
    const value = this.record[field];
    if (value === undefined || value === null) {
      this.problems.push(`missing field "${field}"`);
      return '';
    }
    if (typeof value !== 'string') {
      this.problems.push(`"${field}" must be a string, got ${describeType(value)}`);
      return '';
    }
    if (!allowEmpty && value.trim() === '') {
      this.problems.push(`"${field}" must not be empty`);
    }
    return value;
  }

  optionalString(field: string): string | undefined {
    return this.has(field) ? this.string(field) : undefined;
  }

  /**
   * List of strings. With `allowJsonString`, a string holding a JSON list
   * is accepted too: SWE-bench's datasets ship FAIL_TO_PASS / PASS_TO_PASS
   * that way.
   */
  stringList(field: string, allowJsonString = false): string[] {
    let value = this.record[field];
    if (value === undefined || value === null) {
      this.problems.push(`missing field "${field}"`);
      return [];
    }
    if (typeof value === 'string' && allowJsonString) {
      try {
        value = JSON.parse(value);
      } catch (err) {
        this.problems.push(`"${field}" is a string but not a JSON list: ${(err as Error).message}`);
        return [];
      }
    }
    if (!Array.isArray(value)) {
      this.problems.push(`"${field}" must be a list of strings, got ${describeType(value)}`);
      return [];
    }
    const bad = value.findIndex((item) => typeof item !== 'string');
    if (bad !== -1) {
      this.problems.push(`"${field}"[${bad}] must be a string, got ${describeType(value[bad])}`);
      return [];
    }
    return value as string[];
  }
}
