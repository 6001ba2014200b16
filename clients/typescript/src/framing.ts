/**
 * Varint length-delimited framing for byte streams (TCP, a QUIC stream): every protobuf
 * body is preceded by its length as a protobuf varint, as `writeDelimitedTo` does.
 *
 * WebSocket does not use this: each binary WebSocket message is one body, unprefixed.
 * A byte-stream client (Node's `net.Socket`, say) feeds whatever chunks arrive to a
 * `FrameDecoder` and takes whole bodies out.
 */

/** The protocol's default maximum body, in both directions (the prefix not counted). */
export const DEFAULT_MAX_FRAME_BYTES = 4096;

/** A u64 varint is at most 10 bytes; a longer run of continuation bits is garbage. */
const MAX_VARINT_BYTES = 10;

export type FrameErrorKind = "too-large" | "bad-length";

/** The stream cannot be framed any further; the connection should be closed. */
export class FrameError extends Error {
  override readonly name = "FrameError";

  constructor(
    readonly kind: FrameErrorKind,
    message: string,
  ) {
    super(message);
  }
}

/** `body` with its varint length in front. Throws `FrameError` past `maxFrameBytes`. */
export function encodeFrame(body: Uint8Array, maxFrameBytes = DEFAULT_MAX_FRAME_BYTES): Uint8Array {
  if (body.length > maxFrameBytes) {
    throw new FrameError("too-large", `frame body of ${body.length} bytes exceeds ${maxFrameBytes}`);
  }
  const prefix: number[] = [];
  let length = body.length;
  while (length >= 0x80) {
    prefix.push((length & 0x7f) | 0x80);
    length >>>= 7;
  }
  prefix.push(length);
  const frame = new Uint8Array(prefix.length + body.length);
  frame.set(prefix, 0);
  frame.set(body, prefix.length);
  return frame;
}

/**
 * Collects a byte stream and yields whole frame bodies. `next()` returns null while the
 * frame is incomplete (that is not an error). A length over the limit is refused as soon
 * as the prefix shows it, before its body is waited for or anything is allocated for it.
 */
export class FrameDecoder {
  #buffer = new Uint8Array(0);
  #start = 0;
  #end = 0;
  #failed: FrameError | undefined;

  constructor(readonly maxFrameBytes = DEFAULT_MAX_FRAME_BYTES) {}

  /** Appends bytes as they came off the stream. */
  push(chunk: Uint8Array): void {
    if (this.#failed !== undefined) throw this.#failed;
    const buffered = this.#end - this.#start;
    if (this.#buffer.length - this.#end < chunk.length) {
      // Compact, growing only when what is buffered plus the chunk does not fit.
      const needed = buffered + chunk.length;
      if (needed <= this.#buffer.length) {
        this.#buffer.copyWithin(0, this.#start, this.#end);
      } else {
        const grown = new Uint8Array(Math.max(needed, this.#buffer.length * 2, 64));
        grown.set(this.#buffer.subarray(this.#start, this.#end), 0);
        this.#buffer = grown;
      }
      this.#start = 0;
      this.#end = buffered;
    }
    this.#buffer.set(chunk, this.#end);
    this.#end += chunk.length;
  }

  /** The next whole body, or null until more bytes arrive. Throws `FrameError` for good. */
  next(): Uint8Array | null {
    if (this.#failed !== undefined) throw this.#failed;
    let length = 0;
    let position = this.#start;
    for (let shift = 0; ; shift += 7) {
      if (position >= this.#end) return null;
      if (position - this.#start >= MAX_VARINT_BYTES) {
        return this.#fail("bad-length", `length prefix longer than ${MAX_VARINT_BYTES} bytes`);
      }
      const byte = this.#buffer[position++] as number;
      // Multiplication, not <<: a shift past 31 bits would wrap in JavaScript.
      length += (byte & 0x7f) * 2 ** shift;
      if (length > this.maxFrameBytes) {
        return this.#fail("too-large", `frame body of at least ${length} bytes exceeds ${this.maxFrameBytes}`);
      }
      if ((byte & 0x80) === 0) break;
    }
    if (this.#end - position < length) return null;
    // A copy, so the caller may keep it while the buffer is reused.
    const body = this.#buffer.slice(position, position + length);
    this.#start = position + length;
    if (this.#start === this.#end) {
      this.#start = 0;
      this.#end = 0;
    }
    return body;
  }

  /** Bytes received but not yet returned as a body. */
  get buffered(): number {
    return this.#end - this.#start;
  }

  #fail(kind: FrameErrorKind, message: string): never {
    this.#failed = new FrameError(kind, message);
    throw this.#failed;
  }
}
