/**
 * Encoding and decoding of whole protocol messages, for WebSocket (one unprefixed body per
 * binary message) and for byte streams (with `framing.ts`).
 */
import { create, fromBinary, toBinary, type MessageInitShape } from "@bufbuild/protobuf";
import {
  ClientMessageSchema,
  ServerMessageSchema,
  type ClientMessage,
  type Position,
  type ServerMessage,
} from "./gen/client_pb.js";
import { DEFAULT_MAX_FRAME_BYTES, encodeFrame } from "./framing.js";

/** A square of the map. Coordinates are u32 on the wire, plain numbers here. */
export interface Point {
  readonly x: number;
  readonly y: number;
}

/** A `ClientMessage` as plain data: `{ kind: { case: "move", value: { direction, clientTime } } }`. */
export type ClientMessageInit = MessageInitShape<typeof ClientMessageSchema>;

export function encodeClientMessage(message: ClientMessageInit | ClientMessage): Uint8Array {
  return toBinary(ClientMessageSchema, create(ClientMessageSchema, message));
}

/** `encodeClientMessage` with a varint length prefix, for byte streams. */
export function encodeClientFrame(
  message: ClientMessageInit | ClientMessage,
  maxFrameBytes = DEFAULT_MAX_FRAME_BYTES,
): Uint8Array {
  return encodeFrame(encodeClientMessage(message), maxFrameBytes);
}

/** Decodes one `ServerMessage` body. Throws on bytes that are not one. */
export function decodeServerMessage(body: Uint8Array): ServerMessage {
  return fromBinary(ServerMessageSchema, body);
}

/** A proto `Position` (absent when the server left it out) as a `Point`. */
export function toPoint(position: Position | undefined): Point {
  return { x: position?.x ?? 0, y: position?.y ?? 0 };
}
