/**
 * `@meridian/client`: the TypeScript SDK for Meridian's public client protocol.
 *
 * Everything is exported from here, so that a bundler (esbuild for the gateway's `/play`
 * page) can take this one entry point. The SDK uses no Node API: in a browser it needs
 * nothing but the page's WebSocket.
 */
export * from "./gen/client_pb.js";
export { AnswerBook, type RequestKind, type AnswerOutcome } from "./answers.js";
export {
  Connection,
  type ActionOptions,
  type CloseReason,
  type ConnectionEvents,
  type ConnectionOptions,
  type ConnectionState,
  type DirectionName,
  type LoginInfo,
  type LoginOptions,
} from "./connection.js";
export { Emitter, type Listener } from "./emitter.js";
export { MeridianError, type ProtocolViolation } from "./errors.js";
export { DEFAULT_MAX_FRAME_BYTES, encodeFrame, FrameDecoder, FrameError, type FrameErrorKind } from "./framing.js";
export {
  decodeServerMessage,
  encodeClientFrame,
  encodeClientMessage,
  toPoint,
  type ClientMessageInit,
  type Point,
} from "./messages.js";
export { globalWebSocket, type WebSocketConstructor, type WebSocketLike } from "./transport.js";
export { PLAYER_KIND, View, type Entity, type ViewEvents, type WorldInfo } from "./view.js";
