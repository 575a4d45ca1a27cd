/**
 * A small multipart/form-data reader (RFC 7578) for /upload: the body is
 * already in memory (bounded by the upload limit), so parts are slices of
 * it, found by searching for the boundary delimiter.
 */
import { HttpError } from './http.js';

export interface FormPart {
  data: Buffer;
  filename?: string;
  contentType?: string;
}

/** The boundary of a `multipart/form-data; boundary=...` Content-Type, or a 4xx. */
export function multipartBoundary(contentType: string | undefined): string {
  const type = (contentType ?? '').split(';')[0]!.trim().toLowerCase();
  if (type !== 'multipart/form-data') {
    throw HttpError.detail(422, [
      { type: 'value_error', loc: ['body'], msg: 'Expected a multipart/form-data body', input: contentType ?? null },
    ]);
  }
  const m = /;\s*boundary=(?:"([^"]+)"|([^;\s]+))/i.exec(contentType ?? '');
  const boundary = m?.[1] ?? m?.[2];
  if (!boundary || boundary.length > 200) {
    throw HttpError.detail(422, [{ type: 'value_error', loc: ['body'], msg: 'multipart/form-data without a valid boundary', input: contentType }]);
  }
  return boundary;
}

function malformed(why: string): HttpError {
  return HttpError.detail(422, [{ type: 'value_error', loc: ['body'], msg: `malformed multipart body: ${why}`, input: null }]);
}

/** Header parameters such as `name="file"; filename="a.zip"` (quoted or not). */
function dispositionParams(value: string): Map<string, string> {
  const params = new Map<string, string>();
  const re = /;\s*([A-Za-z0-9_*-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^;]*))/g;
  for (let m = re.exec(value); m; m = re.exec(value)) {
    const raw = m[2] !== undefined ? m[2].replace(/\\(.)/g, '$1') : m[3]!.trim();
    params.set(m[1]!.toLowerCase(), raw);
  }
  return params;
}

/** Fields by name (a repeated name keeps its first part). */
export function parseMultipart(body: Buffer, boundary: string): Map<string, FormPart> {
  const fields = new Map<string, FormPart>();
  const delimiter = Buffer.from(`--${boundary}`);
  let pos = body.indexOf(delimiter);
  if (pos < 0) throw malformed('no boundary found');
  for (;;) {
    pos += delimiter.length;
    // "--" right after a delimiter closes the body.
    if (body[pos] === 0x2d && body[pos + 1] === 0x2d) break;
    if (body[pos] === 0x0d && body[pos + 1] === 0x0a) pos += 2;
    else throw malformed('delimiter not followed by CRLF');
    const headerEnd = body.indexOf('\r\n\r\n', pos);
    if (headerEnd < 0) throw malformed('part headers not terminated');
    const headers = new Map<string, string>();
    for (const line of body.subarray(pos, headerEnd).toString('utf8').split('\r\n')) {
      const colon = line.indexOf(':');
      if (colon > 0) headers.set(line.slice(0, colon).trim().toLowerCase(), line.slice(colon + 1).trim());
    }
    const dataStart = headerEnd + 4;
    const next = body.indexOf(Buffer.concat([Buffer.from('\r\n'), delimiter]), dataStart);
    if (next < 0) throw malformed('missing closing boundary');
    const params = dispositionParams(headers.get('content-disposition') ?? '');
    const name = params.get('name');
    if (name !== undefined && !fields.has(name)) {
      fields.set(name, {
        data: body.subarray(dataStart, next),
        filename: params.get('filename'),
        contentType: headers.get('content-type'),
      });
    }
    pos = next + 2; // at the delimiter
  }
  return fields;
}
