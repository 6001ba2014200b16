import { create, fromBinary } from "@bufbuild/protobuf";
import { sizeDelimitedEncode } from "@bufbuild/protobuf/wire";
import { describe, expect, it } from "vitest";
import {
  ClientMessageSchema,
  Direction,
  encodeClientFrame,
  encodeFrame,
  FrameDecoder,
  FrameError,
  ServerMessageSchema,
  decodeServerMessage,
} from "../src/index.js";

/** A small seeded PRNG (mulberry32), so a failing round-trip can be replayed from its seed. */
function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function bytes(length: number, fill = 0xab): Uint8Array {
  return new Uint8Array(length).fill(fill);
}

function randomBytes(random: () => number, length: number): Uint8Array {
  const out = new Uint8Array(length);
  for (let i = 0; i < length; i++) out[i] = Math.floor(random() * 256);
  return out;
}

function drain(decoder: FrameDecoder): Uint8Array[] {
  const bodies: Uint8Array[] = [];
  for (let body = decoder.next(); body !== null; body = decoder.next()) bodies.push(body);
  return bodies;
}

describe("framing", () => {
  it("prefixes the length as a protobuf varint", () => {
    expect([...encodeFrame(bytes(3, 7))]).toEqual([3, 7, 7, 7]);
    expect([...encodeFrame(bytes(0))]).toEqual([0]);
    expect([...encodeFrame(bytes(300)).subarray(0, 2)]).toEqual([0xac, 0x02]);
    expect(encodeFrame(bytes(4096)).length).toBe(4098);
  });

  it("agrees with protobuf-es's own size-delimited encoding", () => {
    const message = create(ClientMessageSchema, { kind: { case: "chat", value: { text: "x".repeat(200) } } });
    const theirs = sizeDelimitedEncode(ClientMessageSchema, message);
    const ours = encodeClientFrame(message);
    expect(ours).toEqual(theirs);
    const decoder = new FrameDecoder();
    decoder.push(theirs);
    const body = decoder.next();
    expect(body).not.toBeNull();
    expect(fromBinary(ClientMessageSchema, body!).kind).toEqual(message.kind);
  });

  it("returns null for an incomplete frame and the body once it is whole, fed a byte at a time", () => {
    const frame = encodeFrame(bytes(200, 9));
    const decoder = new FrameDecoder();
    for (let i = 0; i < frame.length - 1; i++) {
      decoder.push(frame.subarray(i, i + 1));
      expect(decoder.next()).toBeNull();
    }
    decoder.push(frame.subarray(frame.length - 1));
    expect(decoder.next()).toEqual(bytes(200, 9));
    expect(decoder.next()).toBeNull();
    expect(decoder.buffered).toBe(0);
  });

  it("splits several frames that came in one chunk, including empty bodies", () => {
    const decoder = new FrameDecoder();
    const chunk = new Uint8Array([...encodeFrame(bytes(1, 1)), ...encodeFrame(bytes(0)), ...encodeFrame(bytes(130, 2))]);
    decoder.push(chunk);
    expect(drain(decoder)).toEqual([bytes(1, 1), bytes(0), bytes(130, 2)]);
  });

  it("round-trips random bodies cut into random chunks", () => {
    const seed = Number(process.env.FRAMING_SEED ?? Date.now() % 1_000_000);
    const random = prng(seed);
    for (let round = 0; round < 100; round++) {
      const bodies = Array.from({ length: 1 + Math.floor(random() * 8) }, () =>
        randomBytes(random, Math.floor(random() * 4097)),
      );
      const stream = new Uint8Array(bodies.reduce((sum, body) => sum + encodeFrame(body).length, 0));
      let offset = 0;
      for (const body of bodies) {
        const frame = encodeFrame(body);
        stream.set(frame, offset);
        offset += frame.length;
      }
      const decoder = new FrameDecoder();
      const out: Uint8Array[] = [];
      for (let at = 0; at < stream.length; ) {
        const size = 1 + Math.floor(random() * 3000);
        decoder.push(stream.subarray(at, at + size));
        at += size;
        out.push(...drain(decoder));
      }
      const replay = `seed ${seed} (replay with FRAMING_SEED=${seed}), round ${round}`;
      expect(out.length, replay).toBe(bodies.length);
      out.forEach((body, i) => expect(Buffer.from(body).equals(bodies[i]!), `${replay}, body ${i}`).toBe(true));
    }
  });

  it("allows a 4096-byte body and refuses 4097 as soon as the prefix is read", () => {
    const decoder = new FrameDecoder();
    decoder.push(encodeFrame(bytes(4096)));
    expect(decoder.next()?.length).toBe(4096);

    const refusing = new FrameDecoder();
    // Only the two prefix bytes of a 4097-byte frame: no body has arrived.
    refusing.push(new Uint8Array([0x81, 0x20]));
    expect(() => refusing.next()).toThrow(FrameError);
    // And it stays refused.
    expect(() => refusing.push(bytes(1))).toThrow(/exceeds 4096/);
  });

  it("refuses a huge length from its first prefix bytes, before the varint even ends", () => {
    const decoder = new FrameDecoder();
    decoder.push(new Uint8Array([0xff, 0xff, 0xff]));
    try {
      decoder.next();
      expect.fail("a 2 MiB length prefix was not refused");
    } catch (error) {
      expect(error).toBeInstanceOf(FrameError);
      expect((error as FrameError).kind).toBe("too-large");
    }
  });

  it("refuses a varint longer than 10 bytes", () => {
    const decoder = new FrameDecoder();
    // Continuation bits with zero payload never grow the length: only the byte count can stop it.
    decoder.push(new Uint8Array(11).fill(0x80));
    expect(() => decoder.next()).toThrow(expect.objectContaining({ kind: "bad-length" }));
  });

  it("takes a non-minimal varint (a valid protobuf encoding)", () => {
    const decoder = new FrameDecoder();
    decoder.push(new Uint8Array([0x82, 0x00, 5, 6]));
    expect(decoder.next()).toEqual(new Uint8Array([5, 6]));
  });

  it("honours a configured limit both ways", () => {
    expect(() => encodeFrame(bytes(11), 10)).toThrow(FrameError);
    const decoder = new FrameDecoder(10);
    decoder.push(encodeFrame(bytes(11)));
    expect(() => decoder.next()).toThrow(FrameError);
  });

  it("encodes client messages with the proto's field numbers", () => {
    const frame = encodeClientFrame({ kind: { case: "move", value: { direction: Direction.LEFT, clientTime: 5n } } });
    // len 6 | field 2 (move), wire type 2, len 4 | field 1 varint 3 (LEFT) | field 2 varint 5
    expect([...frame]).toEqual([6, 0x12, 4, 0x08, 3, 0x10, 5]);
  });

  it("decodes server messages and throws on garbage (the connection reports it)", () => {
    const good = decodeServerMessage(new Uint8Array([0x22, 0x02, 0x08, 0x2a]));
    expect(good.kind.case).toBe("left");
    expect(good.kind.case === "left" && good.kind.value.playerId).toBe(42n);
    // login_ok announcing 5 bytes of which 1 came.
    expect(() => decodeServerMessage(new Uint8Array([0x0a, 0x05, 1]))).toThrow();
    // A varint that never ends.
    expect(() => decodeServerMessage(new Uint8Array(12).fill(0xff))).toThrow();
    expect(ServerMessageSchema.typeName).toBe("meridian.client.v1.ServerMessage");
  });
});
